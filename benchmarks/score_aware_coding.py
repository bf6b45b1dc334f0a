"""Score-aware (anisotropic) choice of ``klt-wpq``'s codes: same codebooks, same served index, other codes.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/score_aware_coding.py --data scifact --budgets 16 32 48

``klt-wpq:B`` codes ``y = x S^{1/2}`` with a product quantiser: each sub-quantiser's nearest codeword, which
minimises ``||y - ŷ||²`` (the S-weighted score error averaged over all queries). The queries that rank a
document near the top, though, are those nearly parallel to it, and their score error is dominated by the
residual's component along the document. Under a Gaussian query model with second moment ``S`` conditioned
on a large score ``q · x``, the expected squared score error is

    ||r_y||² + (η − 1) (u · r_y)²,    u = y / ||y||,  r_y = y − ŷ,

ScaNN's anisotropic loss, in ``y``. Its parallel term couples the sub-quantisers (a codeword in one sub-space
changes the parallel residual that the others should cancel), so the codes are chosen by iterated conditional
modes (ICM): start from the PQ codes, then per sub-quantiser take the codeword that minimises the loss given the
others, a few sweeps. With η = 1 the loss is separable and the PQ codes are already optimal (ICM changes nothing;
``tests/test_anisotropic_codec.py`` checks it). The codebooks, the served ``IndexResidualQuantizer`` and its search stay klt-wpq's; only the
codes added with ``add_sa_codes`` change.

Variants: ``kept`` (the loss on the kept axes only) and ``full`` (the parallel residual also counts the left-out
axes' part, centred by its mean over the fit sample). Every document is encoded by tables fitted on the other half
of the corpus (``near_limit.cross_fitted``); η is chosen per corpus and budget by the label-free agreement (held-out
documents as queries), never by the test qrels, and every η's test figures are printed for the record. The codec
this led to is ``klt-apq`` (:mod:`embedtune.index.codecs.anisotropic`: ``full``, η = 8).

Also, for the record (neither won): ``--refit-etas`` re-fits the PQ codewords under the anisotropic loss on the fit
half (ScaNN-style alternation), and ``--rq-beams`` codes the same weighted kept axes with a FAISS residual quantiser
(beam search, then ICM). Figures: ``benchmarks/results/score-aware/REPORT.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from near_limit import Searcher, halves, load, score  # noqa: E402

from embedtune.index.codecs.anisotropic import anisotropic_codes, anisotropic_loss  # noqa: E402
from embedtune.index.codecs.transform import training_sample  # noqa: E402
from embedtune.index.codecs.weighted import KltWeightedPQ, score_weighting  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402

HERE = Path(__file__).resolve().parent
ETAS = (1.0, 2.0, 4.0, 8.0, 16.0)


def losses(yk: np.ndarray, decoded: np.ndarray, u: np.ndarray, p0: np.ndarray, eta: float) -> tuple[float, float]:
    """(mean ||yk − ŷ||², mean anisotropic loss) over the rows."""
    return float(((yk - decoded) ** 2).sum(1).mean()), float(anisotropic_loss(yk, decoded, u, p0, eta).mean())


class Half:
    """One half's klt-wpq tables (fitted on the other half) and its documents' y-space coordinates."""

    def __init__(self, docs: np.ndarray, rows: np.ndarray, fit_rows: np.ndarray, budget: int) -> None:
        import faiss

        codec = KltWeightedPQ(budget)
        start = time.perf_counter()
        self.index = codec.train(docs[fit_rows])
        self.fit_s = time.perf_counter() - start
        self.rows = rows
        enc = self.index.encoder
        lt = faiss.downcast_VectorTransform(enc.chain.at(0))
        to_kept = faiss.vector_to_array(lt.A).reshape(lt.d_out, lt.d_in).astype(np.float64)  # kept · S^{1/2}
        pq = faiss.downcast_index(enc.index).pq
        self.centroids = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub).astype(np.float64)
        x = docs[rows].astype(np.float64)
        self.yk = x @ to_kept.T
        self.codes0 = self.index.sa_encode(docs[rows])
        # The full y (S^{1/2} as klt-wpq fits it) for the left-out axes' part of the parallel residual.
        root, self.inverse_root = score_weighting(training_sample(docs[fit_rows], seed=0))
        self.to_kept = to_kept
        self.fit_yk = docs[fit_rows].astype(np.float64) @ to_kept.T
        fit_x = training_sample(docs[fit_rows], seed=0).astype(np.float64)
        fit_y = fit_x @ root
        kept = to_kept @ np.linalg.inv(root)  # (r, d) orthonormal rows
        drop_mean = (fit_y - (fit_y @ kept.T) @ kept).mean(0)
        self.root, self.kept, self.drop_mean = root, kept, drop_mean
        _, self.u_full, self.p0_full = self.terms(x)
        self.u_kept = self.yk / np.linalg.norm(self.yk, axis=1)[:, None]
        self.p0_kept = np.zeros(len(rows))

    def terms(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(y on the kept axes, u on the kept axes, the parallel residual outside them) of ``x``'s rows (the ``full`` variant)."""
        y = np.asarray(x, dtype=np.float64) @ self.root
        yk = y @ self.kept.T
        norm = np.linalg.norm(y, axis=1)
        return yk, yk / norm[:, None], ((norm ** 2 - (yk ** 2).sum(1)) - y @ self.drop_mean) / norm

    def refit(self, fit_x: np.ndarray, eta: float, rounds: int = 3) -> np.ndarray:
        """Codewords re-fitted under the anisotropic loss on the fit rows (ScaNN-style): alternately the codes (ICM) and, per
        sub-quantiser, each codeword's closed form ``(Σ I + λ u uᵀ)⁻¹ Σ (y_j + λ u_j s)`` given the others; returns the new
        (M, K, dsub) centroids (empty codewords keep theirs)."""
        yk, u, p0 = self.terms(fit_x)
        cent = self.centroids.copy()
        m, k, dsub = cent.shape
        lam = eta - 1.0
        rows = np.arange(len(yk))
        for _ in range(rounds):
            plain = np.stack([((yk[:, j * dsub:(j + 1) * dsub, None] - cent[j].T[None]) ** 2).sum(1).argmin(1) for j in range(m)], 1)
            codes = anisotropic_codes(yk, cent, plain.astype(np.uint8), u, p0, eta).astype(np.int64)
            decoded = np.concatenate([cent[j][codes[:, j]] for j in range(m)], axis=1)
            parallel = np.einsum("nr,nr->n", u, yk - decoded) + p0
            for j in range(m):
                sub = slice(j * dsub, (j + 1) * dsub)
                uj, yj = u[:, sub], yk[:, sub]
                rest = parallel + np.einsum("nr,nr->n", uj, cent[j][codes[:, j]])  # without codeword j
                a = np.zeros((k, dsub, dsub))
                np.add.at(a, codes[:, j], np.eye(dsub)[None] + lam * uj[:, :, None] * uj[:, None, :])
                rhs = np.zeros((k, dsub))
                np.add.at(rhs, codes[:, j], yj + lam * uj * rest[:, None])
                used = np.bincount(codes[:, j], minlength=k) > 0
                cent[j][used] = np.linalg.solve(a[used], rhs[used][:, :, None])[:, :, 0]
                parallel = rest - np.einsum("nr,nr->n", uj, cent[j][codes[:, j]])
        return cent

    def padded(self, centroids: np.ndarray) -> np.ndarray:
        """PQ codewords as full-width (M, K, r) additive codebooks (zero outside their sub-space)."""
        m, k, dsub = centroids.shape
        out = np.zeros((m, k, m * dsub))
        for j in range(m):
            out[j, :, j * dsub:(j + 1) * dsub] = centroids[j]
        return out

    def decode_y(self, codes: np.ndarray) -> np.ndarray:
        m = self.centroids.shape[0]
        return np.concatenate([self.centroids[j][codes[:, j]] for j in range(m)], axis=1)

    def searcher_part(self, codes: np.ndarray):
        search_index = self.index.clone_empty().search_index
        search_index.add_sa_codes(np.ascontiguousarray(codes, dtype=np.uint8))
        return search_index


def additive_codes(yk: np.ndarray, codebooks: np.ndarray, codes: np.ndarray, u: np.ndarray, p0: np.ndarray, eta: float,
                   sweeps: int = 4) -> np.ndarray:
    """ICM over full-width (additive) codebooks ``(M, K, r)``: per stage, the codeword minimising
    ``||yk − ŷ||² + (η − 1)(u · (yk − ŷ) + p0)²`` given the others'. With η = 1, plain squared error."""
    codes = codes.copy()
    m = codebooks.shape[0]
    rows = np.arange(len(codes))
    cb = codebooks.astype(np.float64)
    sq = (cb ** 2).sum(2)
    residual = yk - sum(cb[j][codes[:, j]] for j in range(m))
    parallel = np.einsum("nr,nr->n", u, residual) + p0
    for _ in range(sweeps):
        changed = 0
        for j in range(m):
            rest = residual + cb[j][codes[:, j]]
            prest = parallel + np.einsum("nr,nr->n", u, cb[j][codes[:, j]])
            proj = u @ cb[j].T
            loss = sq[j][None, :] - 2 * rest @ cb[j].T + (eta - 1) * (prest[:, None] - proj) ** 2
            best = loss.argmin(1)
            changed += int((best != codes[:, j]).sum())
            codes[:, j] = best
            residual = rest - cb[j][best]
            parallel = prest - proj[rows, best]
        if not changed:
            break
    return codes


def rq_part(half: "Half", budget: int, train_beam: int) -> tuple[Any, np.ndarray]:
    """A residual quantiser of ``budget`` 8-bit stages on the half's kept ``y`` axes (klt-wpq's), fitted on the other half."""
    import faiss

    r = half.yk.shape[1]
    rq = faiss.ResidualQuantizer(r, budget, 8)
    rq.max_beam_size = train_beam
    rq.train(np.ascontiguousarray(half.fit_yk, dtype=np.float32))
    codebooks = faiss.vector_to_array(rq.codebooks).reshape(budget, 256, r)
    return rq, codebooks


def rq_search_index(half: "Half", codebooks: np.ndarray, codes: np.ndarray) -> Any:
    """The additive quantiser in the original space whose codeword ``c`` (in kept y) is ``c · kept · S^{-1/2}``."""
    import faiss

    m, k, r = codebooks.shape
    mapped = codebooks.reshape(m * k, r).astype(np.float64) @ half.to_kept @ half.inverse_root @ half.inverse_root
    d = mapped.shape[1]
    index = faiss.IndexResidualQuantizer(d, m, 8, faiss.METRIC_INNER_PRODUCT, faiss.AdditiveQuantizer.ST_LUT_nonorm)
    faiss.copy_array_to_vector(np.ascontiguousarray(mapped, dtype=np.float32).ravel(), index.rq.codebooks)
    index.rq.is_trained = True
    index.is_trained = True
    index.add_sa_codes(np.ascontiguousarray(codes, dtype=np.uint8))
    return index


def cross_searcher(ds: dict[str, Any], parts: list[tuple[Half, np.ndarray]], budget: int, indexes: list[Any] | None = None) -> Searcher:
    """``near_limit.cross_fitted``'s merge, over two halves whose codes are given (searched by klt-wpq's index, or ``indexes``)."""
    docs = ds["docs"]
    decoded = np.zeros_like(docs)
    built = []
    for i, (half, codes) in enumerate(parts):
        index = half.searcher_part(codes) if indexes is None else indexes[i]
        rec = index.sa_decode(np.ascontiguousarray(codes, dtype=np.uint8))
        decoded[half.rows] = rec
        offset = (docs[half.rows] - rec).mean(axis=0).astype(np.float32)
        built.append((half.rows, index, offset))

    def search(xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = [], []
        for rows, index, offset in built:
            D, I = index.search(np.ascontiguousarray(xq, dtype=np.float32), min(k, len(rows)))
            valid = I >= 0
            scores.append(np.where(valid, D + (xq @ offset)[:, None], -np.inf))
            ids.append(np.where(valid, rows[np.clip(I, 0, None)], -1))
        D, I = np.hstack(scores), np.hstack(ids)
        order = np.argsort(-D, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(D, order, 1).astype(np.float32), np.take_along_axis(I, order, 1)

    return Searcher(search, budget, 0, sum(h.fit_s for h, _ in parts), decoded)


def run(data: str, model: str, budgets: list[int], etas: list[float], variants: list[str], out: Path | None,
        rq_beams: list[int] | None = None, rq_eta: float = 8.0, refit_etas: list[float] | None = None) -> list[dict[str, Any]]:
    ds = load(data, model)
    docs = ds["docs"]
    base = json.loads((HERE / "results" / "near-limit" / f"{data}-{model}" / "frozen__float32.json").read_text())["ndcg@10"]
    rows_out: list[dict[str, Any]] = []
    a, b = halves(len(docs))
    for budget in budgets:
        t0 = time.perf_counter()
        parts = [Half(docs, a, b, budget), Half(docs, b, a, budget)]
        ref_q: list[np.ndarray] = []

        def record(name: str, variant: str, eta: float, coded: list[tuple[Half, np.ndarray]], decode: Any, u_of: Any,
                   encode_s: float, indexes: list[Any] | None = None) -> None:
            """Score one setting's codes; ``decode(half, codes)`` gives ŷ on the kept axes, ``u_of(half)`` the parallel terms."""
            loss_before = loss_after = mse_before = mse_after = 0.0
            for half, codes in coded:
                u, p0 = u_of(half)
                m0, l0 = losses(half.yk, half.decode_y(half.codes0), u, p0, eta)
                m1, l1 = losses(half.yk, decode(half, codes), u, p0, eta)
                w = len(half.rows) / len(docs)
                loss_before += w * l0; loss_after += w * l1; mse_before += w * m0; mse_after += w * m1
            row = score(ds, cross_searcher(ds, coded, budget, indexes), 8 * budget)
            q = np.array([row["per_query"][k] for k in ds["query_ids"] if k in row["per_query"]])
            rec = {"data": data, "model": model, "budget": budget, "setting": name, "variant": variant, "eta": eta,
                   "ndcg@10": row["ndcg@10"], "share": row["ndcg@10"] / base, "agreement": row["agreement"],
                   "gap_db": row["gap_db"], "score_error": row["score_error"], "y_mse_pq": mse_before, "y_mse": mse_after,
                   "aniso_loss_pq": loss_before, "aniso_loss": loss_after, "encode_s": encode_s, "per_query": row["per_query"]}
            if not ref_q:
                ref_q.append(q)
            else:
                t = paired_test(q, ref_q[0])
                rec.update(delta=t.mean_difference, p=t.p_value)
            rows_out.append(rec)
            print(f"{data:8s} {budget:3d}B {name:24s} share {100 * rec['share']:5.1f}%  nDCG {rec['ndcg@10']:.4f}  "
                  f"agree {rec['agreement']:.3f}  Δ {rec.get('delta', 0):+.4f} p {rec.get('p', float('nan')):.3f}  "
                  f"yMSE {mse_after:.4g} (pq {mse_before:.4g})  aniso {loss_after:.4g} (pq {loss_before:.4g})  "
                  f"gap {rec['gap_db']:.2f} dB  enc {encode_s:.1f}s", flush=True)

        def terms(variant: str):
            return (lambda h: (h.u_full, h.p0_full)) if variant == "full" else (lambda h: (h.u_kept, h.p0_kept))

        pq_decode = lambda half, codes: half.decode_y(codes)  # noqa: E731
        for variant in variants:
            for eta in etas:
                if eta == 1.0 and variant != variants[0]:
                    continue
                start = time.perf_counter()
                coded = [(half, anisotropic_codes(half.yk, half.centroids, half.codes0, *terms(variant)(half), eta)) for half in parts]
                record("klt-wpq" if eta == 1.0 else f"aniso-{variant} η={eta:g}", variant, eta, coded, pq_decode, terms(variant),
                       time.perf_counter() - start)
        # Codebooks re-fitted under the anisotropic loss on the other half, then anisotropic codes with them.
        for eta in refit_etas or []:
            start = time.perf_counter()
            coded, indexes, books_of = [], [], {}
            for half, fit_rows in zip(parts, (b, a)):
                cent = half.refit(docs[fit_rows], eta)
                plain = np.stack([((half.yk[:, j * cent.shape[2]:(j + 1) * cent.shape[2], None] - cent[j].T[None]) ** 2).sum(1).argmin(1)
                                  for j in range(cent.shape[0])], 1).astype(np.uint8)
                codes = anisotropic_codes(half.yk, cent, plain, half.u_full, half.p0_full, eta)
                books = half.padded(cent)
                books_of[id(half)] = books
                coded.append((half, codes))
                indexes.append(rq_search_index(half, books, codes))
            record(f"refit + aniso η={eta:g}", "full", eta, coded,
                   lambda h, c: sum(books_of[id(h)][j][c[:, j]] for j in range(c.shape[1])), terms("full"),
                   time.perf_counter() - start, indexes)
        # Residual quantisation on the same weighted, kept axes: beam search, then ICM (plain, then anisotropic).
        for train_beam in ([5] if rq_beams else []):  # FAISS's default training beam
            fitted = []
            start = time.perf_counter()
            for half in parts:
                fitted.append(rq_part(half, budget, train_beam))
            fit_s = time.perf_counter() - start
            print(f"  [wrq{budget}: fitted in {fit_s:.0f} s]", flush=True)
            for beam in rq_beams or []:
                start = time.perf_counter()
                beamed = []
                for half, (rq, _) in zip(parts, fitted):
                    rq.max_beam_size = beam
                    beamed.append(faiss_codes(rq, half.yk))
                beam_s = time.perf_counter() - start
                for label, eta, sweeps in ((f"wrq beam {beam}", 1.0, 0), (f"wrq beam {beam} + icm", 1.0 + 1e-12, 4),
                                           (f"wrq beam {beam} + aniso η={rq_eta:g}", rq_eta, 4)):
                    start = time.perf_counter()
                    coded, indexes = [], []
                    for half, (_, books), codes in zip(parts, fitted, beamed):
                        if sweeps:
                            codes = additive_codes(half.yk, books, codes, half.u_full, half.p0_full, eta, sweeps)
                        coded.append((half, codes))
                        indexes.append(rq_search_index(half, books, codes))
                    books_of = {id(h): bk for h, (_, bk) in zip(parts, fitted)}
                    record(label, "full", eta, coded, lambda h, c: sum(books_of[id(h)][j][c[:, j]] for j in range(c.shape[1])),
                           terms("full"), beam_s + time.perf_counter() - start, indexes)
        print(f"  [{budget} B: {time.perf_counter() - t0:.0f} s]", flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows_out, indent=1))
    return rows_out


def faiss_codes(rq: Any, yk: np.ndarray) -> np.ndarray:
    """The residual quantiser's codes of ``yk`` (8-bit stages: one byte each, the code's own layout)."""
    return rq.compute_codes(np.ascontiguousarray(yk, dtype=np.float32))


def table(paths: list[Path]) -> str:
    """A markdown table of saved rows: share of float32 nDCG@10, agreement, Δ against klt-wpq (p), dB to the bound."""
    lines = ["| corpus | B | setting | share | agreement | Δ nDCG@10 vs klt-wpq (p) | dB to bound | y MSE | its loss (klt-wpq codes') |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        rows = json.loads(Path(path).read_text())
        best = {}
        for r in rows:
            if r["setting"].startswith("aniso-"):
                key = r["budget"]
                if key not in best or r["agreement"] > best[key]["agreement"]:
                    best[key] = r
        for r in rows:
            mark = " **(agreement's pick)**" if best.get(r["budget"]) is r else ""
            delta = "–" if "delta" not in r else f"{r['delta']:+.4f} ({r['p']:.3f})"
            lines.append(f"| {r['data']}-{r['model']} | {r['budget']} | {r['setting']}{mark} | {100 * r['share']:.1f} % | "
                         f"{r['agreement']:.3f} | {delta} | {r['gap_db']:.2f} | {r['y_mse']:.3g} | {r['aniso_loss']:.3g} ({r['aniso_loss_pq']:.3g}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 48])
    parser.add_argument("--etas", type=float, nargs="+", default=list(ETAS))
    parser.add_argument("--variants", nargs="+", default=["kept", "full"], choices=["kept", "full"])
    parser.add_argument("--rq-beams", type=int, nargs="*", default=[],
                        help="also residual quantisation on the same weighted kept axes (trained with beam 5), encoded with these beams")
    parser.add_argument("--refit-etas", type=float, nargs="*", default=[],
                        help="also re-fit the PQ codewords under the anisotropic loss at these η (ScaNN-style), then code with them")
    parser.add_argument("--out", type=Path, help="write the rows (JSON) here after each budget")
    parser.add_argument("--table", type=Path, nargs="+", help="print the markdown table of these saved rows and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    set_threads(1)
    run(args.data, args.model, args.budgets, args.etas, args.variants, args.out, args.rq_beams, refit_etas=args.refit_etas)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
