"""In-RAM peers on real vectors: nDCG@10 of ScaNN AH and extended RaBitQ at 16-64 B per vector, as a share of float32.

The frozen all-MiniLM-L6-v2 vectors of SciFact bundled with embedtune (``scifact-minilm-vectors.npz``:
5,183 documents, 1,109 queries, 384-d, unit norm) are searched with every peer of
``benchmarks/in_ram_peers.py`` at each budget, and scored on the 300 SciFact test queries
(``qrels/test.tsv``) with pytrec_eval's nDCG@10, as BEIR does: a retrieved document whose id equals the
query id is ignored (11 rows are fetched, the query's own id dropped, the first 10 kept), and the hits
are scored by rank so that ties in a peer's estimates keep the order the peer returned. The reference
is exact float32 inner-product search of the same vectors (the same rule). ``overlap@10`` is the share
of exact search's 10 hits that the peer also returns. Fit seconds include all training; queries/s is
the best of three batch searches of the 300 queries, one thread. ``B/vec`` is the codec's bytes per
vector (compared with the budget), ``held`` what the installed library keeps per vector (see
``in_ram_peers.py``), ``fixed`` the bytes that do not grow with the corpus. RaBitQ draws its random
rotation itself, so its row is one build, followed by the mean ± sd of nDCG@10 over ``--rabitq-builds``
builds (the first included); ScaNN's training is deterministic.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/in_ram_peers_check.py [--budgets 16 32 48 64] [--measure-ram]

``--measure-ram`` also measures, for each peer and budget, the RSS a searcher adds per vector (100,000
and 200,000 random unit vectors at the same ``d``, each built in a fresh process without transparent
huge pages, ScaNN trained on 20,000 of them for 2 iterations, the float input freed and
``malloc_trim`` called before reading RSS) and prints it next to ``held``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import datetime as _dt  # noqa: E402
import gc  # noqa: E402
import importlib.metadata as _md  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import in_ram_peers as peers  # noqa: E402

ROOT = HERE.parent
VECTORS = ROOT / "src/embedtune/datasets/scifact-minilm-vectors.npz"
QRELS = ROOT.parent / "shared/data/beir/scifact/qrels/test.tsv"


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path) as f:
        next(f)  # header
        for line in f:
            if line.strip():
                qid, did, score = line.rstrip("\n").split("\t")
                qrels.setdefault(qid, {})[did] = int(score)
    return qrels


def ranked_ids(I: np.ndarray, doc_ids: np.ndarray, query_ids: list[str], k: int = 10) -> list[list[str]]:
    """Top-k document ids per query, dropping a document whose id equals the query id (BEIR rule)."""
    out = []
    for qid, row in zip(query_ids, I):
        ids = [str(doc_ids[j]) for j in row if j >= 0 and str(doc_ids[j]) != qid]
        out.append(ids[:k])
    return out


def ndcg10(qrels: dict[str, dict[str, int]], query_ids: list[str], ranked: list[list[str]]) -> float:
    import pytrec_eval

    # Score by rank so pytrec_eval keeps the peer's order (it re-sorts by score and breaks ties by id).
    run = {qid: ({did: float(len(ids) - r) for r, did in enumerate(ids)} or {"__none__": 0.0})
           for qid, ids in zip(query_ids, ranked)}
    judged = {qid: qrels[qid] for qid in query_ids}
    result = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10"}).evaluate(run)
    return float(np.mean([result[qid]["ndcg_cut_10"] for qid in query_ids]))


def timed_search(index, xq: np.ndarray, k: int, repeats: int = 3) -> tuple[np.ndarray, np.ndarray, float]:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        D, I = index.search(xq, k)
        best = min(best, time.perf_counter() - start)
    return D, I, len(xq) / best


class _Exact:
    def __init__(self, xb: np.ndarray):
        self.xb = xb

    def search(self, xq: np.ndarray, k: int):
        return peers.exact_search(self.xb, xq, k)


# --------------------------------------------------------------------------- RSS per vector (--measure-ram)

def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _rss_child(name: str, budget: int, d: int, n: int) -> None:
    """Print the RSS one searcher of ``n`` random unit vectors holds (run in a fresh process)."""
    # No transparent huge pages in this process: a library that madvises them would move RSS in 2 MiB steps.
    ctypes.CDLL("libc.so.6").prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((n, d), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[:4].copy()
    input_bytes = xb.nbytes
    base = _rss()
    kw = {"training_iterations": 2, "training_sample_size": 20_000} if name.startswith("scann") else {}
    index = peers.PEERS[name](xb, budget, 0, **kw)
    index.search(xq, 10)
    del xb
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(_rss() - base + input_bytes)


def measured_held_bytes(name: str, budget: int, d: int, sizes: tuple[int, int] = (100_000, 200_000)) -> float:
    held = []
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--rss-child", name, str(budget), str(d), str(n)],
                             capture_output=True, text=True, check=True)
        held.append(int(out.stdout.strip().splitlines()[-1]))
    return (held[1] - held[0]) / (sizes[1] - sizes[0])


# --------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=Path, default=VECTORS)
    parser.add_argument("--qrels", type=Path, default=QRELS)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 48, 64])
    parser.add_argument("--peers", nargs="+", default=list(peers.PEERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measure-ram", action="store_true", help="also measure RSS per vector (slow)")
    parser.add_argument("--rabitq-builds", type=int, default=5,
                        help="RaBitQ's rotation is unseeded: also report mean ± sd of nDCG@10 over this many builds")
    parser.add_argument("--rss-child", nargs=4, metavar=("PEER", "BUDGET", "D", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        name, budget, d, n = args.rss_child
        _rss_child(name, int(budget), int(d), int(n))
        return

    data = np.load(args.vectors)
    xb = np.ascontiguousarray(data["document"], dtype=np.float32)
    doc_ids = data["document_ids"]
    qrels = load_qrels(args.qrels)
    row = {str(q): i for i, q in enumerate(data["query_ids"])}
    query_ids = [q for q in sorted(qrels, key=lambda s: int(s) if s.isdigit() else s) if q in row]
    missing = [q for q in qrels if q not in row]
    xq = np.ascontiguousarray(data["query"][[row[q] for q in query_ids]], dtype=np.float32)
    n, d = xb.shape

    versions = []
    for package in ("scann", "rabitqlib", "numpy", "pytrec-eval-terrier"):
        try:
            versions.append(f"{package} {_md.version(package)}")
        except _md.PackageNotFoundError:
            versions.append(f"{package} not installed")
    print(f"# In-RAM peers on {args.vectors.name}: {n} documents, {d}-d; {len(query_ids)} SciFact test queries"
          + (f" ({len(missing)} without a vector, skipped)" if missing else ""))
    print(f"# {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {'; '.join(versions)}; Python {platform.python_version()}; "
          f"{platform.machine()}, {os.cpu_count()} CPUs; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")

    _, I_exact, qps_exact = timed_search(_Exact(xb), xq, 11)
    exact_ranked = ranked_ids(I_exact, doc_ids, query_ids)
    reference = ndcg10(qrels, query_ids, exact_ranked)
    print(f"\nexact float32: nDCG@10 {reference:.4f}, {4 * d} B per vector, {qps_exact:,.0f} queries/s (numpy matmul)\n")

    header = "| budget | peer | config | B/vec | held B/vec | fixed B | nDCG@10 | share of float32 | overlap@10 | fit s | queries/s |"
    if args.measure_ram:
        header += " measured held B/vec |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    skipped = []
    for budget in args.budgets:
        for name in args.peers:
            try:
                index = peers.PEERS[name](xb, budget, args.seed)
            except ImportError as why:
                skipped.append((budget, name, f"not installed ({why})"))
                continue
            if index is None:
                skipped.append((budget, name, peers.infeasible_reason(name, d, budget)))
                continue
            _, I, qps = timed_search(index, xq, 11)
            ranked = ranked_ids(I, doc_ids, query_ids)
            score = ndcg10(qrels, query_ids, ranked)
            spread = ""
            if name == "rabitq-ext" and args.rabitq_builds > 1:
                # RaBitQ draws its rotation itself (no seed from Python): score more builds, report mean ± sd.
                scores = [score]
                for _ in range(args.rabitq_builds - 1):
                    _, I_more = peers.PEERS[name](xb, budget, args.seed).search(xq, 11)
                    scores.append(ndcg10(qrels, query_ids, ranked_ids(I_more, doc_ids, query_ids)))
                spread = f" (mean {np.mean(scores):.4f} ± {np.std(scores, ddof=1):.4f} over {len(scores)} builds)"
            overlap = np.mean([len(set(a) & set(b)) / max(len(b), 1) for a, b in zip(ranked, exact_ranked)])
            p = index.params
            config = (f"nbits={p['nbits']} (code {p['code_bytes']} + factors {p['factor_bytes']} B)" if name == "rabitq-ext"
                      else f"{p['hash_type']}, {p['blocks']} blocks of {p['dims_per_block']} dims"
                      + (f" + int8 reorder of {p['reorder_candidates']}" if p.get("reorder_candidates") else ""))
            line = (f"| {budget} | {name} | {config} | {index.ram_bytes} | {index.held_bytes} | {index.fixed_bytes:,} | "
                    f"{score:.4f}{spread} | {score / reference:.1%} | {overlap:.3f} | {index.fit_s:.2f} | {qps:,.0f} |")
            if args.measure_ram:
                line += f" {measured_held_bytes(name, budget, d):.1f} |"
            print(line, flush=True)
            del index
    if skipped:
        print("\nNot built (the peer cannot hold a code of that budget):")
        for budget, name, why in skipped:
            print(f"- {budget} B, {name}: {why}")


if __name__ == "__main__":
    main()
