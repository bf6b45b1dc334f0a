"""Named recipes for fitting a compressor: config overrides plus how its triplets are mined.

A :class:`Preset` is what ``compress train --preset NAME`` and
:func:`embedtune.workflows.fit_compressor` apply. Each compressor class lists its presets in
``Compressor.presets``; DIVE's default, ``robust``, is :data:`embedtune.compress.dive.ROBUST`.

:class:`MiningOptions` is the single place the triplet-mining options are validated: the CLI,
the protocol TOML and :func:`embedtune.workflows.shared_triplets` all build one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from embedtune.constraints import Constraint, validate_constraints
from embedtune.data.triplets import MINING_CONSTRAINTS, check_random_negatives, mining_options

__all__ = ["MiningOptions", "Preset", "presets_from_config", "SAFETY_NET_MINING", "SAFETY_NET_SETTINGS", "safety_net_preset",
           "with_safety_net"]


@dataclass(frozen=True)
class MiningOptions:
    """How the shared training triplets are mined (see :func:`embedtune.data.triplets.mine_triplets`).

    The defaults are the DIVE paper's plain mining: top-50 hard negatives, no filter, no cap. What each
    field accepts is declared once, in :data:`embedtune.data.triplets.MINING_CONSTRAINTS`.
    """

    negatives: str = field(default="hard", metadata={
        "help": "'hard' (the frozen model's top-50 non-relevant docs) or 'random' (default: 'hard')"})
    n_negatives: int = field(default=4, metadata={"help": "Negatives per (query, relevant doc) pair (default: 4)"})
    skip_top: int = field(default=0, metadata={
        "help": "Hard negatives: never use the frozen model's top-N non-relevant docs, likely unjudged positives (default: 0)"})
    false_negative_margin: float | None = field(default=None, metadata={
        "help": "Hard negatives: drop candidates scoring above score(query, positive) - margin; None: no filter (default: None)"})
    false_negative_reference: str = field(default="pair", metadata={
        "help": "The positive score the margin is taken from: 'pair' (the pair's own) or 'query-min' (the query's lowest, as "
                "sentence-transformers does) (default: 'pair')"})
    max_triplets_per_query: int | None = field(default=None, metadata={
        "help": "Cap on each query's triplets, spread over its relevant docs; None: no cap (default: None)"})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = MINING_CONSTRAINTS

    def __post_init__(self) -> None:
        validate_constraints(self)
        check_random_negatives(self.negatives, self.skip_top, self.false_negative_margin)

    def replace(self, **changes: Any) -> "MiningOptions":
        """A copy with ``changes`` applied (and validated).

        Switching to ``negatives='random'`` also resets the false-negative filter (it ranks hard
        candidates) unless ``changes`` set it; the cap is kept.
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown mining options {unknown}; valid: {[f.name for f in dataclasses.fields(self)]}.")
        if changes.get("negatives") == "random":
            changes = {"skip_top": 0, "false_negative_margin": None, "false_negative_reference": "pair", **changes}
        return dataclasses.replace(self, **changes)

    def filter_options(self) -> dict[str, Any]:
        """The false-negative filter and cap, as keyword arguments of ``mine_triplets``."""
        return {
            "skip_top": self.skip_top,
            "false_negative_margin": self.false_negative_margin,
            "false_negative_reference": self.false_negative_reference,
            "max_triplets_per_query": self.max_triplets_per_query,
        }

    def non_default(self) -> dict[str, Any]:
        """The filter and cap that differ from the defaults (what a triplet file's metadata records)."""
        return mining_options(**self.filter_options())


@dataclass(frozen=True)
class Preset:
    """A named recipe: config field overrides plus the mining of the shared triplets.

    Args:
        name: what ``--preset`` calls it.
        settings: config field overrides, applied before the user's own.
        mining: how the triplets are mined (used by supervised methods only).
        help: one line for ``--help``.
        pseudo_queries: the training-only pseudo-queries the recipe builds from the documents' own
            text (``"title"`` or ``"first-sentence"``; :mod:`embedtune.data.pseudo_queries`), or None.
            Without text and a model (own vectors) the recipe trains without them and says so.
    """

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    mining: MiningOptions = field(default_factory=MiningOptions)
    help: str = ""
    pseudo_queries: str | None = None


def presets_from_config(config_class: type) -> dict[str, Preset]:
    """Wrap a config class's ``PRESETS`` (name -> field overrides) as :class:`Preset` objects with default mining."""
    return {name: Preset(name, overrides) for name, overrides in getattr(config_class, "PRESETS", {}).items()}


#: The safety net's mining: drop hard negatives scoring above the query's lowest
#: positive minus 0.05 (likely unjudged positives) and keep at most 32 triplets per query.
SAFETY_NET_MINING = MiningOptions(false_negative_margin=0.05, false_negative_reference="query-min", max_triplets_per_query=32)

#: The safety net's training settings, for every method whose config has them (DIVE and
#: :class:`embedtune.compress.selection.SelectableTrainingConfig`): start at the stronger of the
#: uncentred and the centred corpus PCA projection on the selection queries, and keep the best
#: epoch, epoch 0 included, on half of the training queries.
SAFETY_NET_SETTINGS: Mapping[str, Any] = {"init": "pca", "epoch_selection": "best", "selection_fraction": 0.5, "pca_start": "stronger"}


def safety_net_preset(name: str = "robust", settings: Mapping[str, Any] | None = None, help: str = "") -> Preset:
    """A preset with the safety net: :data:`SAFETY_NET_SETTINGS` (plus ``settings``) and :data:`SAFETY_NET_MINING`."""
    return Preset(
        name, {**SAFETY_NET_SETTINGS, **(settings or {})}, SAFETY_NET_MINING,
        help=help or "PCA-rotated start, best epoch (0 included) on half of the training queries, "
        "false-negative-filtered and capped triplets (the default of compress fit/train)",
    )


def with_safety_net(presets: Mapping[str, Preset]) -> dict[str, Preset]:
    """``presets`` plus ``robust`` (:func:`safety_net_preset`), for a supervised method's ``presets`` trait."""
    return {**presets, "robust": safety_net_preset()}
