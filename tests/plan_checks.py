"""Checks shared by the plan tests: a plan serves, through ``index build --plan``, exactly the codes its sweep scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.search import run_from_topk
from embedtune.index import load_index
from embedtune.index.codecs import QuantizedIndex
from embedtune.index.plan_export import plan_codec
from embedtune.index.plan_format import load_plan
from embedtune.index.planned import build_planned_index
from embedtune.workflows.plan import LabelledObjective


def record_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, np.ndarray, QuantizedIndex]]:
    """Every index the sweep builds, as ``(precision name, copy of its vectors, index)``, in order."""
    built: list[tuple[str, np.ndarray, QuantizedIndex]] = []
    real_build = QuantizedIndex.build.__func__

    def recording_build(cls, xb, precision, *args, **kwargs):
        index = real_build(cls, xb, precision, *args, **kwargs)
        built.append((index.precision.name, np.array(xb, copy=True), index))
        return index

    monkeypatch.setattr(QuantizedIndex, "build", classmethod(recording_build))
    return built


def assert_served_as_scored(experiment, plan: dict, out: Path, built: list, doc_vectors: Path, doc_ids: Path, index_dir: Path) -> None:
    """The index ``index build --plan`` writes from ``out`` returns the sweep's own top-10, codes and validation score.

    The sweep's index of the chosen setting is the first one built at its precision on its compressed
    vectors (the frozen space's vectors pass through the plan's compressor: equal up to float rounding).
    """
    _, compressor, precision, _ = load_plan(out)
    docs = compressor.transform(experiment.embeddings.doc_embeddings)
    scored = next(index for name, xb, index in built
                  if name == precision.name and xb.shape == docs.shape and np.allclose(xb, docs, rtol=0, atol=1e-6))
    index = load_index(build_planned_index(doc_vectors, index_dir, out, ids=doc_ids))
    assert index.manifest["kind"] == precision.name and index.manifest["plan"]["codec"] == precision.precision_codec.tables_file
    queries = LabelledObjective(experiment).queries
    xq = compressor.transform(queries.vectors)
    assert np.array_equal(scored.search(xq, 10)[1], index.search(xq, 10)[1])
    # `compress export --plan` ships the same codes: the plan's codec encodes new vectors as the index stored them.
    assert np.array_equal(plan_codec(out).encode(docs[:50]), scored.backend.sa_encode(docs[:50]))
    # ... and the served index gives the validation score the plan chose it by.
    D, I = index.search(xq, 101)
    served = evaluate_run(queries.judgments, run_from_topk(queries.ids, D, I, experiment.embeddings.doc_ids, 100, True), ("ndcg@10",))
    assert served["ndcg@10"] == pytest.approx(plan["chosen"]["ndcg@10"])
