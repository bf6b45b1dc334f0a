import numpy as np
import pytest

from embedtune.bench.aggregate import equal_weight_average, mean_std
from embedtune.workflows.significance import paired_test


def test_mean_and_sample_std():
    mean, std = mean_std([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6)
    assert std == pytest.approx(0.1)  # sample std (n-1), not population (0.0816)
    assert mean_std([0.3]) == (0.3, 0.0)


def test_equal_weight_average_ignores_community_size():
    assert equal_weight_average({"android": 0.2, "gis": 0.6}) == pytest.approx(0.4)


@pytest.mark.parametrize("shift", [0.05, 0.012])
def test_paired_test_against_scipy(rng, shift):
    scipy_stats = pytest.importorskip("scipy.stats")
    a = rng.uniform(size=80)
    b = a - shift + rng.normal(scale=0.1, size=80)
    ours = paired_test(a, b, n_resamples=10_000, seed=1)
    reference = scipy_stats.permutation_test(
        (a - b,), lambda d, axis: np.mean(d, axis=axis), permutation_type="samples", n_resamples=10_000, random_state=1
    )
    assert ours.p_value == pytest.approx(reference.pvalue, abs=0.015)
    boot = scipy_stats.bootstrap((a - b,), np.mean, n_resamples=10_000, method="percentile", random_state=1)
    assert ours.ci_low == pytest.approx(boot.confidence_interval.low, abs=0.01)
    assert ours.ci_high == pytest.approx(boot.confidence_interval.high, abs=0.01)
    assert ours.mean_difference == pytest.approx(np.mean(a - b))


def test_paired_test_no_difference_is_not_significant(rng):
    a = rng.uniform(size=50)
    result = paired_test(a, a.copy(), n_resamples=2000)
    assert result.p_value == 1.0 and result.ci_low == 0.0 == result.ci_high


def test_paired_test_shape_error():
    with pytest.raises(ValueError, match="equal length"):
        paired_test(np.zeros(3), np.zeros(4))
