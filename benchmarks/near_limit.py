"""In-RAM codes near the rate-distortion limit: embedtune's codecs against the textbook coder and the peers, per budget.

    nice -n 10 .venv/bin/python benchmarks/near_limit.py --data scifact --model minilm        # run (resumable)
    .venv/bin/python benchmarks/near_limit_report.py                                        # tables from the rows

No labels choose anything here, and no document is encoded by tables fitted on it: the corpus is cut
in two halves and each half is encoded by the rotations, codebooks and ranges fitted on the other
(:func:`cross_fitted`), the regime of a corpus much larger than the sample its codec is fitted on. On
a corpus of a few thousand documents a codec fitted on every document can store the documents in its
tables (FAISS ``RQ32x8`` on MED's 1,033 documents: 12 MB of codebooks, -44 dB "below" the bound,
agreement 0.998): bytes per vector that no larger corpus would see. ScaNN and RaBitQ-Library fit on
every document (their builders train on what they index). At each budget B (bytes per vector held in RAM: 16, 32, 48, 64, 128)
every setting is fitted on the corpus's vectors alone and scored twice:

* ``agreement``: recall@10 of the uncompressed float32 top-10, with held-out corpus documents as
  queries (:func:`embedtune.workflows.label_free.held_out_documents`: a hashed 10 %, at most 1,000;
  a query document never finds itself), the label-free objective a user of FAISS alone tunes by;
* ``test``: nDCG@10 on every judged test query (per query, for paired tests), afterwards.

The settings (every one on the frozen vectors unless named otherwise):

* **embedtune's codecs** (:mod:`embedtune.index.codecs.transform`): ``klt-pq:B``, ``klt-pq4:B``,
  ``klt-rq:B`` (up to 32 B: more residual stages take too long to train on this CPU), ``klt-wpq:B``
  (weighted for the score's error), ``klt-apq:B`` (its codes chosen by the anisotropic loss), and
  ``klt-pq4-sphere:B`` and ``klt-apq-sphere:B``: the same codes, each query's top 100 ranked by the direction of
  their decoded vectors (:mod:`embedtune.index.codecs.sphere`; the vectors are unit, nothing more is held);
* with ``--learned``, **a label-free learned transform in front** (DIVE's unsupervised preset, fitted
  on the other half's documents) at 64 and 128 dims, then a codec: it counts only where it beats the
  codecs on the plain vectors at equal bytes; with ``--learned-text``, the same DIVE fitted from the corpus's text
  (``dive@text``: its ``unsupervised-guarded`` preset, as ``compress fit --unsupervised`` and a label-free plan fit it
  from a corpus), in front of ``klt-apq`` and the trellis codes;
* **the textbook transform coder** ``klt-sq:B`` (KLT, integer reverse water-filling, Lloyd-Max per axis);
* **a trellis code** ``klt-tcq:B`` (KLT, water-filled bits in one bit-shift trellis over the axes, Viterbi-encoded),
  the nearest the bound a coder of these bytes gets; no FAISS index type holds its codes, and embedtune's numpy scan
  serves them, so it is one of embedtune's codecs (a candidate of the pick), shown in its own column too;
* **the same two decoded onto the unit sphere**, ``klt-sq-sphere:B`` and ``klt-tcq-sphere:B``: the same codes, each
  document scaled to norm 1 before it is scored (:meth:`embedtune.index.codecs.textbook.RotatedCodeIndex.on_sphere`);
  ``klt-sq-sphere`` is a reference, ``klt-tcq-sphere`` served as ``klt-tcq`` is;
* **the peers a user would pick instead**, at most B bytes in RAM: FAISS ``PQ``, ``OPQ`` (up to 32 B),
  fast-scan ``PQ..x4fs``, the additive quantisers ``RQ..x8`` and ``PRQ2x..x8`` (up to 32 B) and ``LSQ..x8`` (16 B), RaBitQ, TurboQuant, SQ4, sign bits (float query),
  PCA (centred, fitted on the corpus) at int8 / int4 / TurboQuant / sign bits, ScaNN's anisotropic codes
  and extended RaBitQ (``benchmarks/in_ram_peers.py``: their bytes are the code's, a benefit of the doubt:
  ScaNN's 4-bit build holds three times that);
* **the disk-rescore tier** (never counted as RAM): the top 100 of an in-RAM code rescored with the
  original float32 vectors read from disk, as FAISS's ``IndexRefineFlat`` does: FAISS ``PQ{B}`` refined
  (the peer) and embedtune's pick refined (the option).

Per row: ``ram_bytes``, ``fixed_bytes`` (tables that do not grow with the corpus), ``fit_s``, test
nDCG@10 per query, agreement, and the distortion (:func:`embedtune.index.codecs.distortion_report`:
MSE of the decoded documents, the Gaussian rate-distortion bound at ``8 B`` bits for the corpus's
spectrum, the gap in dB) where the codes decode to vectors in the original space, and for every row the
score error measured from the search itself (the returned top-100 scores against the exact float
inner products, centred per query). One JSON per (corpus, model, setting) under
``benchmarks/results/near-limit/<data>-<model>/``: a row that exists is skipped, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.evaluate.metrics import evaluate_run  # noqa: E402
from embedtune.evaluate.search import run_from_topk  # noqa: E402
from embedtune.index.codecs import Precision, QuantizedIndex, codec_family, corpus_spectrum, distortion_report  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows.label_free import exact_top_k, held_out_documents  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "near-limit"
BUDGETS = (16, 32, 48, 64, 128)
CODECS = ("klt-pq", "klt-pq4", "klt-rq", "klt-wpq", "klt-apq", "klt-pq4-sphere", "klt-apq-sphere")
#: The reference codes decoded onto the unit sphere (``--only sphere``): the textbook coder's and the trellis code's.
SPHERE_CODECS = ("klt-sq-sphere", "klt-tcq-sphere", "klt-tcq12-sphere")
RQ_MAX_BYTES = 32
OPQ_MAX_BYTES = 32
FAISS_RQ_MAX_BYTES = 32
#: LSQ re-encodes its training set at every step: LSQ16x8 took 3 minutes on MED's two 516-row halves, and LSQ32x8 had not
#: finished after 17 (one thread), so it is run up to 16 B.
FAISS_LSQ_MAX_BYTES = 16
PCA_DIMS = (16, 32, 48, 64, 96, 128, 192, 256, 384)
PCA_PRECISIONS = ("int8", "int4", "turboquant1", "turboquant4", "binary-asym", "float16")
FROZEN_PRECISIONS = ("binary-asym", "turboquant1", "rabitq1", "rabitq4", "int4", "turboquant4", "int8", "float16")
RESCORE_CANDIDATES = 100
#: The learned transforms in front of a codec (``--learned``): DIVE's unsupervised preset at 64 and 128 dims, then
#: the codec at 16, 32 and 48 B (klt-pq4, and klt-apq, the best codec on the plain vectors), and int4 (the label-free
#: plan's best on ArguAna before the codecs).
LEARNED = (("dive", 64, "klt-pq4:16"), ("dive", 64, "klt-pq4:32"), ("dive", 64, "int4"), ("dive", 128, "klt-pq4:32"),
           ("dive", 128, "klt-pq4:48"), ("dive", 64, "klt-apq:16"), ("dive", 64, "klt-apq:32"), ("dive", 128, "klt-apq:32"),
           ("dive", 128, "klt-apq:48"),
           # DIVE's output is unit-norm (its head is normalised), so the sphere families apply behind it too.
           ("dive", 64, "klt-pq4-sphere:16"), ("dive", 64, "klt-apq-sphere:16"), ("dive", 128, "klt-pq4-sphere:32"),
           ("dive", 128, "klt-apq-sphere:32"), ("dive", 128, "klt-apq-sphere:48"))
#: The trellis code (a reference, never the pick) behind the same label-free DIVE (``--learned``): how near a learned space's
#: codes get to keeping the model once the quantiser is near the bound.
LEARNED_REFERENCE = (("dive", 128, "klt-tcq:32"), ("dive", 128, "klt-tcq:48"), ("dive", 64, "klt-tcq-sphere:16"),
                     ("dive", 128, "klt-tcq-sphere:32"))
#: The same label-free DIVE fitted from the corpus's text (``--learned-text``), as ``compress fit --unsupervised`` and a
#: label-free plan fit it where the text is at hand: its ``unsupervised-guarded`` preset (the training documents'
#: pseudo-queries as anchors, training kept only where the held-out documents' pseudo-queries show it pays).
LEARNED_TEXT = (("dive@text", 64, "klt-apq:16"), ("dive@text", 64, "klt-tcq-sphere:16"), ("dive@text", 128, "klt-apq:32"),
                ("dive@text", 128, "klt-tcq-sphere:32"), ("dive@text", 128, "klt-apq:48"), ("dive@text", 128, "klt-tcq:48"))
#: PCA to k dims in front of the codec (``--truncated``): the spaces a plan scores its codecs on besides the plain vectors.
#: At 16-32 B a codec over all d axes spreads its bits thin; dropping the weakest axes first may keep more.
TRUNCATED = (("pca", 64, "klt-apq:16"), ("pca", 128, "klt-apq:16"), ("pca", 128, "klt-apq:32"), ("pca", 192, "klt-apq:48"))
FETCH = 101  # one extra: a document whose id is the query's is dropped, as BEIR does

#: Vectors: (data, model) -> npz with document/query arrays and their ids.
VECTORS = {
    ("scifact", "minilm"): ROOT / "src/embedtune/datasets/scifact-minilm-vectors.npz",
    ("scifact", "mpnet"): HERE / "data/vectors/scifact-mpnet-vectors.npz",
    ("arguana", "minilm"): HERE / "data/vectors/arguana-minilm-vectors.npz",
    ("arguana", "mpnet"): HERE / "data/vectors/arguana-mpnet-vectors.npz",  # not committed (29 MB): see data/vectors/README.md
    ("npl", "minilm"): HERE / "data/vectors/npl-minilm-vectors.npz",
    ("cacm", "minilm"): HERE / "data/vectors/cacm-minilm-vectors.npz",
    ("med", "minilm"): HERE / "data/vectors/med-minilm-vectors.npz",
}
BEIR = ROOT.parent / "shared" / "data" / "beir"

logger = logging.getLogger("near_limit")


def load(data: str, model: str) -> dict[str, Any]:
    """The corpus and test queries (vectors, ids, qrels) of one (data, model)."""
    path = VECTORS[(data, model)]
    arrays = np.load(path, allow_pickle=False)
    docs = np.ascontiguousarray(arrays["document"], dtype=np.float32)
    doc_ids = [str(x) for x in arrays["document_ids"]]
    qrels: dict[str, dict[str, int]] = {}
    with open(BEIR / data / "qrels" / "test.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            qid, did, score = line.rstrip("\n").split("\t")
            if int(score) > 0:
                qrels.setdefault(qid, {})[did] = int(score)
    all_ids = [str(x) for x in arrays["query_ids"]]
    rows = [i for i, qid in enumerate(all_ids) if qid in qrels]
    held = held_out_documents(doc_ids)
    position = {d: i for i, d in enumerate(doc_ids)}
    held_rows = np.array([position[d] for d in held])
    return {"docs": docs, "doc_ids": doc_ids, "queries": np.ascontiguousarray(arrays["query"][rows], dtype=np.float32),
            "query_ids": [all_ids[i] for i in rows], "qrels": qrels, "held_rows": held_rows,
            "agreement_truth": exact_top_k(docs[held_rows], docs, 10, exclude=held_rows), "spectrum": corpus_spectrum(docs),
            "vectors": str(path.relative_to(ROOT)), "name": f"{data}-{model}", "data": data, "model": model}


class Searcher:
    """A built setting: ``search(xq, k) -> (D, I)`` over the corpus, its bytes and what it costs to fit."""

    def __init__(self, search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]], ram_bytes: int, fixed_bytes: int,
                 fit_s: float, reconstruct: np.ndarray | None = None, info: dict[str, Any] | None = None,
                 transform_query: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.search, self.ram_bytes, self.fixed_bytes, self.fit_s = search, ram_bytes, fixed_bytes, fit_s
        self.reconstruct, self.info = reconstruct, info or {}
        self.transform_query = transform_query or (lambda q: q)


def halves(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint halves of the corpus rows (seeded, sorted): each half's codes come from tables fitted on the other."""
    order = np.random.default_rng(0).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2 :])


def cross_fitted(ds: dict[str, Any], build_half: Callable[[np.ndarray, np.ndarray], tuple[Any, Callable, np.ndarray | None, int, int]],
                 ) -> Searcher:
    """A setting whose every document is encoded by tables fitted without it, as in a corpus much larger than its fit sample.

    ``build_half(rows, fit_rows)`` builds the setting's index over ``rows`` with everything it learns (rotations, codebooks,
    ranges) fitted on ``fit_rows``, and returns ``(index, search, reconstruction of rows or None, ram bytes, fixed bytes)``.
    The two halves are searched and their results merged by score; each half's mean residual ``c`` (the offset a code
    leaves, e.g. the left-out axes' mean) is added back as ``q · c``, so the two halves' scores are on one scale.
    """
    docs = ds["docs"]
    a, b = halves(len(docs))
    start = time.perf_counter()
    parts = []
    decoded = np.zeros_like(docs)
    have_decoded = True
    ram = fixed = 0
    for rows, fit_rows in ((a, b), (b, a)):
        index, search, rec, ram, fixed = build_half(rows, fit_rows)
        offset = np.zeros(docs.shape[1], dtype=np.float32)
        if rec is None:
            have_decoded = False
        else:
            decoded[rows] = rec
            offset = (docs[rows] - rec).mean(axis=0).astype(np.float32)
        parts.append((rows, search, offset))
    fit_s = time.perf_counter() - start

    def search(xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = [], []
        for rows, part_search, offset in parts:
            D, I = part_search(xq, min(k, len(rows)))
            valid = I >= 0
            scores.append(np.where(valid, D + (xq @ offset)[:, None], -np.inf))
            ids.append(np.where(valid, rows[np.clip(I, 0, None)], -1))
        D, I = np.hstack(scores), np.hstack(ids)
        order = np.argsort(-D, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(D, order, 1).astype(np.float32), np.take_along_axis(I, order, 1)

    return Searcher(search, ram, fixed, fit_s, decoded if have_decoded else None, {"cross_fitted": True})


def frozen_setting(ds: dict[str, Any], name: str) -> Searcher:
    docs = ds["docs"]
    axes: list[int] = []

    def build_half(rows: np.ndarray, fit_rows: np.ndarray):
        index = QuantizedIndex.build(docs[rows], Precision(name), train=docs[fit_rows])
        # klt-wpq: its weighted encoder holds the transform onto the kept axes.
        chain = getattr(getattr(index.backend, "encoder", index.backend), "chain", None)
        if chain is not None and chain.size():  # a transform codec: how many principal axes it kept
            axes.append(int(chain.at(0).d_out))
        return index, index.search, index.reconstruct(docs[rows]), index.ram_bytes(), index.fixed_bytes()

    searcher = cross_fitted(ds, build_half)
    if axes:
        searcher.info["axes_kept"] = axes
    return searcher


def pca_setting(ds: dict[str, Any], k: int, precision: str) -> Searcher:
    """Centred PCA to ``k`` dims fitted on the corpus (queries rotated without the centre: same rankings), then ``precision``."""
    docs = ds["docs"]

    def build_half(rows: np.ndarray, fit_rows: np.ndarray):
        fit = docs[fit_rows]
        mean = fit.mean(axis=0)
        eigenvalues, axes = np.linalg.eigh(np.cov(fit.T.astype(np.float64), bias=True))
        top = np.ascontiguousarray(axes[:, np.argsort(-eigenvalues)[:k]], dtype=np.float32)
        xb = np.ascontiguousarray((docs[rows] - mean) @ top)
        index = QuantizedIndex.build(xb, Precision(precision), train=np.ascontiguousarray((fit - mean) @ top))
        rec = index.reconstruct(xb)
        return (index, lambda q, k_: index.search(np.ascontiguousarray(q @ top), k_), None if rec is None else rec @ top.T + mean,
                index.ram_bytes(), index.fixed_bytes() + 4 * (top.size + mean.size))

    searcher = cross_fitted(ds, build_half)
    searcher.info["map_bytes"] = 4 * (k * docs.shape[1] + docs.shape[1])  # counted in fixed_bytes: the matrix and the centre
    return searcher


def learned_setting(ds: dict[str, Any], method: str, k: int, precision: str) -> Searcher:
    """A label-free learned transform (``compress fit --unsupervised``: DIVE's neighbour-rank distillation, PCA...) to ``k``
    dims, fitted on the other half's documents alone, then ``precision`` on its output."""
    docs = ds["docs"]
    in_space: list[dict[str, Any]] = []
    text = None
    if method.endswith("@text"):  # the corpus's text and model: DIVE's text preset, as a plan fits it from a corpus
        from embedtune.workflows.experiment import load_corpus_experiment

        if "text" not in ds:  # once per corpus: every @text setting reads the same text and model
            ds["text"] = load_corpus_experiment(BEIR / ds["data"], ds["model"])
        method, text = method.removesuffix("@text"), ds["text"]

    map_bytes: list[int] = []

    def build_half(rows: np.ndarray, fit_rows: np.ndarray):
        compressor = fit_map(ds, method, k, rows, fit_rows, text)
        map_bytes.append(compressor.transform_bytes())
        xb = np.ascontiguousarray(compressor.transform(docs[rows]), dtype=np.float32)
        index = QuantizedIndex.build(xb, Precision(precision), train=np.ascontiguousarray(compressor.transform(docs[fit_rows]), dtype=np.float32))
        # The transform's output has no decoding back to the d-dim vectors, so the codec's distance from the bound is
        # measured where it codes: on this half's k-dim vectors, against the bound for their own spectrum.
        rec = index.reconstruct(xb)
        if rec is not None:
            in_space.append(distortion_report(xb, rec, 8 * index.ram_bytes()))
        # The map's weights are held once beside the index, as PCA's matrix (pca_setting) and a codec's rotation are.
        return (index, lambda q, k_: index.search(np.ascontiguousarray(compressor.transform(q), dtype=np.float32), k_), None,
                index.ram_bytes(), index.fixed_bytes() + map_bytes[-1])

    searcher = cross_fitted(ds, build_half)
    searcher.info["map_bytes"] = map_bytes[-1]
    if len(in_space) == 2:
        searcher.info.update(space=f"{method}-{k}", space_mse=float(np.mean([r["mse"] for r in in_space])),
                             space_bound_mse=float(np.mean([r["bound_mse"] for r in in_space])),
                             space_gap_db=float(np.mean([r["gap_db"] for r in in_space])))
    return searcher


def fit_map(ds: dict[str, Any], method: str, k: int, rows: np.ndarray, fit_rows: np.ndarray, text: Any = None) -> Any:
    """The label-free map (``method`` to ``k`` dims) fitted on ``fit_rows``' documents to code ``rows``, cached per half."""
    from embedtune.workflows.label_free import fit_label_free
    from embedtune.workflows.plan import candidate_for

    work = Path.home() / ".cache" / "embedtune" / "near-limit-fits" / ds["name"] / f"half{int(rows[0] == 0)}"
    compressor, _ = fit_label_free(candidate_for(method, k), [ds["doc_ids"][i] for i in fit_rows], ds["docs"][fit_rows], seed=2027,
                                   work=work if text is None else work / "text", text=text)
    return compressor


def record_map_bytes(data: str, model: str, like: str | None = None) -> int:
    """Rows of a learned map written before rows counted its weights: fit the same map again (or read it from the cache) on
    the first half, add :meth:`~embedtune.compress.base.Compressor.transform_bytes` to ``fixed_bytes`` and record it as
    ``map_bytes``. Nothing else in a row changes. Returns how many rows were updated.

    ``like`` (``<data>-<model>``, the same model): where this corpus's vectors are not at hand, read each map's bytes from
    that corpus's rows instead. A map's weights have the shape its preset, input and output dims give, whatever it was
    fitted on (``tests/test_compressor_contract.py``)."""
    root = RESULTS / f"{data}-{model}"
    measured: dict[tuple[str, int], int] = {}
    source = "the map fitted again on the first half"
    if like is not None:
        if not like.endswith(f"-{model}"):
            raise ValueError(f"--map-bytes-like {like}: a map's bytes depend on its input dims; name a corpus of {model}.")
        for path in sorted((RESULTS / like).glob("dive*.json")):
            row = json.loads(path.read_text(encoding="utf-8"))
            if "map_bytes" in row:
                method, k = row["setting"].split("/", 1)[0].rsplit("-", 1)
                measured[(method, int(k))] = int(row["map_bytes"])
        source = f"read from {like}'s rows (the same preset, input and output dims)"
    ds = load(data, model) if like is None else None
    updated = 0
    for path in sorted(root.glob("*.json")):
        row = json.loads(path.read_text(encoding="utf-8"))
        space = str(row.get("setting", "")).split("/", 1)[0]
        if "skipped" in row or "map_bytes" in row or not space.startswith("dive"):
            continue
        method, k = space.rsplit("-", 1)
        if (method, int(k)) not in measured:
            if ds is None:
                raise ValueError(f"{like} has no row of {method}-{k} with its map's bytes; record them there first.")
            text = None
            if method.endswith("@text"):
                from embedtune.workflows.experiment import load_corpus_experiment

                text = ds.setdefault("text", load_corpus_experiment(BEIR / ds["data"], ds["model"]))
            a, b = halves(len(ds["docs"]))
            compressor = fit_map(ds, method.removesuffix("@text"), int(k), a, b, text)
            measured[(method, int(k))] = compressor.transform_bytes()
            logger.info("%s-%s: the map holds %d bytes", method, k, measured[(method, int(k))])
        row["map_bytes"] = measured[(method, int(k))]
        row["fixed_bytes"] = int(row.get("fixed_bytes") or 0) + row["map_bytes"]
        row["map_bytes_recorded"] = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {source}"
        atomic_write_json(path, row)
        updated += 1
    return updated


def peer_setting(ds: dict[str, Any], name: str, budget: int) -> Searcher | None:
    from in_ram_peers import PEERS

    peer = PEERS[name](ds["docs"], budget, 0)
    if peer is None:
        return None
    return Searcher(peer.search, int(peer.ram_bytes), int(peer.fixed_bytes), float(peer.fit_s), None,
                    {"held_bytes": int(peer.held_bytes), "config": json.loads(json.dumps(peer.params, default=str))})


def refined(base: Searcher, ds: dict[str, Any]) -> Searcher:
    """``base``'s top :data:`RESCORE_CANDIDATES`, rescored with the float32 vectors (read from disk when deployed)."""
    docs = ds["docs"]

    def search(xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        _, candidates = base.search(xq, max(k, RESCORE_CANDIDATES))
        scores = np.einsum("qd,qkd->qk", xq, docs[np.clip(candidates, 0, None)])
        scores[candidates < 0] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, order, 1), np.take_along_axis(candidates, order, 1)

    info = {**base.info, "disk_bytes_per_query": RESCORE_CANDIDATES * 4 * docs.shape[1]}
    return Searcher(search, base.ram_bytes, base.fixed_bytes, base.fit_s, None, info)


def score(ds: dict[str, Any], searcher: Searcher, budget_bits: int) -> dict[str, Any]:
    """Test nDCG@10 per query, agreement, the score error from the search, and the distortion against the bound."""
    D, I = searcher.search(ds["queries"], FETCH)
    metrics = evaluate_run(ds["qrels"], run_from_topk(ds["query_ids"], D, I, ds["doc_ids"], 100, True), ("ndcg@10", "recall@100"))
    held = ds["held_rows"]
    _, agree_rows = searcher.search(ds["docs"][held], 11)
    hits = [len(set(row[row != own][:10]) & set(truth)) for row, own, truth in zip(agree_rows, held, ds["agreement_truth"])]
    agreement = float(np.mean(hits) / 10)
    valid = I >= 0
    exact = np.einsum("qd,qkd->qk", ds["queries"], ds["docs"][np.clip(I, 0, None)])
    error = np.where(valid, D - exact, 0.0)
    error = np.where(valid, error - error.sum(1, keepdims=True) / np.maximum(valid.sum(1, keepdims=True), 1), 0.0)
    row: dict[str, Any] = {
        "ndcg@10": metrics["ndcg@10"], "recall@100": metrics["recall@100"], "n_queries": metrics.n_queries,
        "per_query": {q: round(v["ndcg@10"], 6) for q, v in metrics.per_query.items()},
        "agreement": agreement, "n_agreement_queries": int(len(held)),
        # Of each held-out document's float32 top-10, how many the setting finds (in held-out order): the paired test of
        # a learned transform against the codec without one (near_limit_report.py, as compress plan's gate_learned).
        "agreement_hits": [int(h) for h in hits],
        "score_error": float((error ** 2).sum() / max(valid.sum(), 1)),
    }
    report = distortion_report(ds["docs"], searcher.reconstruct, budget_bits, eigenvalues=ds["spectrum"])
    row.update(mse=report["mse"], bound_mse=report["bound_mse"], gap_db=report["gap_db"])
    return row


def served_label(precision: str, reference: str, learned: bool = False) -> str:
    """The family label of a codec row: a codec a plan can ship (``klt-tcq``, served by embedtune's numpy scan) is one of
    embedtune's candidates (the pick's); one no plan ships (``klt-sq``) is a reference column, ``reference``."""
    if codec_family(precision).deployable:
        return "embedtune learned + codec" if learned else "embedtune codec"
    return reference


def settings(d: int, budgets: tuple[int, ...], learned: bool = False, rq_max_bytes: int = RQ_MAX_BYTES,
             truncated: bool = False, learned_text: bool = False) -> list[tuple[str, int, str, str, Callable[..., Searcher | None]]]:
    """Every (setting name, budget, family, tier, builder) of the run, cheapest first."""
    out: list[tuple[str, int, str, str, Callable[..., Searcher | None]]] = []
    for name in ("float32", *FROZEN_PRECISIONS):
        ram = Precision(name).ram_bytes(d)
        out.append((f"frozen/{name}", ram, "frozen + FAISS quantiser", "ram", lambda ds, name=name: frozen_setting(ds, name)))
    for k in PCA_DIMS:
        if k >= d:
            continue
        for precision in PCA_PRECISIONS:
            ram = Precision(precision).ram_bytes(k)
            if ram <= max(budgets):
                out.append((f"pca-{k}/{precision}", ram, "PCA + quantiser", "ram", lambda ds, k=k, p=precision: pca_setting(ds, k, p)))
    for budget in budgets:
        for family in CODECS:
            if family == "klt-rq" and budget > rq_max_bytes:
                continue
            name = f"{family}:{budget}"
            out.append((f"frozen/{name}", budget, "embedtune codec", "ram", lambda ds, name=name: frozen_setting(ds, name)))
        if budget <= d:
            out.append((f"frozen/klt-sq:{budget}", budget, "textbook transform coder", "ram",
                        lambda ds, b=budget: frozen_setting(ds, f"klt-sq:{b}")))
        out.append((f"frozen/klt-tcq:{budget}", budget, served_label(f"klt-tcq:{budget}", "trellis code (reference)"), "ram",
                    lambda ds, b=budget: frozen_setting(ds, f"klt-tcq:{b}")))
        # The same two reference codes, each document decoded onto the unit sphere (no extra byte; a cosine model's vectors).
        for family in SPHERE_CODECS:
            if family == "klt-sq-sphere" and budget > d:
                continue
            out.append((f"frozen/{family}:{budget}", budget, served_label(f"{family}:{budget}", "sphere decode (reference)"), "ram",
                        lambda ds, name=f"{family}:{budget}": frozen_setting(ds, name)))
        factories = []
        if d % budget == 0:  # "np": no polysemous training (minutes here; it reorders centroid ids, ADC ranks the same)
            factories.append(f"PQ{budget}np")
            if budget <= OPQ_MAX_BYTES:
                factories.append(f"OPQ{budget},PQ{budget}np")
        if d % (2 * budget) == 0:
            factories.append(f"PQ{2 * budget}x4fs")
        if budget <= FAISS_RQ_MAX_BYTES:
            factories.append(f"RQ{budget}x8")
            # The other additive quantisers: residual over two halves of the dimensions, and local search (LSQ, minutes).
            if budget % 2 == 0 and d % 2 == 0:
                factories.append(f"PRQ2x{budget // 2}x8")
            if budget <= FAISS_LSQ_MAX_BYTES:
                factories.append(f"LSQ{budget}x8")
        for factory in factories:
            family = "FAISS PRQ/LSQ" if factory.startswith(("PRQ", "LSQ")) else "FAISS PQ/OPQ/RQ"
            out.append((f"frozen/faiss:{factory}", budget, family, "ram", lambda ds, f=factory: frozen_setting(ds, f"faiss:{f}")))
        for peer in ("scann-ah", "scann-ah256", "rabitq-ext"):
            out.append((f"peer/{peer}:{budget}", budget, "ScaNN / RaBitQ-Library", "ram", lambda ds, p=peer, b=budget: peer_setting(ds, p, b)))
    if learned:
        for method, k, precision in LEARNED:
            out.append((f"{method}-{k}/{precision}", Precision(precision).ram_bytes(k), "embedtune learned + codec", "ram",
                        lambda ds, m=method, k=k, p=precision: learned_setting(ds, m, k, p)))
        for method, k, precision in LEARNED_REFERENCE:
            family = served_label(precision, "sphere decode (reference)" if "-sphere:" in precision else "trellis code (reference)",
                                  learned=True)
            out.append((f"{method}-{k}/{precision}", Precision(precision).ram_bytes(k), family, "ram",
                        lambda ds, m=method, k=k, p=precision: learned_setting(ds, m, k, p)))
    if learned_text:
        for method, k, precision in LEARNED_TEXT:
            out.append((f"{method}-{k}/{precision}", Precision(precision).ram_bytes(k), "embedtune learned + codec", "ram",
                        lambda ds, m=method, k=k, p=precision: learned_setting(ds, m, k, p)))
    if truncated:
        for method, k, precision in TRUNCATED:
            if k < d:
                out.append((f"{method}-{k}/{precision}", Precision(precision).ram_bytes(k), "embedtune codec", "ram",
                            lambda ds, m=method, k=k, p=precision: learned_setting(ds, m, k, p)))
    return out


def cell_path(root: Path, setting: str) -> Path:
    return root / (setting.replace("/", "__").replace(":", "_").replace(",", "+") + ".json")


def run(data: str, model: str, budgets: tuple[int, ...], only: list[str] | None, learned: bool = False, rq_max_bytes: int = RQ_MAX_BYTES,
        truncated: bool = False, redo_without_hits: bool = False, learned_text: bool = False) -> Path:
    root = RESULTS / f"{data}-{model}"
    root.mkdir(parents=True, exist_ok=True)
    ds = load(data, model)
    d = ds["docs"].shape[1]
    command = " ".join(sys.argv)
    before = json.loads((root / "meta.json").read_text(encoding="utf-8")) if (root / "meta.json").is_file() else {}
    machine = machine_info()
    machines = before.get("machines", [before["machine"].get("cpu")] if "machine" in before else [])
    meta = {"data": data, "model": model, "vectors": ds["vectors"], "n_docs": len(ds["docs"]), "dim": d,
            "n_test_queries": len(ds["query_ids"]), "machine": machine, "command": command,
            # every invocation that added rows here, and every machine they ran on (rows carry their own dates)
            "commands": list(dict.fromkeys([*before.get("commands", []), command])),
            "machines": list(dict.fromkeys([*machines, machine.get("cpu")]))}
    atomic_write_json(root / "meta.json", meta)
    built: dict[str, Searcher] = {}
    for setting, ram, family, tier, build in settings(d, budgets, learned, rq_max_bytes, truncated, learned_text):
        if only and not any(part in setting for part in only):
            continue
        path = cell_path(root, setting)
        if path.is_file():
            written = json.loads(path.read_text(encoding="utf-8"))
            if not (redo_without_hits and "agreement_hits" not in written and "skipped" not in written):
                continue
        start = time.perf_counter()
        try:
            searcher = build(ds)
        except (ValueError, RuntimeError) as error:  # a budget this dimension or corpus cannot hold
            atomic_write_json(path, {"setting": setting, "skipped": str(error).splitlines()[0], "ram_bytes": ram, "family": family})
            logger.info("%s: skipped (%s)", setting, str(error).splitlines()[0])
            continue
        if searcher is None:
            atomic_write_json(path, {"setting": setting, "skipped": "the peer cannot hold this budget", "ram_bytes": ram, "family": family})
            continue
        built[setting] = searcher
        row = {"setting": setting, "family": family, "tier": tier, "ram_bytes": searcher.ram_bytes, "fixed_bytes": searcher.fixed_bytes,
               "fit_s": searcher.fit_s, **searcher.info, **score(ds, searcher, 8 * searcher.ram_bytes),
               "wall_s": time.perf_counter() - start, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        atomic_write_json(path, row)
        logger.info("%-34s %4d B  nDCG@10 %.4f  agreement %.3f  gap %s dB  fit %.1fs", setting, row["ram_bytes"], row["ndcg@10"],
                    row["agreement"], "n/a" if row["gap_db"] is None else f"{row['gap_db']:.2f}", row["fit_s"])
        # The disk-rescore tier: FAISS PQ refined with the float vectors (the peer), and each embedtune codec refined (the option).
        if setting.startswith("frozen/faiss:PQ") and "x4fs" not in setting or family == "embedtune codec":
            rescored = f"disk/{setting.split('/', 1)[1]}+refine{RESCORE_CANDIDATES}"
            rpath = cell_path(root, rescored)
            if not rpath.is_file():
                r = refined(searcher, ds)
                atomic_write_json(rpath, {"setting": rescored, "family": f"{family}, rescored from disk", "tier": "disk-rescore",
                                          "ram_bytes": r.ram_bytes, "fixed_bytes": r.fixed_bytes, "fit_s": r.fit_s, **r.info,
                                          **score(ds, r, 8 * r.ram_bytes), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
        built.pop(setting, None)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, choices=sorted({d for d, _ in VECTORS}))
    parser.add_argument("--model", default="minilm", choices=sorted({m for _, m in VECTORS}))
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--learned", action="store_true",
                        help="also a label-free learned transform in front of a codec (DIVE unsupervised; minutes per fit)")
    parser.add_argument("--learned-text", action="store_true",
                        help="also label-free DIVE fitted from the corpus's text (its unsupervised-guarded preset, as a plan fits it "
                             "from a corpus) in front of a codec; encodes the corpus and its pseudo-queries with --model (cached)")
    parser.add_argument("--truncated", action="store_true",
                        help="also PCA to k dims in front of klt-apq (the plan's PCA spaces; seconds to a minute per setting)")
    parser.add_argument("--rq-max-bytes", type=int, default=RQ_MAX_BYTES,
                        help="klt-rq only up to this budget (its cross-fitted fit takes minutes per budget here)")
    parser.add_argument("--only", nargs="+", help="only settings whose name contains one of these")
    parser.add_argument("--redo-without-hits", action="store_true",
                        help="measure again the rows written before rows kept each held-out document's agreement (agreement_hits)")
    parser.add_argument("--record-map-bytes", action="store_true",
                        help="only add the weights of each learned map (DIVE) to the tables of the rows written before rows counted "
                             "them (fits each map again on the first half, or reads it from the cache)")
    parser.add_argument("--map-bytes-like", metavar="DATA-MODEL",
                        help="with --record-map-bytes, where this corpus's vectors are not at hand: read each map's bytes from "
                             "that corpus's rows (the same model)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if (args.data, args.model) not in VECTORS:
        parser.error(f"no vectors for {args.data} x {args.model}; have {sorted(VECTORS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    set_threads(args.threads)
    os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(HERE / "data" / "vectors"))
    if args.record_map_bytes:
        logger.info("%d rows now count their map's weights", record_map_bytes(args.data, args.model, args.map_bytes_like))
        return 0
    run(args.data, args.model, tuple(args.budgets), args.only, args.learned, args.rq_max_bytes, args.truncated, args.redo_without_hits,
        args.learned_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
