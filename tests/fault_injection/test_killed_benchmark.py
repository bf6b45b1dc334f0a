"""A benchmark killed (SIGKILL) at random points and resumed ends with the records of an uninterrupted run."""

from __future__ import annotations

import pytest

import faults


@pytest.mark.slow
def test_a_benchmark_killed_20_times_resumes_to_the_uninterrupted_records(tmp_path, tiny_bert_dir):
    report = faults.kill_benchmark(tmp_path / "kills", tiny_bert_dir, n_kills=20, seed=0)
    assert report.kills >= 20 and report.runs >= 5
    assert not report.mismatches, report.mismatches
    assert len(report.trials) == report.kills and all(trial.outcome == "identical" for trial in report.trials), report.trials
    # The kills fell at different points of the grid, not all before the first run finished.
    assert len(set(report.finished_at_kill)) >= 2, report.finished_at_kill
