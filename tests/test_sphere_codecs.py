"""The -sphere codec families: a cosine model's documents ranked by the direction of their decoded vectors."""

from __future__ import annotations

import numpy as np
import pytest

from plan_checks import assert_served_as_scored, record_builds
from test_plan_codecs import QUICK, _experiment, toy  # noqa: F401  (toy: the unit-vector corpus fixture)
from embedtune.index.codecs import Precision, QuantizedIndex, codec_family
from embedtune.index.codecs.sphere import SPHERE_CANDIDATES, common_norm, shares_one_norm
from embedtune.index.codecs.textbook import RotatedCodeIndex
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.plan import codec_precisions, run_plan

D = 32


def _unit_corpus(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows with a decaying spectrum and a common direction (as a cosine model's embeddings), and unit queries near some."""
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((n, D)) * np.geomspace(1.0, 0.05, D) + 0.3
    queries = docs[:40] + 0.3 * rng.standard_normal((40, D)) * np.geomspace(1.0, 0.05, D)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return docs.astype(np.float32), queries.astype(np.float32)


def _direction_top_k(queries: np.ndarray, decoded: np.ndarray, k: int) -> np.ndarray:
    scores = (queries.astype(np.float64) @ decoded.T.astype(np.float64)) / np.linalg.norm(decoded.astype(np.float64), axis=1)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("family", ["klt-pq4-sphere", "klt-apq-sphere", "klt-sq-sphere", "klt-tcq-sphere"])
def test_a_sphere_family_codes_as_its_plain_family_and_ranks_by_the_decoded_direction(family):
    train, queries = _unit_corpus(3000)
    docs = train[: SPHERE_CANDIDATES - 20]  # fewer documents than candidates: the rescoring sees them all
    sphere = QuantizedIndex.build(docs, Precision(f"{family}:8"), train=train)
    plain = QuantizedIndex.build(docs, Precision(f"{family.removesuffix('-sphere')}:8"), train=train)
    assert sphere.ram_bytes() == plain.ram_bytes() == 8
    codes = sphere.backend.sa_encode(docs)
    assert np.array_equal(codes, plain.backend.sa_encode(docs))  # the same codes: only the scores differ
    plain_decoded = plain.reconstruct(docs)
    _, rows = sphere.search(queries, 10)
    assert np.array_equal(rows, _direction_top_k(queries, plain_decoded, 10))
    # What it reports as decoded (for the distortion report) is that direction, at the rows' norm.
    decoded = sphere.reconstruct(docs)
    np.testing.assert_allclose(np.linalg.norm(decoded, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(decoded, plain_decoded / np.linalg.norm(plain_decoded, axis=1, keepdims=True), atol=1e-5)


def test_the_direction_ranks_a_cosine_corpus_better_than_the_plain_score():
    """At 4 bytes for 32 unit dims, the plain decode shrinks documents unevenly; their directions keep more of the exact top-10."""
    docs, queries = _unit_corpus(3000, seed=1)
    exact = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :10]

    def recall(name: str) -> float:
        _, rows = QuantizedIndex.build(docs, Precision(name)).search(queries, 10)
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows.tolist(), exact.tolist())]))

    for family in ("klt-sq", "klt-pq4"):
        plain, sphere = recall(f"{family}:4"), recall(f"{family}-sphere:4")
        assert sphere > plain + 0.03, f"{family}: recall@10 {plain:.3f} plain, {sphere:.3f} on the sphere"


def test_a_sphere_index_saves_and_loads_its_radius(tmp_path):
    docs, queries = _unit_corpus(500)
    index = QuantizedIndex.build(2 * docs, Precision("klt-sq-sphere:8")).backend  # rows of norm 2: the sphere of radius 2
    assert isinstance(index, RotatedCodeIndex) and index.radius == pytest.approx(2.0, rel=1e-6)
    np.testing.assert_allclose(np.linalg.norm(index.sa_decode(index.codes), axis=1), 2.0, rtol=1e-5)
    index.clone_empty().save(tmp_path)
    loaded = type(index).load(tmp_path)
    assert loaded.radius == index.radius
    loaded.add(2 * docs)
    assert np.array_equal(loaded.search(queries, 10)[1], index.search(queries, 10)[1])


def test_rows_of_several_norms_are_refused_with_the_plain_family_named():
    docs, _ = _unit_corpus(500)
    scaled = docs * np.linspace(0.5, 1.5, len(docs))[:, None].astype(np.float32)
    assert shares_one_norm(docs) and not shares_one_norm(scaled)
    for family in ("klt-pq4-sphere", "klt-apq-sphere", "klt-sq-sphere", "klt-tcq-sphere"):
        with pytest.raises(ValueError, match=rf"norms range from 0\.5 to 1\.5.*use '{family.removesuffix('-sphere')}:8'"):
            QuantizedIndex.build(scaled, Precision(f"{family}:8"))
    with pytest.raises(ValueError, match="NaN or inf"):
        common_norm("klt-sq-sphere:8", np.where(np.arange(D) == 3, np.nan, docs))


def test_a_plan_scores_a_sphere_family_only_where_the_documents_share_a_norm():
    assert codec_precisions(["klt-pq4", "klt-pq4-sphere"], (8,), D) == ["klt-pq4:8", "klt-pq4-sphere:8"]
    assert codec_precisions(["klt-pq4", "klt-pq4-sphere"], (8,), D, one_norm=False) == ["klt-pq4:8"]
    assert codec_family("klt-apq-sphere:8").sphere_candidates == SPHERE_CANDIDATES


def test_a_plan_with_a_sphere_codec_serves_it_as_scored(toy, tmp_path, monkeypatch):  # noqa: F811
    """Unit vectors, 4 B a vector, `--codecs klt-pq4-sphere`: the codec is chosen and `index build --plan` ranks as scored."""
    built = record_builds(monkeypatch)
    experiment = _experiment(toy)
    out = tmp_path / "plan"
    plan = run_plan(experiment, out, budget_bytes=4, precisions=["float32", "float16", "int8"], work=tmp_path / "work",
                    **{**QUICK, "codecs": ("klt-pq4-sphere",)})
    assert plan["chosen"]["precision"] == "klt-pq4-sphere:4"
    scored = {row["setting"] for row in plan["sweep"]}
    # A normalised truncation's rows share a norm, so the sphere family is scored there too.
    assert {"frozen-32/klt-pq4-sphere:4", "truncate-16/klt-pq4-sphere:4"} <= scored
    assert_served_as_scored(experiment, plan, out, built, toy[1]["doc"][0], toy[1]["doc"][1], tmp_path / "index")



def test_a_plan_on_vectors_of_many_norms_leaves_the_sphere_families_out_of_the_raw_space(toy, tmp_path):  # noqa: F811
    """A dot-product model's vectors: no sphere family on them (and no error); a compressor's output is unit rows, so there."""
    root, paths = toy
    docs = np.load(paths["doc"][0])
    np.save(tmp_path / "scaled.npy", (docs * np.linspace(0.5, 1.5, len(docs))[:, None]).astype(np.float32))
    experiment = load_experiment(root, doc_embeddings=tmp_path / "scaled.npy", doc_ids=paths["doc"][1],
                                 query_embeddings=paths["query"][0], query_ids=paths["query"][1], encoder_options={"normalize": False})
    assert experiment.similarity == "dot"  # the raw inner product: the vectors keep their norms
    plan = run_plan(experiment, tmp_path / "plan", budget_bytes=8, precisions=["float32", "int8"], work=tmp_path / "work",
                    **{**QUICK, "codecs": ("klt-pq4", "klt-pq4-sphere")})
    scored = {row["setting"] for row in plan["sweep"]}
    assert "frozen-32/klt-pq4:8" in scored and not any(s.startswith("frozen") and "sphere" in s for s in scored)
    assert "truncate-16/klt-pq4-sphere:8" in scored
