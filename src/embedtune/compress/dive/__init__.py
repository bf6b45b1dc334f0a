"""DIVE: a multi-head residual adapter trained with self-limiting updates (Zhao, arXiv:2605.20689).

The adapter is the identity-initialised residual MLP ``z' = z + W2 σ(W1 z + b1) + b2`` (§3.1).
Its first ``k·H`` coordinates are cut into ``H`` heads of ``k`` coordinates, each L2-normalised.
Training uses every head::

    L = L_triplet + λ·L_view + γ·L_geo            (§3.2)

with the self-limiting hinge on head 1, head-wise NT-Xent across heads, and geometry
distillation from the frozen space. Inference keeps head 1 only, so a fitted DIVE stores one
``k``-dimensional vector per item, and at initialisation ``transform(X) == normalize(X[:, :k])``
(with ``normalize_input`` the input is normalised first, which changes the result only by float
rounding).

Options beyond the paper (all off by default, so the defaults stay the paper's recipe):

- ``init="pca"``: rotate the (normalised) input by the orthogonal PCA basis ``R`` of the training
  corpus before the adapter, ``z' = zR + W2 σ(W1 zR + b1) + b2``. ``R`` is estimated on centred
  corpus embeddings and applied without centring, so every full-dimensional inner product is
  unchanged, and at initialisation head 1 is the projection on the top-``k`` principal
  directions instead of an arbitrary ``k`` coordinates.
- ``epoch_selection="best"``: score validation nDCG@10 before training (epoch 0) and after every
  epoch, and keep the best weights. Without a validation set, ``selection_fraction`` of the
  training queries are held out for it (query-disjoint, by a seeded hash). With ``init="pca"``
  the epoch-0 candidate is the uncentred PCA projection, so the result is never worse than it
  on the selection queries.
- ``output_norm="input"``: scale the unit head 1 by the input's norm, for dot-product models
  (PACE Stage II) whose embedding norms carry meaning.

**Unsupervised mode** (``mode="unsupervised"``, :meth:`DIVECompressor.fit_unsupervised`, the
``unsupervised`` preset): corpus embeddings only, no queries and no labels. The triplet term,
which needs labels, is replaced by neighbour-rank distillation on the corpus
(:mod:`embedtune.compress.losses.neighbor_rank_distillation`)::

    L = L_rank + λ·L_view + γ·L_geo

For each batch of anchor documents, the pool is the anchors plus each one's ``neighbors``
nearest frozen-space neighbours; ``L_rank`` makes head 1 rank each anchor's pool as the frozen
space does (softmax KL of the standardised similarities at temperature ``neighbor_temperature``,
so the same τ suits isotropic and anisotropic embedding spaces), and geometry distillation and
the view loss are DIVE's, on the anchors. Both PCA projections are candidate starts (the
uncentred one of ``init="pca"``, and the centred one, i.e. the ``pca`` baseline, obtained by
setting the adapter's output bias to ``−μR``); the one that scores better on held-out documents
is trained. Selection (``epoch_selection="best"``) holds out ``holdout_docs`` documents (at most
a tenth of the corpus) that are never trained on, and keeps the start or epoch with the lowest
held-out rank KL: ``L_rank`` of each held-out document against the whole corpus, i.e. how far
the compressed ranking of the corpus around it is from the frozen one. It is a corpus-only
signal, so the result is never below the better PCA projection on it; with ``patience`` training stops
once the signal has not improved for that many epochs. Agreement with the frozen space cannot
prefer a space that retrieves better than the frozen one (centring, where a shared mean direction
buries the topics), so ``selection_signal='pseudo-queries'`` selects instead on the nDCG@10 of the
held-out documents' pseudo-queries (a title or first sentence each, encoded as a query,
``TrainingData.pseudo_queries``) retrieving their own document among the candidates. (Held-out neighbour
recall@10 is logged too; it flattens after a few epochs while the ranking keeps improving, so it
is not selected on.) Corpora above ``max_train_docs`` (default
:data:`~embedtune.compress.dive.config.DEFAULT_TRAIN_DOCS`) train on a seeded sample of that many
documents, and with ``init="pca"`` the start (rotation and centring mean) of a corpus above the
``pca`` baseline's fit sample is estimated on that baseline's seeded sample: only sampled rows are
read and normalised, so a memory-mapped corpus of any size is never copied whole.

The package, one idea a module:

- :mod:`~embedtune.compress.dive.config`: :class:`DIVEConfig`, its presets and :func:`resolve_heads`;
- :mod:`~embedtune.compress.dive.network`: :class:`DIVEAdapter`, :class:`DIVEEncoder` and
  :func:`corpus_pca_rotation`;
- :mod:`~embedtune.compress.dive.supervised` and :mod:`~embedtune.compress.dive.unsupervised`:
  the two training algorithms, mixins of the compressor;
- :mod:`~embedtune.compress.dive.compressor`: :class:`DIVECompressor`, :data:`ROBUST` and ``PRESETS``.

The epoch-selection hold-out, :func:`holdout_split`, lives in :mod:`embedtune.compress.holdout`.
"""

from __future__ import annotations

import importlib
from typing import Any

from embedtune.compress.dive.config import EPOCH_SELECTIONS, INIT_KINDS, MODES, OUTPUT_NORMS, DIVEConfig, resolve_heads  # noqa: F401
from embedtune.compress.holdout import holdout_split  # noqa: F401

# The network and the compressor need torch: imported on first use, so the config alone (what
# `compress train --help` reads) loads without it.
_LAZY = {name: "embedtune.compress.dive.compressor"
         for name in ("PRESETS", "ROBUST", "STATIC_CORPUS", "STATIC_CORPUS_WARNING", "TRAINING_LOG_NAME", "DIVECompressor")}
_LAZY.update({name: "embedtune.compress.dive.network" for name in ("DIVEAdapter", "DIVEEncoder", "corpus_pca_rotation")})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# PRESETS, the option tuples, corpus_pca_rotation and holdout_split are importable from here
# as before the package split, and, as before, outside __all__.
__all__ = ["DIVEConfig", "DIVECompressor", "DIVEAdapter", "DIVEEncoder", "resolve_heads", "TRAINING_LOG_NAME", "ROBUST", "STATIC_CORPUS", "STATIC_CORPUS_WARNING"]
