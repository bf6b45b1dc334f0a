"""DIVE's unsupervised training algorithm (``mode="unsupervised"``): corpus embeddings only.

``L = L_rank + λ·L_view + γ·L_geo (+ w·L_rank^pq)``, with neighbour-rank distillation on the
corpus in place of the triplet term; with ``pseudo_query_weight`` w > 0 the training documents'
pseudo-queries (titles, first sentences: query-like text, no label) are anchors too, each
distilling how the frozen space ranks the training documents for it. The better of the two PCA
starts is trained, and the start or epoch with the
best held-out selection signal is kept: the lowest rank KL to the frozen space, or with
``selection_signal='pseudo-queries'`` the highest nDCG@10 of the held-out documents'
pseudo-queries (see :mod:`embedtune.compress.dive`).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from embedtune.compress.base import PseudoQueries, TrainingData
from embedtune.compress.dive.config import DIVEConfig
from embedtune.compress.dive.network import DIVEAdapter, nearest_neighbors, unit_float32
from embedtune.compress.losses import geometry_distillation_loss, headwise_ntxent_loss, neighbor_rank_distillation_loss
from embedtune.data.pseudo_queries import PSEUDO_PREFIX
from embedtune.evaluate.search import exact_search
from embedtune.evaluate.significance import paired_test
from embedtune.runtime import progress_bar

logger = logging.getLogger(__package__)  # "embedtune.compress.dive", as before the package split

__all__ = ["UnsupervisedTraining", "holdout_documents", "own_document_gains"]

# The unsupervised mode's held-out signals: neighbour recall@10, the rank KL in chunks of held-out rows, and
# the pseudo-queries' nDCG@10 (scored in chunks of pseudo-queries, so the score matrix stays small on a large corpus).
_RECALL_AT = 10
_KL_CHUNK = 256
_PSEUDO_QUERY_AT = 10
# Below this many pseudo-queries a single query moves the mean nDCG@10 by more than 0.02: the fit warns.
_FEW_PSEUDO_QUERIES = 50


def holdout_documents(n_docs: int, config: DIVEConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(held-out rows, training rows)`` of an ``n_docs`` corpus in the unsupervised mode, both sorted.

    The held-out rows (``holdout_docs``, at most a tenth of the corpus; none unless
    ``epoch_selection='best'``) select the start and the epoch and are never trained on; the
    training rows are the rest, a seeded sample of ``max_train_docs`` on a larger corpus. The
    same ``config`` (its seed) always gives the same rows, so a caller can build the held-out
    documents' pseudo-queries before the fit (:func:`embedtune.workflows.pseudo_queries.build_pseudo_queries`).
    """
    if n_docs < 3:
        raise ValueError(f"DIVE mode='unsupervised' needs at least 3 documents to learn neighbourhoods from; got {n_docs}.")
    order = np.random.default_rng(config.seed).permutation(n_docs)
    n_holdout = min(config.holdout_docs, n_docs // 10) if config.epoch_selection == "best" else 0
    if config.epoch_selection == "best" and n_holdout == 0:
        raise ValueError(
            f"DIVE mode='unsupervised' with epoch_selection='best' holds out a tenth of the corpus (at most holdout_docs) "
            f"to select on, but {n_docs} documents leave none; give at least 10 documents or use epoch_selection='last'."
        )
    fit_rows = order[n_holdout:]
    if config.max_train_docs is not None and len(fit_rows) > config.max_train_docs:
        fit_rows = fit_rows[: config.max_train_docs]  # a seeded sample: the permutation is random
    return np.sort(order[:n_holdout]), np.sort(fit_rows)


def own_document_gains(queries: np.ndarray, documents: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each query's nDCG@10 retrieving its one relevant document, ``documents[targets[i]]``, among every document.

    A tie with another document counts against it, so a transform that maps everything together cannot score well.
    The label-free signal of pseudo-queries (a document's title or first words retrieving that document).
    """
    gains = np.zeros(len(queries), dtype=np.float64)
    for lo in range(0, len(queries), _KL_CHUNK):
        scores = queries[lo : lo + _KL_CHUNK] @ documents.T
        own = scores[np.arange(len(scores)), targets[lo : lo + _KL_CHUNK]][:, None]
        rank = (scores >= own).sum(axis=1) - 1  # 0: first; documents scoring the same are ranked ahead of it
        hit = rank < _PSEUDO_QUERY_AT
        gains[lo : lo + len(scores)][hit] = 1.0 / np.log2(rank[hit] + 2.0)
    return gains


def _held_out_pseudo_queries(
    pseudo: PseudoQueries | None,
    doc_ids: list[str],
    held: np.ndarray,
    setting: str = "selection_signal='pseudo-queries'",
    without: str = "selection_signal='rank-kl'",
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows of pseudo.embeddings, their documents' corpus rows)`` for the pseudo-queries of held-out documents.

    A pseudo-query's id is ``PSEUDO_PREFIX + doc_id`` (:mod:`embedtune.data.pseudo_queries`);
    those of training documents are left out, so selection reads documents the fit never saw.
    ``setting`` names the option that reads them and ``without`` the one that does not, for the errors.
    """
    fix = ("build them for the held-out documents with embedtune.workflows.pseudo_queries.build_pseudo_queries(experiment, "
           "doc_ids=[doc_ids[row] for row in holdout_documents(n_docs, config)[0]], mine=False) and pass "
           "TrainingData(pseudo_queries=...); `compress fit --unsupervised --data CORPUS --model MODEL` does this. Without the "
           f"documents' text, use {without}.")
    if pseudo is None or not pseudo.ids:
        raise ValueError(f"DIVE {setting} scores the held-out documents' pseudo-queries, but none were given: {fix}")
    row_of = {doc_id: row for row, doc_id in enumerate(doc_ids)}
    held_set = set(held.tolist())
    query_rows, doc_rows = [], []
    for query_row, query_id in enumerate(pseudo.ids):
        doc_row = row_of.get(query_id[len(PSEUDO_PREFIX):]) if query_id.startswith(PSEUDO_PREFIX) else None
        if doc_row is not None and doc_row in held_set:
            query_rows.append(query_row)
            doc_rows.append(doc_row)
    if not query_rows:
        raise ValueError(f"DIVE {setting}: none of the {len(pseudo.ids)} pseudo-queries given is of a "
                         f"held-out document (ids '{PSEUDO_PREFIX}<doc id>'), so there is nothing to select on: {fix}")
    return np.asarray(query_rows, dtype=np.int64), np.asarray(doc_rows, dtype=np.int64)


def _training_pseudo_queries(pseudo: PseudoQueries | None, doc_ids: list[str], fit_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows of pseudo.embeddings, their documents' rows in fit_rows)`` for the pseudo-queries of training documents.

    Those of held-out documents are left out: selection reads documents the fit never saw, through their text either.
    """
    fix = ("build them with embedtune.workflows.pseudo_queries.build_pseudo_queries(experiment, mine=False) and pass "
           "TrainingData(pseudo_queries=...), or set pseudo_query_weight=0.")
    if pseudo is None or not pseudo.ids:
        raise ValueError(f"DIVE mode='unsupervised' with pseudo_query_weight > 0 distils the training documents' pseudo-queries' "
                         f"rankings, but none were given: {fix}")
    row_of = {doc_id: row for row, doc_id in enumerate(doc_ids)}
    local = {int(row): i for i, row in enumerate(fit_rows)}
    query_rows, anchors = [], []
    for query_row, query_id in enumerate(pseudo.ids):
        doc_row = row_of.get(query_id[len(PSEUDO_PREFIX):]) if query_id.startswith(PSEUDO_PREFIX) else None
        if doc_row is not None and doc_row in local:
            query_rows.append(query_row)
            anchors.append(local[doc_row])
    if not query_rows:
        raise ValueError(f"DIVE mode='unsupervised' with pseudo_query_weight > 0: none of the {len(pseudo.ids)} pseudo-queries given "
                         f"is of a training document (ids '{PSEUDO_PREFIX}<doc id>'): {fix}")
    return np.asarray(query_rows, dtype=np.int64), np.asarray(anchors, dtype=np.int64)


class UnsupervisedTraining:
    """The unsupervised mode of :class:`~embedtune.compress.dive.DIVECompressor` (a mixin).

    It reads and sets the compressor's ``config``, ``adapter_`` and ``history_``, and calls its
    ``transform``, ``_validate`` (for ``epoch_selection='val'``) and ``_append_log``.
    """

    config: DIVEConfig
    adapter_: DIVEAdapter | None
    history_: list[dict[str, Any]]
    train_docs_: int | None
    training_guard_: dict[str, Any] | None
    _centring: np.ndarray | None
    transform: Callable[[Any], np.ndarray]
    _validate: Callable[[TrainingData], float]
    _append_log: Callable[[dict[str, Any]], None]

    def _fit_corpus(
        self,
        train: TrainingData,
        val: TrainingData | None,
        heads: int,
        hidden_dim: int,
        rotation: np.ndarray | None,
        device: torch.device,
    ) -> int | None:
        """The unsupervised mode: train on corpus embeddings only; returns the selected epoch (None: 'last')."""
        config = self.config
        held, fit_rows = holdout_documents(len(train.doc_embeddings), config)
        n_holdout = len(held)
        self.train_docs_ = len(fit_rows) if len(fit_rows) + n_holdout < len(train.doc_embeddings) else None  # None: every document
        # Only the sampled and the held-out documents are copied (a large corpus is not); rows below are local to them.
        universe = np.sort(np.concatenate([fit_rows, held]))
        fit_local, held_local = np.searchsorted(universe, fit_rows), np.searchsorted(universe, held)
        # The frozen space's cosine geometry (what retrieval with the frozen model ranks by) is the teacher.
        frozen = unit_float32(train.doc_embeddings[universe])
        adapter_input = frozen if config.normalize_input else np.ascontiguousarray(train.doc_embeddings[universe], dtype=np.float32)
        neighbors = nearest_neighbors(frozen[fit_local], config.neighbors)  # rows of fit_local
        pseudo_anchors = None
        if config.pseudo_query_weight > 0:
            query_rows, _ = _training_pseudo_queries(train.pseudo_queries, train.doc_ids, fit_rows)
            raw = np.asarray(train.pseudo_queries.embeddings[query_rows], dtype=np.float32)  # type: ignore[union-attr]
            pseudo_teacher = unit_float32(raw)
            # Each pseudo-query's pool: the training documents the frozen space ranks first for it (its own among them, mostly).
            _, pseudo_top = exact_search(pseudo_teacher, frozen[fit_local], k=min(config.neighbors, len(fit_local)))
            pseudo_anchors = (torch.from_numpy(pseudo_teacher if config.normalize_input else np.ascontiguousarray(raw)),
                              torch.from_numpy(pseudo_teacher), torch.from_numpy(np.ascontiguousarray(pseudo_top, dtype=np.int64)))
            logger.info("DIVE (unsupervised): %d pseudo-queries of training documents as anchors (weight %g)", len(query_rows),
                        config.pseudo_query_weight)

        # measure() -> the row's selection metrics; the first is the one selected on, `sign` says which way is better.
        measure: Callable[[], dict[str, float]] | None = None
        sign = 1.0
        if config.epoch_selection == "val":
            if val is None or not val.query_ids:
                raise ValueError("DIVE epoch_selection='val' selects on the val queries given to fit(train, val); none were given.")
            measure = lambda: {"val_ndcg@10": self._validate(val)}  # noqa: E731
        elif n_holdout:
            # Held-out documents stand in for queries; the candidates are the sampled and the held-out documents.
            truth = nearest_neighbors(frozen, _RECALL_AT, queries=held_local)
            if config.selection_signal == "pseudo-queries":
                query_rows, query_docs = _held_out_pseudo_queries(train.pseudo_queries, train.doc_ids, held)
                pseudo_queries = np.ascontiguousarray(train.pseudo_queries.embeddings[query_rows])
                targets = np.searchsorted(universe, query_docs)  # each pseudo-query's own document, a row of the candidates
                logger.info("DIVE (unsupervised): selecting on %d pseudo-queries of the %d held-out documents", len(query_rows), n_holdout)
                if len(query_rows) < _FEW_PSEUDO_QUERIES:
                    logger.warning("DIVE (unsupervised): selecting on only %d pseudo-queries (of %d held-out documents), so the "
                                   "start and the epoch may be chosen by chance; a larger corpus holds out more (holdout_docs, at "
                                   "most a tenth of it), or use selection_signal='rank-kl'.", len(query_rows), n_holdout)

                def measure() -> dict[str, float]:
                    return {**self._pseudo_query_metrics(adapter_input, pseudo_queries, targets),
                            **self._holdout_metrics(adapter_input, frozen, held_local, truth)}
            else:
                measure = lambda: self._holdout_metrics(adapter_input, frozen, held_local, truth)  # noqa: E731
                sign = -1.0  # the held-out rank KL: lower is better
        score_name = ""
        guard: tuple[np.ndarray, np.ndarray] | None = None  # (pseudo-queries, their own documents' candidate rows)
        if config.training_guard == "pseudo-queries":
            if not n_holdout or config.epoch_selection != "best":
                raise ValueError("DIVE training_guard='pseudo-queries' compares the selected epoch with the PCA start on held-out "
                                 "documents, so it needs epoch_selection='best' and a corpus of at least 10 documents; set "
                                 "training_guard='none' otherwise.")
            guard_rows, guard_docs = _held_out_pseudo_queries(train.pseudo_queries, train.doc_ids, held,
                                                              "training_guard='pseudo-queries'", "training_guard='none'")
            guard = (np.ascontiguousarray(train.pseudo_queries.embeddings[guard_rows]),  # type: ignore[union-attr]
                     np.searchsorted(universe, guard_docs))
        self.training_guard_ = None

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            adapter = DIVEAdapter(train.dim, config.dim, heads, hidden_dim, config.activation, config.normalize_input)
        adapter.to(device)
        adapter.set_rotation(rotation)
        self.adapter_ = adapter
        start_row: dict[str, Any] = {"epoch": 0, "phase": "unsupervised"}
        best_epoch, best_score, best_state = config.epochs, -math.inf, None
        # With the guard: each start's weights and its held-out pseudo-queries' nDCG@10, to fall back on.
        start_states: dict[str, dict[str, torch.Tensor]] = {}
        start_gains: dict[str, np.ndarray] = {}

        def guard_start(name: str) -> None:
            if guard is not None:
                start_states[name] = copy.deepcopy(adapter.state_dict())
                start_gains[name] = self._pseudo_query_gains(adapter_input, *guard)

        chosen = "uncentred"
        if measure is not None:
            starts = {"uncentred": measure()}
            guard_start("uncentred")
            score_name = next(iter(starts["uncentred"]))
            if rotation is not None:
                # Two candidate starts: the uncentred PCA projection (bias 0) and the centred one (bias −μR),
                # which is the pca baseline.
                centring = torch.from_numpy(self._centring).to(device)
                with torch.no_grad():
                    adapter.mlp.down.bias.copy_(centring)
                starts["centred"] = measure()
                guard_start("centred")
            chosen = max(starts, key=lambda name: (sign * starts[name][score_name], name == "uncentred"))  # ties: uncentred
            if chosen == "uncentred":
                with torch.no_grad():
                    adapter.mlp.down.bias.zero_()
            for name, metrics in starts.items():
                start_row.update({f"{key}_{name}_start": value for key, value in metrics.items()})
            if rotation is not None:
                start_row["start"] = chosen
                logger.info("DIVE (unsupervised): %s PCA start (%s: %s)", chosen, score_name,
                            ", ".join(f"{name} {metrics[score_name]:.4f}" for name, metrics in starts.items()))
            best_epoch, best_score, best_state = 0, sign * starts[chosen][score_name], copy.deepcopy(adapter.state_dict())
        self.history_.append(start_row)
        self._append_log(start_row)

        docs = torch.from_numpy(adapter_input[fit_local])
        teacher = torch.from_numpy(frozen[fit_local])
        neighbor_rows = torch.from_numpy(neighbors)
        optimizer = torch.optim.AdamW(adapter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        generator = torch.Generator().manual_seed(config.seed)
        logger.debug("DIVE (unsupervised): %d training documents, %d held out, %d neighbours each, H=%d, device %s",
                     len(fit_rows), n_holdout, neighbors.shape[1], heads, device)
        progress = progress_bar(config.epochs, "DIVE unsupervised epochs", unit="epoch", enabled=config.progress)
        for epoch in range(1, config.epochs + 1):
            start = time.perf_counter()
            row = self._corpus_epoch(adapter, optimizer, docs, teacher, neighbor_rows, generator, device, pseudo_anchors)
            if measure is not None:
                row.update(measure())
                value = sign * row[score_name]
                if value > best_score:  # strict: ties keep the earlier (simpler) adapter
                    best_epoch, best_score, best_state = epoch, value, copy.deepcopy(adapter.state_dict())
            row = {"epoch": epoch, "phase": "unsupervised", **row, "seconds": time.perf_counter() - start}
            self.history_.append(row)
            self._append_log(row)
            postfix = {"loss": f"{row['loss_total']:.4f}"}
            if measure is not None:
                postfix[score_name] = f"{row[score_name]:.4f}"
            progress.set_postfix(postfix, refresh=False)
            progress.update(1)
            if measure is not None and config.patience is not None and epoch - best_epoch >= config.patience:
                logger.info("DIVE (unsupervised): %s has not improved for %d epochs; stopping at epoch %d", score_name, config.patience, epoch)
                break
        progress.close()
        if best_state is not None:
            adapter.load_state_dict(best_state)
            logger.info("DIVE (unsupervised): kept epoch %d of %d (%s %.4f)%s", best_epoch, len(self.history_) - 1, score_name,
                        sign * best_score, "; training did not beat the PCA start" if best_epoch == 0 else "")
        if guard is not None and start_gains:
            adapter.eval()
            trained = self._pseudo_query_gains(adapter_input, *guard) if best_epoch > 0 else None
            self.training_guard_ = self._guard_verdict(start_gains, chosen, trained, best_epoch)
            if self.training_guard_["kept"] == "start":
                adapter.load_state_dict(start_states[self.training_guard_["start"]])
                best_epoch = 0
        adapter.eval()
        return best_epoch if measure is not None else None

    def _corpus_epoch(
        self,
        adapter: DIVEAdapter,
        optimizer: torch.optim.Optimizer,
        docs: torch.Tensor,
        teacher: torch.Tensor,
        neighbor_rows: torch.Tensor,
        generator: torch.Generator,
        device: torch.device,
        pseudo_anchors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One pass over the training documents as anchors; mean loss terms.

        ``pseudo_anchors`` (adapter inputs, unit frozen vectors, frozen top training-document rows of
        the pseudo-queries): a batch of them beside every batch of documents, cycling through them.
        """
        config = self.config
        adapter.train()
        order = torch.randperm(len(docs), generator=generator)
        totals = {"loss_rank": 0.0, "loss_view": 0.0, "loss_geometry": 0.0}
        if pseudo_anchors is not None:
            totals["loss_pseudo_rank"] = 0.0
            pseudo_order = torch.randperm(len(pseudo_anchors[0]), generator=generator)
            pseudo_at, pseudo_seen = 0, 0
        for lo in range(0, len(docs), config.batch_size):
            anchors = order[lo : lo + config.batch_size]
            pool = torch.unique(torch.cat([anchors, neighbor_rows[anchors].reshape(-1)]))  # sorted
            slots = torch.searchsorted(pool, anchors).to(device)
            heads = adapter(docs[pool].to(device))  # (m, H, k)
            student, frozen = heads[:, 0], teacher[pool].to(device)
            loss_rank = neighbor_rank_distillation_loss(student[slots], student, frozen[slots], frozen, slots, config.neighbor_temperature)
            with torch.set_grad_enabled(config.view_weight > 0):
                loss_view = headwise_ntxent_loss(heads[slots], config.temperature) if adapter.heads >= 2 else heads.new_zeros(())
            with torch.set_grad_enabled(config.geometry_weight > 0):
                loss_geometry = geometry_distillation_loss(student[slots], frozen[slots])
            loss = loss_rank + config.view_weight * loss_view + config.geometry_weight * loss_geometry
            if pseudo_anchors is not None:
                inputs, unit_queries, top = pseudo_anchors
                if pseudo_at >= len(pseudo_order):
                    pseudo_order, pseudo_at = torch.randperm(len(pseudo_order), generator=generator), 0
                picks = pseudo_order[pseudo_at : pseudo_at + config.batch_size]
                pseudo_at += len(picks)
                pseudo_pool = torch.unique(top[picks].reshape(-1))
                loss_pseudo = neighbor_rank_distillation_loss(
                    adapter(inputs[picks].to(device))[:, 0], adapter(docs[pseudo_pool].to(device))[:, 0], unit_queries[picks].to(device),
                    teacher[pseudo_pool].to(device), torch.full((len(picks),), -1, dtype=torch.int64, device=device),
                    config.neighbor_temperature)
                loss = loss + config.pseudo_query_weight * loss_pseudo
                totals["loss_pseudo_rank"] += float(loss_pseudo.detach()) * len(picks)
                pseudo_seen += len(picks)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for name, value in (("loss_rank", loss_rank), ("loss_view", loss_view), ("loss_geometry", loss_geometry)):
                totals[name] += float(value.detach()) * len(anchors)
        means = {name: value / len(docs) for name, value in totals.items()}
        means["loss_total"] = means["loss_rank"] + config.view_weight * means["loss_view"] + config.geometry_weight * means["loss_geometry"]
        if pseudo_anchors is not None:
            means["loss_pseudo_rank"] = totals["loss_pseudo_rank"] / max(pseudo_seen, 1)
            means["loss_total"] += config.pseudo_query_weight * means["loss_pseudo_rank"]
        return means

    def _guard_verdict(self, starts: dict[str, np.ndarray], chosen: str, trained: np.ndarray | None, epoch: int) -> dict[str, Any]:
        """What the fit keeps: the trained adapter (``epoch``) or a PCA start, from each held-out pseudo-query's nDCG@10.

        The fallback is the start selection chose (``chosen``), or the other one where the
        pseudo-queries retrieve their documents better from it by a one-sided paired sign-flip
        test below ``training_guard_p``. The trained adapter is kept only when the same test of
        ``trained`` against the fallback passes. Each step away from the default needs evidence:
        few pseudo-queries or a small gain keep what selection chose, so learning stays only where
        the corpus's own text shows that it retrieves better than PCA.

        Args:
            starts: each PCA start's per-pseudo-query nDCG@10 (``uncentred``, and ``centred`` where it was a candidate).
            chosen: the start selection trained from.
            trained: the selected epoch's per-pseudo-query nDCG@10; None where selection kept the start (epoch 0).
        """
        others = {other: self._one_sided(starts[other], starts[chosen])[1] for other in starts if other != chosen}
        fallback = next((other for other, p in others.items() if p < self.config.training_guard_p), chosen)
        verdict: dict[str, Any] = {"kept": "start", "start": fallback, "selected_epoch": epoch, "n_pseudo_queries": int(len(starts[chosen])),
                                   **{f"pseudo_query_ndcg@10_{name}_start": float(gains.mean()) for name, gains in starts.items()},
                                   "p_threshold": self.config.training_guard_p,
                                   **{f"p_one_sided_{other}_start": p for other, p in others.items()}}
        if trained is not None:
            difference, p_one_sided = self._one_sided(trained, starts[fallback])
            verdict.update({"pseudo_query_ndcg@10_trained": float(trained.mean()), "mean_difference": difference,
                            "p_one_sided": p_one_sided})
            if p_one_sided < self.config.training_guard_p:
                verdict.update(kept="trained", start=chosen)
            logger.info("DIVE (unsupervised): training guard: held-out pseudo-queries' nDCG@10 %.4f at epoch %d, %.4f from the %s "
                        "start (%+.4f, one-sided p %.3f over %d): %s", verdict["pseudo_query_ndcg@10_trained"], epoch,
                        float(starts[fallback].mean()), fallback, difference, p_one_sided, len(trained),
                        f"kept epoch {epoch}" if verdict["kept"] == "trained" else f"kept the {fallback} PCA start")
        elif fallback != chosen:
            logger.info("DIVE (unsupervised): training guard: selection kept the start; the held-out pseudo-queries prefer the %s "
                        "one (nDCG@10 %s)", fallback, ", ".join(f"{name} {gains.mean():.4f}" for name, gains in starts.items()))
        return verdict

    def _one_sided(self, better: np.ndarray, than: np.ndarray) -> tuple[float, float]:
        """``(mean of better − than, one-sided p that better scores above than)`` on the same pseudo-queries (sign flips)."""
        test = paired_test(better, than, seed=self.config.seed)
        return test.mean_difference, float(test.p_value / 2 if test.mean_difference > 0 else 1.0 - test.p_value / 2)

    def _pseudo_query_metrics(self, candidates: np.ndarray, pseudo_queries: np.ndarray, targets: np.ndarray) -> dict[str, float]:
        """``holdout_pseudo_query_ndcg@10`` (selected on with ``selection_signal='pseudo-queries'``, higher is better)."""
        return {"holdout_pseudo_query_ndcg@10": float(self._pseudo_query_gains(candidates, pseudo_queries, targets).mean())}

    def _pseudo_query_gains(self, candidates: np.ndarray, pseudo_queries: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Each pseudo-query's nDCG@10 retrieving its own document through the current transform
        (:func:`own_document_gains`).

        Args:
            candidates: (n, d) adapter inputs of the candidate documents.
            pseudo_queries: (m, d) the pseudo-query vectors (encoded as queries).
            targets: (m,) each pseudo-query's own document, a row of ``candidates``.
        """
        return own_document_gains(self.transform(pseudo_queries), self.transform(candidates), targets)

    def _holdout_metrics(self, candidates: np.ndarray, teacher: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> dict[str, float]:
        """The unsupervised mode's selection signal on held-out documents, over the whole candidate set.

        ``holdout_rank_kl`` (selected on, lower is better): the neighbour-rank distillation loss of
        each held-out document against every candidate document, i.e. how far the compressed
        space's softmax ranking of the corpus around it is from the frozen space's. It is the
        training objective on documents never trained on. ``holdout_neighbor_recall@10``
        (reported): the share of each held-out document's 10 nearest frozen-space neighbours that
        the compressed space also ranks in its top 10.

        Args:
            candidates: (n, d) adapter inputs of the candidate documents.
            teacher: (n, d) their unit-norm frozen embeddings.
            queries: rows of ``candidates`` that are held out.
            truth: (n_queries, 10) each held-out row's frozen-space top 10 (rows of ``candidates``).
        """
        compressed = self.transform(candidates)
        student_all, teacher_all = torch.from_numpy(compressed), torch.from_numpy(np.ascontiguousarray(teacher))
        total = 0.0
        with torch.no_grad():
            for lo in range(0, len(queries), _KL_CHUNK):
                rows = torch.from_numpy(np.asarray(queries[lo : lo + _KL_CHUNK], dtype=np.int64))
                loss = neighbor_rank_distillation_loss(student_all[rows], student_all, teacher_all[rows], teacher_all, rows,
                                                       self.config.neighbor_temperature)
                total += float(loss) * len(rows)
        _, found = exact_search(compressed[queries], compressed, k=min(_RECALL_AT + 1, len(candidates)))
        hits = 0
        for row, query in enumerate(queries):
            top = [j for j in found[row] if j != query][: truth.shape[1]]
            hits += len(set(top) & set(truth[row].tolist()))
        return {"holdout_rank_kl": total / len(queries), "holdout_neighbor_recall@10": hits / max(truth.size, 1)}
