"""CPU encoding backends side by side: torch, onnx (fp32) and onnx-int8.

Speed: documents/s over a fixed slice of SciFact's corpus (the first ``--docs`` documents in file
order, title + " " + text as embedtune encodes them), at one batch size and max sequence length,
on each thread count. Every (backend, threads) cell runs in its own subprocess, so its peak RSS
(the child's own ``VmHWM`` from ``/proc/self/status``: ``ru_maxrss`` of a forked child starts at
the parent's peak on Linux, which the export below inflates) is its own; model loading and the first batch are
outside the timed part, the ONNX export is done (and cached) before any cell runs.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \\
        .venv/bin/python benchmarks/encode_backends.py speed --docs 500 --batch-size 32 --threads 1 2

Quality: nDCG@10 over every test query of a BEIR dataset for each backend (the whole corpus
encoded by each; torch's SciFact MiniLM vectors come from the bundled cache entry), paired
permutation tests against torch, and how far the document vectors moved (max abs difference,
mean and minimum cosine to torch's). Without torch among ``--backends``, the first backend named is
the reference (``--backends onnx onnx-int8``: int8 against fp32 ONNX). ``--scores-out FILE`` keeps
each backend's per-query nDCG@10; ``--reference-scores FILE`` pairs a later run with them, so a
session that lost one backend's vectors need not encode them again.

    .venv/bin/python benchmarks/encode_backends.py quality --data scifact --model minilm --threads 1

Encode: fill the embedding cache for some backends and score nothing, with the same recipe as
``quality``, so that two cores can encode two backends of one long corpus at once and ``quality``
then finds both cached (each entry resumes shard by shard if it is cut short).

    .venv/bin/python benchmarks/encode_backends.py encode --data ../shared/data/beir/arguana --model mpnet --threads 1 --backends onnx
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(Path(__file__).resolve().parent / "data" / "vectors"))  # committed vectors (mpnet)

SCIFACT = "/work/shared/data/beir/scifact"
BACKENDS = ("torch", "onnx", "onnx-int8")


def _texts(data: str, docs: int) -> list[str]:
    from embedtune.data.beir import document_text, load_beir_corpus

    corpus = load_beir_corpus(data).corpus
    return [document_text(corpus[doc_id]) for doc_id in list(corpus)[:docs]]


def worker(args: argparse.Namespace) -> None:
    """One speed cell, in its own process: prints one JSON line."""
    import torch

    from embedtune.encoders import SentenceEncoder
    from embedtune.runtime import set_threads

    set_threads(args.threads)
    texts = _texts(args.data, args.docs)
    start = time.perf_counter()
    encoder = SentenceEncoder(args.model, backend=args.backend, batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                              show_progress=False)
    encoder.encode(texts[: args.batch_size])  # loads the model (and the session); first-batch costs are not timed
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    vectors = encoder.encode(texts)
    seconds = time.perf_counter() - start
    np.save(args.vectors_out, vectors)
    print(json.dumps({"backend": args.backend, "threads": args.threads, "torch_threads": torch.get_num_threads(), "docs": len(texts),
                      "seconds": seconds, "docs_per_s": len(texts) / seconds, "load_and_first_batch_s": load_seconds,
                      "vm_hwm_mb": _own_peak_rss_mb()}))


def _own_peak_rss_mb() -> float | None:
    """This process's peak resident set since its exec (Linux ``VmHWM``), or None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _run_cell_with_rss(args: argparse.Namespace, backend: str, threads: int, vectors_out: Path) -> dict:
    command = [sys.executable, __file__, "_worker", "--backend", backend, "--threads", str(threads), "--docs", str(args.docs),
               "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length), "--model", args.model,
               "--data", args.data, "--vectors-out", str(vectors_out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    out_path = vectors_out.with_suffix(".stdout")
    err_path = vectors_out.with_suffix(".stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS (KiB on Linux)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{backend} x{threads} failed:\n{err_path.read_text()[-3000:]}")
    row = json.loads(out_path.read_text().strip().splitlines()[-1])
    # ru_maxrss is kept as a fallback only: a forked child inherits the parent's high-water mark.
    row["peak_rss_mb"] = row.pop("vm_hwm_mb", None) or usage.ru_maxrss / 1024
    return row


def speed(args: argparse.Namespace) -> None:
    from embedtune.encoders import SentenceEncoder

    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for backend in args.backends:  # export (and cache) the graphs first: not part of any timed cell
        if backend != "torch":
            start = time.perf_counter()
            SentenceEncoder(args.model, backend=backend, show_progress=False).model
            print(f"# {backend}: graph ready in {time.perf_counter() - start:.1f}s (a cache hit after the first run)", flush=True)
    rows = []
    for threads in args.threads:
        for repeat in range(args.repeats):
            order = list(args.backends) if repeat % 2 == 0 else list(reversed(args.backends))  # drift hits every backend alike
            for backend in order:
                row = _run_cell_with_rss(args, backend, threads, scratch / f"{backend}-{threads}-{repeat}.npy")
                row["repeat"] = repeat
                rows.append(row)
                print(json.dumps(row), flush=True)
    reference = {t: np.load(scratch / f"torch-{t}-0.npy") for t in args.threads} if "torch" in args.backends else {}
    print(f"\n{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"model {args.model}, first {args.docs} documents of {args.data}, batch {args.batch_size}, max_seq_length {args.max_seq_length}")
    print("| backend | threads | docs/s | x torch | peak RSS MB | cosine to torch (mean / min) |")
    print("|---|---|---|---|---|---|")
    for threads in args.threads:
        cells = {b: [r for r in rows if r["backend"] == b and r["threads"] == threads] for b in args.backends}
        base = np.median([r["docs_per_s"] for r in cells.get("torch", [])]) if cells.get("torch") else None
        for backend, found in cells.items():
            rate = float(np.median([r["docs_per_s"] for r in found]))
            cos = ""
            if threads in reference:
                vectors = np.load(scratch / f"{backend}-{threads}-0.npy")
                sims = (vectors * reference[threads]).sum(1)
                cos = f"{sims.mean():.4f} / {sims.min():.4f}"
            ratio = f"{rate / base:.2f}" if base else ""
            rss = max(r["peak_rss_mb"] for r in found)
            print(f"| {backend} | {threads} | {rate:.1f} | {ratio} | {rss:.0f} | {cos} |")
    print("docs/s: median over repeats; peak RSS: the largest over repeats.")


def _load(args: argparse.Namespace, backend: str):
    from embedtune.workflows.experiment import load_experiment

    options = {"batch_size": args.batch_size, **({"backend": backend} if backend != "torch" else {})}
    return load_experiment(args.data, args.model, qrels_split="test", split_seed=None, encoder_options=options)


def encode(args: argparse.Namespace) -> None:
    from embedtune.runtime import set_threads

    set_threads(args.threads[0])
    if set(args.kinds) != {"document", "query"}:
        return _encode_kinds(args)
    for backend in args.backends:
        start = time.perf_counter()
        experiment = _load(args, backend)
        print(json.dumps({"backend": backend, "data": args.data, "model": args.model, "seconds": time.perf_counter() - start,
                          "cache_hits": experiment.embeddings.cache_hits, "encode_seconds": experiment.embeddings.timings}), flush=True)


def _encode_kinds(args: argparse.Namespace) -> None:
    """Fill the cache entries of only ``--kinds`` (the same keys ``quality`` reads), so the queries
    of a long corpus can be encoded on one core while its documents encode on the other."""
    from embedtune.data.beir import document_text, load_beir
    from embedtune.encoders import EmbeddingCache, SentenceEncoder
    from embedtune.encoders.dataset import cache_parts

    dataset = load_beir(args.data or "scifact", "test")
    cache = EmbeddingCache()
    for backend in args.backends:
        options = {"batch_size": args.batch_size, **({"backend": backend} if backend != "torch" else {})}
        encoder = SentenceEncoder(args.model, **options)
        for kind in args.kinds:
            source = dataset.corpus if kind == "document" else dataset.queries
            ids = list(source)
            texts = [document_text(d) for d in source.values()] if kind == "document" else list(source.values())
            start = time.perf_counter()
            if args.tail_from is not None:
                _encode_tail(cache, cache_parts(encoder, dataset, kind), ids, lambda lo, hi: encoder.encode(texts[lo:hi], kind), args.tail_from,
                             args.tail_to)
                print(json.dumps({"backend": backend, "kind": kind, "tail_from": args.tail_from, "tail_to": args.tail_to,
                                  "seconds": time.perf_counter() - start}),
                      flush=True)
                continue
            _, hit = cache.get_or_compute(cache_parts(encoder, dataset, kind), ids, lambda lo, hi: encoder.encode(texts[lo:hi], kind))
            print(json.dumps({"backend": backend, "kind": kind, "rows": len(ids), "cache_hit": hit, "seconds": time.perf_counter() - start}),
                  flush=True)


def _encode_tail(cache, parts: dict, ids: list[str], compute, first_row: int, end_row: int | None = None, shard_size: int = 2048) -> None:
    """Write the cache's ``partial/`` shards from row ``first_row`` on (up to ``end_row``), the last shard first.

    A second core's share of one long entry: the process that holds the entry's lock encodes from
    row 0 and, reaching a shard this wrote, loads it instead (``EmbeddingCache._compute`` looks for
    each shard's file when it gets there). Each shard is the same ``compute(lo, hi)`` call on the
    same rows, so the entry is what one process would have made; a shard already there is skipped.
    Two cores can also each write a disjoint range (``--tail-from 0 --tail-to 4096`` beside
    ``--tail-from 4096``), and a final ``encode`` then only gathers the shards.
    """
    from embedtune.encoders.cache import cache_key
    from embedtune.io import atomic_save_npy

    if first_row % shard_size or (end_row is not None and end_row % shard_size and end_row < len(ids)):
        raise SystemExit(f"--tail-from and --tail-to must be multiples of the cache's shard size ({shard_size})")
    end_row = len(ids) if end_row is None else min(end_row, len(ids))
    key = cache_key(parts)
    if cache.load(key, expected_ids=ids, remove_bad=False) is not None:
        return
    partial = cache.entry(key) / "partial"
    partial.mkdir(parents=True, exist_ok=True)
    for lo in reversed(range(first_row, end_row, shard_size)):
        hi = min(lo + shard_size, len(ids))
        path = partial / f"{lo:010d}-{hi:010d}.npy"
        if not path.is_file():
            atomic_save_npy(path, np.ascontiguousarray(compute(lo, hi), dtype=np.float32))
        print(json.dumps({"shard": [lo, hi], "written": str(path)}), flush=True)


def _saved_scores(path: str, args: argparse.Namespace) -> dict:
    """A ``quality --scores-out`` file, refused unless it holds the same model, data and batch size
    as this run (scores of another recipe are not a pairing, and must not be merged into one file)."""
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"{path}: cannot read it as JSON ({error}). Fix: pass a file written by quality --scores-out.")
    if not isinstance(saved.get("backends"), dict):
        raise SystemExit(f"{path}: no field 'backends'. Fix: pass a file written by quality --scores-out.")
    for field in ("model", "data", "batch_size"):
        if saved.get(field) != getattr(args, field):
            raise SystemExit(f"{path}: field {field!r} is {saved.get(field)!r}, this run's is {getattr(args, field)!r}. "
                             "Fix: pass the scores of the same --model, --data and --batch-size, or another file.")
    for backend, entry in saved["backends"].items():
        if not np.isfinite(np.fromiter(entry["per_query"].values(), dtype=float)).all():
            raise SystemExit(f"{path}: backend {backend!r} has a non-finite per-query score. Fix: score it again with --scores-out.")
    return saved


def _write_scores(path: str, args: argparse.Namespace, backend: str, aggregate: float, per_query: dict, encoder: dict) -> None:
    from embedtune.io import atomic_write_json

    target = Path(path)
    saved = _saved_scores(path, args) if target.is_file() else {"model": args.model, "data": args.data, "batch_size": args.batch_size,
                                                                 "backends": {}}
    saved["backends"][backend] = {"ndcg@10": aggregate, "written": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
                                  "encoder": encoder, "per_query": per_query}
    atomic_write_json(target, saved)


def quality(args: argparse.Namespace) -> None:
    from embedtune.runtime import set_threads
    from embedtune.workflows.significance import paired_test

    set_threads(args.threads[0])
    saved = _saved_scores(args.reference_scores, args)["backends"] if args.reference_scores else {}
    # torch is the reference where it is at hand (encoded here or in the scores file); otherwise the
    # first backend named, so that int8 can still be paired with fp32 ONNX when torch's vectors are gone.
    named = [*dict.fromkeys(args.backends), *[b for b in saved if b not in args.backends]]
    reference = "torch" if "torch" in named else named[0]
    backends = [reference, *[b for b in named if b != reference]]
    print(f"{platform.node()}, {os.cpu_count()} cores, {args.threads[0]} thread(s), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"{args.model} on {args.data}, all test queries, batch {args.batch_size}", flush=True)
    per_query, docs = {}, {}
    for backend in backends:  # each row is printed as soon as its backend is done (a long run can be cut short)
        label = backend
        if backend in args.backends:
            start = time.perf_counter()
            experiment = _load(args, backend)
            scored = experiment.evaluate("all")
            per_query[backend] = {qid: values["ndcg@10"] for qid, values in scored.per_query.items()}
            docs[backend] = np.asarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
            print(json.dumps({"backend": backend, "ndcg@10": scored.aggregate["ndcg@10"], "n_queries": len(per_query[backend]),
                              "seconds": time.perf_counter() - start, "cache_hits": experiment.embeddings.cache_hits,
                              "encode_seconds": experiment.embeddings.timings}), flush=True)
            if args.scores_out:
                _write_scores(args.scores_out, args, backend, scored.aggregate["ndcg@10"], per_query[backend],
                              experiment.embeddings.model)
        else:
            per_query[backend] = saved[backend]["per_query"]
            label = f"{backend} (scores of {saved[backend]['written']})"
        qids = sorted(per_query[reference])
        if sorted(per_query[backend]) != qids:
            raise SystemExit(f"{backend} was scored on other queries than {reference}: the two cannot be paired.")
        base = np.array([per_query[reference][q] for q in qids])
        scores = np.array([per_query[backend][q] for q in qids])
        if backend == reference:
            print(f"| backend | nDCG@10 | Δ vs {reference} | paired p | 95 % CI | doc vectors vs {reference}: max abs diff | cosine mean / min |",
                  flush=True)
            print("|---|---|---|---|---|---|---|")
            print(f"| {label} | {scores.mean():.4f} | | | | | |", flush=True)
            continue
        test = paired_test(scores, base)
        moved = "not at hand | not at hand"
        if backend in docs and reference in docs:
            sims = (docs[backend] * docs[reference]).sum(1)
            moved = f"{np.abs(docs[backend] - docs[reference]).max():.2e} | {sims.mean():.4f} / {sims.min():.4f}"
        print(f"| {label} | {scores.mean():.4f} | {scores.mean() - base.mean():+.4f} | {test.p_value:.3g} | "
              f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}] | {moved} |", flush=True)
    if reference != "onnx" and "onnx" in per_query and "onnx-int8" in per_query:
        qids = sorted(per_query[reference])
        test = paired_test(np.array([per_query["onnx-int8"][q] for q in qids]), np.array([per_query["onnx"][q] for q in qids]))
        print(f"onnx-int8 - onnx: {test.mean_difference:+.4f} (p {test.p_value:.3g}, {len(qids)} queries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["speed", "quality", "encode", "_worker"])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default=None, help="speed: a BEIR folder (default: the shared SciFact); quality: default 'scifact'")
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--kinds", nargs="+", default=["document", "query"], choices=["document", "query"],
                        help="encode: which entries to fill (default both)")
    parser.add_argument("--tail-from", type=int, default=None,
                        help="encode: write only the partial shards from this row on (last first), for a second core to share one entry")
    parser.add_argument("--tail-to", type=int, default=None, help="encode, with --tail-from: stop before this row")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--scores-out", default=None,
                        help="quality: write each backend's per-query nDCG@10 to this JSON file (merged into it if it exists)")
    parser.add_argument("--reference-scores", default=None,
                        help="quality: per-query scores from an earlier --scores-out of the same model, data and batch size; "
                             "its backends that are not in --backends are paired without being encoded again")
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--vectors-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default="/tmp/embedtune-encode-backends")
    args = parser.parse_args()
    if args.mode == "_worker":
        args.threads = args.threads[0]
        args.data = args.data or SCIFACT
        worker(args)
    elif args.mode == "speed":
        args.data = args.data or SCIFACT
        speed(args)
    else:
        args.data = args.data or "scifact"
        encode(args) if args.mode == "encode" else quality(args)


if __name__ == "__main__":
    main()
