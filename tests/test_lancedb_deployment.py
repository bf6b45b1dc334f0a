"""The plan's LanceDB recipe, loaded into an embedded LanceDB, finds the top-10 that ``index build --plan`` finds.

On a slice of the bundled SciFact MiniLM vectors (400 documents, 25 queries; nothing downloaded):
a PCA-64 plan at each precision whose recipe says ``exact`` is loaded into LanceDB by
:func:`load_plan_into_lancedb` and searched by :func:`search_lancedb`; the ids of the top 10 equal
the planned FAISS index's, with Hamming ties at the cut compared as sets of equal distance.
"""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import pytest

from embedtune.compress import make_compressor
from embedtune.index import load_index
from embedtune.index.codecs import PRECISIONS, Precision, QuantizedIndex
from embedtune.index.deployment import deployment_recipe, lancedb_recipe
from embedtune.index.plan_format import write_plan
from embedtune.index.planned import build_planned_index

lancedb = pytest.importorskip("lancedb")

from embedtune.index.lancedb_store import lancedb_recipe_of, load_plan_into_lancedb, search_lancedb  # noqa: E402

N_DOCS, N_QUERIES, K = 400, 25, 10


@pytest.fixture(scope="module")
def scifact_slice(tmp_path_factory):
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"][:N_DOCS], dtype=np.float32)
    queries = np.ascontiguousarray(bundled["query"][:N_QUERIES], dtype=np.float32)
    ids = [str(i) for i in bundled["document_ids"][:N_DOCS]]
    root = tmp_path_factory.mktemp("slice")
    np.save(root / "docs.npy", docs)
    (root / "docs.txt").write_text("".join(i + "\n" for i in ids))
    return root, docs, queries, ids, make_compressor("pca", dim=64).fit_unsupervised(docs)


@pytest.mark.parametrize("precision", ["float32", "binary", "binary-asym", "binary-rescore"])
def test_lancedb_top10_equals_index_build_plan(tmp_path, scifact_slice, precision):
    root, docs, queries, ids, compressor = scifact_slice
    plan = tmp_path / "plan"
    write_plan(plan, compressor, Precision(precision), docs, {"chosen": {"setting": f"pca-64/{precision}"},
                                                               "deployment": deployment_recipe(Precision(precision), 64)})
    recipe = lancedb_recipe_of(plan)
    assert recipe["exact"] and recipe == json.loads(json.dumps(lancedb_recipe(Precision(precision), 64)))
    index = load_index(build_planned_index(root / "docs.npy", tmp_path / "index", plan, ids=root / "docs.txt"))
    xq = compressor.transform(queries)
    D_faiss, I_faiss = index.search(xq, K)
    table = load_plan_into_lancedb(plan, docs, ids, tmp_path / "lancedb")
    D_lance, I_lance = search_lancedb(table, recipe, xq, K)
    if precision == "binary":  # Hamming distances tie often: the same distances, and the same ids above the cut's distance
        np.testing.assert_array_equal(D_lance, D_faiss)
        for q in range(len(xq)):
            above = D_faiss[q] > D_faiss[q, -1]
            assert set(I_lance[q][above]) == set(I_faiss[q][above])
    else:
        np.testing.assert_array_equal(I_lance, I_faiss)
        np.testing.assert_allclose(D_lance, D_faiss, rtol=1e-5, atol=1e-5)
        stored = table.to_arrow()  # the rows map back to the same document ids
        id_of_row = dict(zip(stored["row"].to_pylist(), stored["id"].to_pylist()))
        assert [[id_of_row[r] for r in rows] for rows in I_lance] == [[index.ids[r] for r in rows] for rows in I_faiss]


def test_every_precision_has_a_recipe():
    for name in PRECISIONS + ("faiss:PQ16", "faiss:IVF64,PQ32x4fs", "faiss:OPQ16,PQ16"):
        recipe = deployment_recipe(Precision(name), 64)
        assert recipe["faiss"]["factory"] == Precision(name).factory
        lance = recipe["lancedb"]
        assert lance["distance"] in ("dot", "hamming") and isinstance(lance["exact"], bool) and lance["note"]
        json.dumps(recipe)  # JSON-safe: it goes into plan.json
    assert deployment_recipe(Precision("rabitq1-rescore"), 64)["lancedb"]["refine_factor"] == 10
    assert deployment_recipe(Precision("faiss:IVF64,PQ32x4fs"), 64)["lancedb"]["index"] == {
        "index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": 32, "num_bits": 4, "num_partitions": 64}


@pytest.mark.parametrize("precision, least_overlap", [("int8", 0.9), ("rabitq1-rescore", 0.6)])
def test_indexed_recipes_build_in_lancedb_and_stay_near_the_plan(tmp_path, precision, least_overlap):
    """Recipes that are only LanceDB's nearest (its own IVF_SQ ranges, IVF_RQ with refine_factor) build on the whole bundled corpus.

    Measured on PCA-64 of the 5183 SciFact documents, 100 queries: top-10 overlap with the plan's
    own index 0.986 (int8 → IVF_SQ) and 0.827 (rabitq1-rescore → IVF_RQ + refine_factor 10); the
    floor here leaves room for LanceDB's k-means.
    """
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"], dtype=np.float32)
    queries = np.ascontiguousarray(bundled["query"][:100], dtype=np.float32)
    compressor = make_compressor("pca", dim=64).fit_unsupervised(docs)
    plan = tmp_path / "plan"
    write_plan(plan, compressor, Precision(precision), docs, {"chosen": {"setting": f"pca-64/{precision}"},
                                                               "deployment": deployment_recipe(Precision(precision), 64)})
    recipe = lancedb_recipe_of(plan)
    assert not recipe["exact"] and len(docs) >= recipe["min_rows_for_index"]
    table = load_plan_into_lancedb(plan, docs, [str(i) for i in bundled["document_ids"]], tmp_path / "lancedb")
    assert [config.index_type for config in table.list_indices()] == [{"int8": "IvfSq"}.get(precision, "IvfRq")]
    xq = compressor.transform(queries)
    _, I_lance = search_lancedb(table, recipe, xq, K)
    _, I_plan = QuantizedIndex.build(compressor.transform(docs), precision).search(xq, K)
    overlap = np.mean([len(set(a) & set(b)) / K for a, b in zip(I_lance, I_plan)])
    assert overlap >= least_overlap, overlap


def test_search_prints_no_warning_per_query(tmp_path, scifact_slice, capfd):
    """Lance writes its deprecation warnings from native code to the stderr descriptor, once per query that omits ``_distance``."""
    root, docs, queries, ids, compressor = scifact_slice
    plan = tmp_path / "plan"
    write_plan(plan, compressor, Precision("float32"), docs, {"chosen": {"setting": "pca-64/float32"},
                                                             "deployment": deployment_recipe(Precision("float32"), 64)})
    table = load_plan_into_lancedb(plan, docs, ids, tmp_path / "lancedb")
    capfd.readouterr()
    D, I = search_lancedb(table, lancedb_recipe_of(plan), compressor.transform(queries[:3]), K)
    assert I.shape == (3, K) and np.isfinite(D).all()
    assert capfd.readouterr().err == ""
