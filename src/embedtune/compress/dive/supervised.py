"""DIVE's supervised training algorithm (the paper's, §3.2): triplets from labels, one adapter.

``L = L_triplet + λ·L_view + γ·L_geo``: the self-limiting hinge on head 1, head-wise NT-Xent
across heads and geometry distillation from the frozen space. ``epoch_selection`` keeps the last
epoch, the best one on held-out training queries (then refits on all), or the best one on the
val queries given to ``fit``.
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
import torch.nn.functional as F

from embedtune.compress.base import TrainingData
from embedtune.compress.dive.config import DIVEConfig
from embedtune.compress.dive.network import DIVEAdapter
from embedtune.compress.holdout import holdout_split
from embedtune.compress.losses import geometry_distillation_loss, headwise_ntxent_loss
from embedtune.compress.quantization_aware import quantization_aware_triplet_loss
from embedtune.runtime import progress_bar

logger = logging.getLogger(__package__)  # "embedtune.compress.dive", as before the package split

__all__ = ["SupervisedTraining"]

# The label of each training phase's progress bar.
_PHASE_LABELS = {"train": "DIVE epochs", "select": "DIVE epoch selection", "refit": "DIVE refit"}


class SupervisedTraining:
    """The supervised mode of :class:`~embedtune.compress.dive.DIVECompressor` (a mixin).

    It reads and sets the compressor's ``config``, ``adapter_``, ``selected_epoch_`` and
    ``history_``, and calls its ``_validate`` (nDCG@10 of what is deployed) and ``_append_log``.
    """

    config: DIVEConfig
    method: str
    adapter_: DIVEAdapter | None
    selected_epoch_: int | None
    history_: list[dict[str, Any]]
    pca_start_: str | None
    pca_start_scores_: dict[str, float]
    _centring: np.ndarray | None
    _validate: Callable[[TrainingData], float]
    _append_log: Callable[[dict[str, Any]], None]

    def _fit_supervised(
        self,
        train: TrainingData,
        val: TrainingData | None,
        heads: int,
        hidden_dim: int,
        rotation: np.ndarray | None,
        device: torch.device,
    ) -> None:
        """Train on ``train.triplets`` as ``epoch_selection`` says; sets ``selected_epoch_`` unless 'last'."""
        config = self.config
        if config.epoch_selection == "last":
            self._train(train, val, heads, hidden_dim, rotation, device, config.epochs, holdout=None, phase="train")
            return
        if config.epoch_selection == "val":
            # The val queries select the epoch (0 included) and are never trained on: no refit.
            if val is None or not val.query_ids:
                raise ValueError("DIVE epoch_selection='val' selects on the val queries given to fit(train, val); none were given.")
            self.selected_epoch_ = self._train(train, None, heads, hidden_dim, rotation, device, config.epochs, holdout=val, phase="select")
            return
        # Select the epoch count on held-out training queries (epoch 0 included), then refit on
        # every training query for that many epochs, so the selection costs no training data.
        fit_part, holdout = holdout_split(train, config.selection_fraction, config.seed, rule=config.selection_holdout)
        logger.debug("DIVE: selecting the epoch on %d held-out training queries (%s)", len(holdout.query_ids), config.selection_holdout)
        best_epoch = self._train(fit_part, val, heads, hidden_dim, rotation, device, config.epochs, holdout=holdout, phase="select")
        self.selected_epoch_ = best_epoch
        if config.refit == "none":
            logger.info("DIVE: kept epoch %d of %d, trained on the %d fitting queries only (refit='none')", best_epoch,
                        config.epochs, len(fit_part.query_ids) - len(holdout.query_ids))
            return
        epochs = best_epoch
        if config.refit == "steps":  # as many updates as the selected model had: fewer passes over the larger set
            epochs = math.floor(best_epoch * len(fit_part.triplets) / len(train.triplets) + 0.5)
        logger.info("DIVE: best epoch %d of %d; refitting on all %d training queries for %d epochs", best_epoch, config.epochs,
                    len(train.query_ids), epochs)
        self._train(train, val, heads, hidden_dim, rotation, device, epochs, holdout=None, phase="refit")

    def _train(
        self,
        train: TrainingData,
        val: TrainingData | None,
        heads: int,
        hidden_dim: int,
        rotation: np.ndarray | None,
        device: torch.device,
        epochs: int,
        holdout: TrainingData | None,
        phase: str,
    ) -> int:
        """Train a fresh adapter for ``epochs`` epochs into ``self.adapter_``.

        With ``holdout``, its nDCG@10 is scored before training and after every epoch, the best
        weights are kept, and their epoch (0 = the initialisation) is returned; otherwise the
        last epoch is kept and returned.
        """
        config = self.config
        triplets = train.require_triplets(self.method)
        # Seed only the initialisation, without touching the caller's global RNG state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            adapter = DIVEAdapter(train.dim, config.dim, heads, hidden_dim, config.activation, config.normalize_input)
        adapter.to(device)
        adapter.set_rotation(rotation)
        self.adapter_ = adapter
        start_row = self._set_pca_start(adapter, train, rotation, holdout, phase)
        logger.debug(
            "DIVE (%s): %d triplets, %d-d -> %d-d, H=%d, r=%d, init=%s, %d parameters, device %s",
            phase, len(triplets), train.dim, config.dim, heads, hidden_dim, config.init, adapter.mlp.num_parameters(), device,
        )

        # Only the rows the triplets use go to the device: a large corpus need not fit there.
        query_rows, query_index = np.unique(triplets[:, 0], return_inverse=True)
        doc_rows, doc_index = np.unique(triplets[:, 1:], return_inverse=True)
        queries = torch.from_numpy(train.query_embeddings[query_rows]).to(device)
        docs = torch.from_numpy(train.doc_embeddings[doc_rows]).to(device)
        local = torch.from_numpy(np.column_stack([query_index.reshape(-1), doc_index.reshape(-1, 2)])).to(device)
        pseudo = self._pseudo_batches(train, device)

        best_epoch, best_score, best_state = epochs, -math.inf, None
        if holdout is not None:
            best_epoch, best_score = 0, start_row.get("holdout_ndcg@10", self._validate(holdout))
            best_state = copy.deepcopy(adapter.state_dict())
            logger.debug("DIVE epoch 0 (initialisation): holdout nDCG@10 %.4f", best_score)
        optimizer = torch.optim.AdamW(adapter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        generator = torch.Generator().manual_seed(config.seed)
        progress = progress_bar(epochs, _PHASE_LABELS.get(phase, f"DIVE {phase}"), unit="epoch", enabled=config.progress)
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            row = self._train_epoch(adapter, optimizer, queries, docs, local, generator, pseudo)
            if val is not None:
                row["val_ndcg@10"] = self._validate(val)
            if holdout is not None:
                score = row["holdout_ndcg@10"] = self._validate(holdout)
                if score > best_score:  # strict: ties keep the earlier (simpler) adapter
                    best_epoch, best_score, best_state = epoch, score, copy.deepcopy(adapter.state_dict())
            row = {"epoch": epoch, **row, "seconds": time.perf_counter() - start}
            if phase != "train":
                row["phase"] = phase
            self.history_.append(row)
            self._append_log(row)
            logger.debug(
                "DIVE epoch %d/%d: rho=%.3f triplet=%.4f view=%.4f geo=%.5f total=%.4f%s (%.1fs)",
                epoch, epochs, row["active_ratio"], row["loss_triplet"], row["loss_view"], row["loss_geometry"],
                row["loss_total"], f" val_ndcg@10={row['val_ndcg@10']:.4f}" if val is not None else "", row["seconds"],
            )
            postfix = {"rho": f"{row['active_ratio']:.3f}", "loss": f"{row['loss_total']:.4f}"}
            if holdout is not None:
                postfix["holdout_ndcg@10"] = f"{row['holdout_ndcg@10']:.4f}"
            progress.set_postfix(postfix, refresh=False)
            progress.update(1)
        progress.close()
        if best_state is not None:
            adapter.load_state_dict(best_state)
        adapter.eval()
        return best_epoch

    def _set_pca_start(self, adapter: DIVEAdapter, train: TrainingData, rotation: np.ndarray | None,
                       holdout: TrainingData | None, phase: str) -> dict[str, Any]:
        """Put the adapter at the uncentred or the centred PCA projection, as ``pca_start`` says.

        The centred start is the uncentred one with the output bias ``−μR`` (μ the mean unit row of
        the corpus; of a large corpus, of the ``pca`` baseline's sample of it,
        :func:`~embedtune.compress.dive.network.pca_start_rows`), which is exactly the ``pca``
        baseline's projection, so an adapter kept at epoch
        0 is the stronger of the two PCA variants on the selection queries. With ``'stronger'``,
        both are scored on ``holdout`` and the choice is kept for a later refit; returns the
        epoch-0 history row (empty without a rotation).
        """
        config = self.config
        if rotation is None:
            return {}
        centring = torch.from_numpy(self._centring).to(adapter.mlp.down.bias.device)
        row: dict[str, Any] = {"epoch": 0, "phase": phase}
        choice = config.pca_start
        if choice == "stronger":
            if holdout is not None:
                scores = {"uncentred": self._validate(holdout)}
                with torch.no_grad():
                    adapter.mlp.down.bias.copy_(centring)
                scores["centred"] = self._validate(holdout)
                choice = max(scores, key=lambda name: (scores[name], name == "uncentred"))  # ties: uncentred
                row.update({f"holdout_ndcg@10_{name}_start": value for name, value in scores.items()})
                row["holdout_ndcg@10"] = scores[choice]
                logger.info("DIVE: %s PCA start (selection nDCG@10: uncentred %.4f, centred %.4f)", choice,
                            scores["uncentred"], scores["centred"])
            else:
                choice = getattr(self, "pca_start_", None) or "uncentred"
        with torch.no_grad():
            if choice == "centred":
                adapter.mlp.down.bias.copy_(centring)
            else:
                adapter.mlp.down.bias.zero_()
        self.pca_start_ = choice
        row["start"] = choice
        if len(row) > 3:  # the scores of a choice made here (per-epoch history and log rows stay training rows)
            self.pca_start_scores_ = {k: v for k, v in row.items() if k.endswith("_start")}
        return row

    def _pseudo_batches(self, train: TrainingData, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(pseudo-query vectors, positive docs, negative docs)`` of every pseudo triplet on ``device``, or None.

        None unless ``pseudo_query_weight > 0`` and ``train`` carries pseudo-queries.
        """
        pseudo = train.pseudo_queries
        if self.config.pseudo_query_weight <= 0 or pseudo is None or not len(pseudo.triplets):
            return None
        rows = pseudo.triplets
        return (torch.from_numpy(pseudo.embeddings[rows[:, 0]]).to(device), torch.from_numpy(train.doc_embeddings[rows[:, 1]]).to(device),
                torch.from_numpy(train.doc_embeddings[rows[:, 2]]).to(device))

    def _train_epoch(
        self,
        adapter: DIVEAdapter,
        optimizer: torch.optim.Optimizer,
        queries: torch.Tensor,
        docs: torch.Tensor,
        local: torch.Tensor,
        generator: torch.Generator,
        pseudo: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        config = self.config
        adapter.train()
        order = torch.randperm(len(local), generator=generator).to(local.device)
        totals = {"active_ratio": 0.0, "loss_triplet": 0.0, "loss_view": 0.0, "loss_geometry": 0.0}
        if pseudo is not None:
            totals["loss_pseudo"] = 0.0
        for lo in range(0, len(local), config.batch_size):
            batch = local[order[lo : lo + config.batch_size]]  # (b, 3) rows into queries / docs
            size = len(batch)
            inputs = torch.cat([queries[batch[:, 0]], docs[batch[:, 1]], docs[batch[:, 2]]])  # (3b, d)
            heads = adapter(inputs)  # (3b, H, k)
            query_heads, positive_heads, negative_heads = heads.split(size)
            loss_triplet, active_ratio = quantization_aware_triplet_loss(
                config.quantization_aware, query_heads[:, 0], positive_heads[:, 0], negative_heads[:, 0], config.margin, config.triplet_loss
            )
            # A zero-weighted term is still reported, but kept out of the graph.
            with torch.set_grad_enabled(config.view_weight > 0):
                if adapter.heads >= 2:
                    loss_view = torch.stack([headwise_ntxent_loss(group, config.temperature) for group in (query_heads, positive_heads, negative_heads)]).mean()
                else:
                    loss_view = heads.new_zeros(())
            with torch.set_grad_enabled(config.geometry_weight > 0):
                teacher = F.normalize(inputs, p=2, dim=-1)  # T: the frozen inputs, no parameters involved
                loss_geometry = geometry_distillation_loss(heads[:, 0], teacher)
            loss = loss_triplet + config.view_weight * loss_view + config.geometry_weight * loss_geometry
            if pseudo is not None:
                # A batch of pseudo triplets as large as the real one, drawn anew each step, so an
                # epoch stays one pass over the real triplets whatever the corpus size.
                pick = torch.randint(len(pseudo[0]), (size,), generator=generator).to(local.device)
                pseudo_heads = adapter(torch.cat([part[pick] for part in pseudo]))[:, 0]
                loss_pseudo, _ = quantization_aware_triplet_loss(config.quantization_aware, *pseudo_heads.split(size), config.margin,
                                                                 config.triplet_loss)
                loss = loss + config.pseudo_query_weight * loss_pseudo
                totals["loss_pseudo"] += float(loss_pseudo.detach()) * size
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for name, value in (("active_ratio", active_ratio), ("loss_triplet", loss_triplet), ("loss_view", loss_view), ("loss_geometry", loss_geometry)):
                totals[name] += float(value.detach()) * size
        means = {name: value / len(local) for name, value in totals.items()}
        means["weighted_triplet"] = means["loss_triplet"]
        means["weighted_view"] = config.view_weight * means["loss_view"]
        means["weighted_geometry"] = config.geometry_weight * means["loss_geometry"]
        means["loss_total"] = means["weighted_triplet"] + means["weighted_view"] + means["weighted_geometry"]
        if pseudo is not None:
            means["weighted_pseudo"] = config.pseudo_query_weight * means["loss_pseudo"]
            means["loss_total"] += means["weighted_pseudo"]
        return means
