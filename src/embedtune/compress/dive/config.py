"""DIVE's configuration: :class:`DIVEConfig` (the paper's defaults and the named presets), the
allowed option values, and :func:`resolve_heads`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from embedtune.compress.base import CompressorConfig
from embedtune.constraints import Constraint, Interval, Options, Text
from embedtune.compress.holdout import SELECTION_HOLDOUTS
from embedtune.compress.choices import ACTIVATION_NAMES, TRIPLET_KINDS, check_quantization_aware

__all__ = ["DIVEConfig", "resolve_heads", "DEFAULT_TRAIN_DOCS", "INIT_KINDS", "EPOCH_SELECTIONS", "PCA_STARTS", "OUTPUT_NORMS", "MODES", "SELECTION_SIGNALS", "TRAINING_GUARDS"]

INIT_KINDS = ("identity", "pca")
EPOCH_SELECTIONS = ("last", "best", "val")
PCA_STARTS = ("stronger", "uncentred", "centred")
REFITS = ("epochs", "steps", "none")
OUTPUT_NORMS = ("unit", "input")
MODES = ("supervised", "unsupervised")
#: What the unsupervised mode selects its start and epoch on: agreement with the frozen space, or pseudo-queries.
SELECTION_SIGNALS = ("rank-kl", "pseudo-queries")
#: What the unsupervised mode's trained adapter must show to be kept over its PCA start: nothing, or held-out
#: pseudo-queries that retrieve their own documents significantly better than from the start.
TRAINING_GUARDS = ("none", "pseudo-queries")
#: The unsupervised mode's training sample: at most this many documents (besides the held-out ones), drawn with the
#: seed. Judged nDCG@10 barely moved past a quarter of it on SciFact and ArguAna
#: (benchmarks/results/dive-scale/REPORT.md), and a fit's time grows with the sample, not with the corpus.
DEFAULT_TRAIN_DOCS = 4096
#: The ``unsupervised`` preset's settings, which ``unsupervised-guarded`` extends.
_UNSUPERVISED: dict[str, Any] = {"mode": "unsupervised", "init": "pca", "epoch_selection": "best", "learning_rate": 1e-3,
                                 "epochs": 50, "patience": 5, "batch_size": 256}


@dataclass
class DIVEConfig(CompressorConfig):
    """DIVE hyperparameters; the defaults are the paper's single global configuration (Table 2, §4.1)."""

    dim: int = field(default=128, metadata={"help": "Output dimension k: the size of each head and of the stored vector."})
    seed: int = field(default=2027, metadata={"help": "Seed for the adapter initialisation and the triplet order."})
    heads: int | str = field(
        default="auto",
        metadata={"help": "Number of heads H (implicit views), or 'auto' (default) for the largest H <= min(max_heads, d // k): the paper's H=4 wherever k*4 <= d. A fixed H needs dim*heads <= input dim."},
    )
    max_heads: int = field(default=4, metadata={"help": "Upper bound on H when heads='auto'."})
    margin: float = field(default=0.7, metadata={"help": "Hinge margin m: a triplet with Δ >= m stops producing gradient."})
    view_weight: float = field(default=0.01, metadata={"help": "λ, weight of the head-wise NT-Xent view loss (0 disables it)."})
    geometry_weight: float = field(default=10.0, metadata={"help": "γ, weight of the geometry distillation loss (0 disables it)."})
    temperature: float = field(default=0.1, metadata={"help": "τ, NT-Xent temperature."})
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's default)."})
    batch_size: int = field(default=128, metadata={"help": "Triplets per optimisation step."})
    epochs: int = field(default=50, metadata={"help": "Passes over the training triplets (0 keeps the identity adapter)."})
    pseudo_query_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the pseudo-query term (TrainingData.pseudo_queries: each document's title or first sentence, "
                  "encoded as a query), one batch beside every batch of the main term; 0 ignores them. Supervised mode: the "
                  "hinge on pseudo-query triplets (against their document). Unsupervised mode: neighbour-rank distillation with "
                  "the training documents' pseudo-queries as anchors (how the frozen space ranks the training documents for each)."},
    )
    hidden_dim: int | None = field(default=None, metadata={"help": "Residual MLP hidden width r; None means d // 2, as in the paper."})
    activation: str = field(default="gelu", metadata={"help": f"Residual MLP activation σ, one of {sorted(ACTIVATION_NAMES)}."})
    normalize_input: bool = field(default=True, metadata={"help": "L2-normalise the frozen embedding before the adapter."})
    triplet_loss: str = field(
        default="hinge",
        metadata={"help": "'hinge' (self-limiting, DIVE) or 'softplus' (the 'w/o self-limiting' ablation, §4.4)."},
    )
    init: str = field(
        default="identity",
        metadata={"help": "'identity' (the paper: head 1 starts as the first k input coordinates) or 'pca' (rotate the input by the corpus PCA basis first)."},
    )
    epoch_selection: str = field(
        default="last",
        metadata={"help": "'last' (the paper: keep the final epoch), 'best' (keep the epoch, 0 included, with the best nDCG@10 on "
                  "held-out training queries, then refit on all), or 'val' (select on the val queries given to fit; no refit)."},
    )
    selection_fraction: float = field(
        default=0.2,
        metadata={"help": "With epoch_selection='best' and no validation set: fraction of training queries held out to select on."},
    )
    selection_holdout: str = field(
        default="disjoint-positives",
        metadata={"help": "With epoch_selection='best': which training queries select, 'disjoint-positives' (whole groups of "
                  "queries that share positives, so the held-out positives were never fitted: rewards what carries over to new "
                  "documents) or 'random-queries' (hash-ranked queries: rewards memorising popular documents; the "
                  "static-corpus preset)."},
    )
    refit: str = field(
        default="epochs",
        metadata={"help": "With epoch_selection='best', after selecting: 'epochs' (retrain on every training query for the "
                  "selected number of epochs), 'steps' (for as many updates as the selected model had) or 'none' (keep the "
                  "selected model, trained on the fitting part only)."},
    )
    pca_start: str = field(
        default="stronger",
        metadata={"help": "With init='pca': 'uncentred' (inner products kept), 'centred' (the pca baseline's projection) or "
                  "'stronger' (whichever scores higher on the selection queries at epoch 0; uncentred without selection)."},
    )
    output_norm: str = field(
        default="unit",
        metadata={"help": "'unit' (L2-normalised head 1, cosine) or 'input' (head 1 scaled by the input's norm, for dot-product models)."},
    )
    quantization_aware: str | None = field(
        default=None,
        metadata={"help": "Train head 1 for the precision it is deployed at: None (float), 'binary' (straight-through sign) or "
                  "'int8' (fake quantisation); epoch selection then scores that precision (compress/quantization_aware.py)."},
    )
    mode: str = field(
        default="supervised",
        metadata={"help": "'supervised' (the paper: triplets from labels) or 'unsupervised' (corpus embeddings only: "
                  "neighbour-rank distillation replaces the triplet term; epochs are passes over the corpus)."},
    )
    neighbors: int = field(default=20, metadata={"help": "Unsupervised mode: frozen-space nearest neighbours of each anchor in its pool."})
    neighbor_temperature: float = field(
        default=0.5,
        metadata={"help": "Unsupervised mode: temperature τ of the neighbour-rank softmaxes, in standard deviations of each "
                  "anchor's similarities over its pool."},
    )
    holdout_docs: int = field(
        default=1000,
        metadata={"help": "Unsupervised mode with epoch_selection='best': documents held out (at most a tenth of the corpus) "
                  "to select the start and the epoch on (their rank KL against the corpus)."},
    )
    selection_signal: str = field(
        default="rank-kl",
        metadata={"help": "Unsupervised mode with epoch_selection='best': what the start and the epoch are selected on. "
                  "'rank-kl' (the held-out documents' rank KL to the frozen space: agreement with the frozen model, which "
                  "can never prefer a space that retrieves better than it) or 'pseudo-queries' (nDCG@10 of each held-out "
                  "document's pseudo-query, its title or first sentence encoded as a query, retrieving that document; "
                  "needs TrainingData.pseudo_queries, which `compress fit --unsupervised` builds from the corpus text)."},
    )
    training_guard: str = field(
        default="none",
        metadata={"help": "Unsupervised mode with epoch_selection='best': 'none' keeps the selected epoch; 'pseudo-queries' "
                  "keeps it only if the held-out documents' pseudo-queries (as for selection_signal='pseudo-queries') "
                  "retrieve their own documents significantly better with it than with the PCA start (a one-sided paired "
                  "sign-flip test at training_guard_p), and otherwise keeps that start: the selected one, or the other one "
                  "where the pseudo-queries prefer it by the same test. The fit is then PCA, and its details say why."},
    )
    training_guard_p: float = field(
        default=0.05,
        metadata={"help": "With training_guard='pseudo-queries': the one-sided p-value below which the trained adapter is kept."},
    )
    max_train_docs: int | None = field(
        default=DEFAULT_TRAIN_DOCS,
        metadata={"help": f"Unsupervised mode: train on a seeded sample of at most this many documents, read from the corpus "
                  f"(a memory-mapped one included) without copying the rest; None: every document. Default {DEFAULT_TRAIN_DOCS}: "
                  "judged nDCG@10 on SciFact and ArguAna (MiniLM, k=128) barely moved past 1,000 (label-free agreement rises "
                  "slowly beyond; benchmarks/results/dive-scale), and the fit's time grows with the sample, not the corpus "
                  "(70 s at 1M x 384, one thread)."},
    )
    patience: int | None = field(
        default=None,
        metadata={"help": "Unsupervised mode with a selection signal: stop once it has not improved for this many epochs "
                  "(None: run every epoch). `epochs` is then the cap."},
    )
    device: str = field(default="auto", metadata={"help": "Torch device for training and transform: 'auto' (CUDA when available), 'cpu', 'cuda', ..."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar over epochs."})

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # The paper's single global configuration (Table 2, §4.1): the dataclass defaults.
        "paper": {},
        # Selected on validation queries only (benchmarks/dive_beyond.toml: 10 candidates over init,
        # objective and margin, SciFact + ArguAna, MiniLM), then scored once on held-out test;
        # see benchmarks/RESULTS.md, "Beyond the paper".
        "best": {"init": "pca", "margin": 0.4},
        # "best" plus the safety net (false-negative filter, triplet cap): keep the best epoch (0 = the PCA projection)
        # on half of the training queries, then refit. With ROBUST's false-negative filter and
        # triplet cap it does not collapse where the paper recipe does, and it costs nothing
        # significant on SciFact/ArguAna held-out test. The default (see ROBUST below).
        # Geometry distillation at γ = 100 (the paper: 10): chosen on the positive-disjoint selection
        # queries of SciFact's train qrels, MiniLM, k = 64 and 128 (best held-out nDCG@10 0.6021 / 0.6703
        # against 0.5865 / 0.6586 at γ = 10; 300 tied 100 at k = 128, and the smaller change won the
        # tie). Keeping the compressed similarities closer to the frozen ones lets training run longer
        # before it starts trading new documents for popular ones (benchmarks/RESULTS.md, "Seen and unseen").
        "robust": {"init": "pca", "margin": 0.4, "epoch_selection": "best", "selection_fraction": 0.5, "geometry_weight": 100.0,
                   "pca_start": "stronger"},
        # The robust recipe from before positive-disjoint selection: selection on hash-ranked training queries, whose
        # positives the fit shares, and always the uncentred start. It learns where this corpus's
        # popular documents lie: better on queries for them, worse on documents added later.
        "static-corpus": {"init": "pca", "margin": 0.4, "epoch_selection": "best", "selection_fraction": 0.5,
                          "selection_holdout": "random-queries", "pca_start": "uncentred"},
        # No labels: neighbour-rank distillation on the corpus from the better PCA start, the
        # epoch (0 included) selected on held-out documents (benchmarks/RESULTS.md, "Unsupervised
        # compression"). At most 50 corpus passes at lr 1e-3, batch 256 anchors,
        # stopping 5 epochs after the last improvement of the held-out signal.
        "unsupervised": _UNSUPERVISED,
        # No labels, with the corpus text: "unsupervised" plus the training documents' pseudo-queries as anchors, and
        # training kept only where the held-out documents' pseudo-queries retrieve them significantly better than from
        # the PCA start (at or above the stronger PCA variant in 8 of 10 collection × k cells, against 5 for
        # "unsupervised"; benchmarks/results/label-free-dive/REPORT.md).
        "unsupervised-guarded": {**_UNSUPERVISED, "pseudo_query_weight": 1.0, "training_guard": "pseudo-queries"},
    }

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "DIVEConfig":
        """A config from a named preset (see ``DIVEConfig.PRESETS``) plus field overrides."""
        if name not in cls.PRESETS:
            raise ValueError(f"DIVEConfig: unknown preset {name!r}; choose one of: {', '.join(sorted(cls.PRESETS))}.")
        return cls(**{**cls.PRESETS[name], **overrides})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "init": [Options(INIT_KINDS)],
        "epoch_selection": [Options(EPOCH_SELECTIONS)],
        "selection_fraction": [Interval(float, 0, 1, "neither")],
        "selection_holdout": [Options(SELECTION_HOLDOUTS)],
        "refit": [Options(REFITS)],
        "pca_start": [Options(PCA_STARTS)],
        "output_norm": [Options(OUTPUT_NORMS)],
        "mode": [Options(MODES)],
        "neighbors": [Interval(int, 1, None)],
        "holdout_docs": [Interval(int, 1, None)],
        "selection_signal": [Options(SELECTION_SIGNALS)],
        "training_guard": [Options(TRAINING_GUARDS)],
        "training_guard_p": [Interval(float, 0, 1, "neither")],
        "patience": [Interval(int, 1, None), None],
        "max_train_docs": [Interval(int, 2, None), None],
        "neighbor_temperature": [Interval(float, 0, None, "neither")],
        "heads": [Interval(int, 1, None), Options(("auto",))],
        "max_heads": [Interval(int, 1, None)],
        "view_weight": [Interval(float, 0, None)],
        "geometry_weight": [Interval(float, 0, None)],
        "weight_decay": [Interval(float, 0, None)],
        "pseudo_query_weight": [Interval(float, 0, None)],
        "temperature": [Interval(float, 0, None, "neither")],
        "learning_rate": [Interval(float, 0, None, "neither")],
        "margin": [Interval(float, None, None)],
        "batch_size": [Interval(int, 1, None)],
        "epochs": [Interval(int, 0, None)],
        "hidden_dim": [Interval(int, 1, None), None],
        "activation": [Options(sorted(ACTIVATION_NAMES))],
        "triplet_loss": [Options(TRIPLET_KINDS)],
        "device": [Text("a torch device string such as 'cpu', 'cuda' or 'auto'")],
    }

    def __post_init__(self) -> None:
        super().__post_init__()  # every field above, by its declared constraints
        check_quantization_aware(self.quantization_aware)
        # The view loss needs two views of each item (Appendix A.3: H = 1 has no positive pair).
        if self.view_weight > 0 and (self.heads == 1 or (self.heads == "auto" and self.max_heads < 2)):
            raise ValueError(
                "the view loss (view_weight > 0) needs at least 2 heads; set heads >= 2 (or max_heads >= 2 with "
                "heads='auto'), or set view_weight=0 to train without it."
            )
        if self.heads != "auto" and self.max_heads != 4:
            warnings.warn(f"DIVEConfig: max_heads={self.max_heads} is ignored because heads={self.heads} is fixed.")
        if not -2.0 < self.margin <= 2.0:
            # Δ is a difference of cosines, so it lies in [-2, 2].
            warnings.warn(f"DIVEConfig: margin={self.margin} is outside (-2, 2]; the hinge is then always or never active.")
        if self.triplet_loss == "softplus":
            warnings.warn("DIVEConfig: triplet_loss='softplus' is the 'w/o self-limiting' ablation; satisfied triplets keep producing gradient.")


def resolve_heads(heads: int | str, max_heads: int, dim: int, input_dim: int, view_weight: float) -> int:
    """The number of heads H for a ``input_dim``-d input; raises if ``dim * H`` cannot fit."""
    if dim > input_dim:
        raise ValueError(f"DIVE cannot compress {input_dim}-d input to dim={dim}: lower dim to at most {input_dim}.")
    if heads == "auto":
        resolved = min(max_heads, input_dim // dim)
        if resolved < 2 and view_weight > 0:
            raise ValueError(
                f"heads='auto' resolves to H={resolved} for {input_dim}-d input and dim={dim} "
                f"(H <= min(max_heads={max_heads}, {input_dim} // {dim})), but the view loss needs H >= 2. "
                f"Lower dim to at most {input_dim // 2}, or set view_weight=0."
            )
        return resolved
    heads = int(heads)
    if dim * heads > input_dim:
        raise ValueError(
            f"DIVE needs dim * heads <= input dim, but dim={dim} * heads={heads} = {dim * heads} > {input_dim}. "
            f"Lower heads to at most {input_dim // dim} (or use heads='auto'), or lower dim to at most {input_dim // heads}."
        )
    return heads
