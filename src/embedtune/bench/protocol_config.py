"""The DIVE paper's protocol as a readable TOML config (``benchmarks/dive_paper.toml``).

Defaults reproduce the paper (§4.1): query-disjoint 60/20/20 split with seed 2027, final runs
on train+val with seeds 2027/2028/2029, shared deterministic triplets, DIVE at m=0.7, λ=0.01,
γ=10, τ=0.1, H=4 (or the largest feasible H).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from embedtune.compress import available_methods, get_compressor_class
from embedtune.compress.presets import MiningOptions
from embedtune.constraints import Constraint, Interval, Options, Text, validate_constraints
from embedtune.data.triplets import MINING_CONSTRAINTS, check_random_negatives

__all__ = ["ProtocolConfig", "DatasetSpec", "BackboneSpec", "load_protocol_config", "STUDIES", "audited_methods", "default_lr_candidates"]

STUDIES = ["main", "ablation", "unsupervised", "lr_audit", "heads", "dynamics", "significance", "variants", "preset"]
PROTOCOLS = ("paper", "beir-train")
DEFAULT_ABLATIONS = {
    "dive": {},
    "w/o self-limiting": {"triplet_loss": "softplus"},
    "w/o contrast": {"view_weight": 0.0},
    "w/o geometry": {"geometry_weight": 0.0},
}
# Scalar/list keys of the [protocol] table, read as they are ("fractions" becomes a tuple).
PROTOCOL_KEYS = ("methods", "studies", "split_seed", "qrels_split", "final_seeds", "selection_seeds", "n_negatives", "negatives",
                 "skip_top", "false_negative_margin", "false_negative_reference", "max_triplets_per_query",
                 "heads", "head_values", "n_resamples", "results_dir", "threads", "protocol", "val_fraction")


def audited_methods() -> list[str]:
    """The methods of the learning-rate audit: registered methods that declare ``lr_candidates``, in registry order."""
    return [m for m in available_methods() if get_compressor_class(m).lr_candidates]


def default_lr_candidates() -> dict[str, list[float]]:
    """Each audited method's ``lr_candidates``, from the registry."""
    return {m: list(get_compressor_class(m).lr_candidates) for m in audited_methods()}


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    path: str


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    model: str
    dims: tuple[int, ...]


#: The grid of the paper when the TOML names none (``[[datasets]]``, ``[[backbones]]``).
DEFAULT_DATASETS = (DatasetSpec("scifact", "../shared/data/beir/scifact"), DatasetSpec("arguana", "../shared/data/beir/arguana"))
DEFAULT_BACKBONES = (BackboneSpec("minilm", "minilm", (64, 128)), BackboneSpec("mpnet", "mpnet", (128, 256)))
#: ``source`` of a config not read from a file (its errors name no file).
DEFAULT_SOURCE = "<defaults>"
#: The [protocol] keys of the shared triplets' mining: MiningOptions fields, declared there.
MINING_KEYS = ("n_negatives", "negatives", "skip_top", "false_negative_margin", "false_negative_reference", "max_triplets_per_query")


@dataclass
class ProtocolConfig:
    """The protocol of ``embedtune benchmark dive`` (``benchmarks/dive_paper.toml``); every default is the paper's.

    What each [protocol] value accepts is declared once, in ``_parameter_constraints`` (the mining keys:
    :class:`MiningOptions`' own declarations); the method and study names are checked against the registry.
    """

    datasets: list[DatasetSpec] = field(default_factory=lambda: list(DEFAULT_DATASETS), metadata={
        "help": "The [[datasets]] entries: name, data folder and the dims of the grid (default: scifact and arguana under ../shared/data/beir)."})
    backbones: list[BackboneSpec] = field(default_factory=lambda: list(DEFAULT_BACKBONES), metadata={
        "help": "The [[backbones]] entries: name, model alias or folder, and the output dims k (default: minilm at 64 and 128, mpnet at 128 and 256)."})
    methods: list[str] = field(default_factory=available_methods, metadata={"help": "Registered compressors to run (default: every registered one)."})
    studies: list[str] = field(default_factory=lambda: list(STUDIES), metadata={
        "help": f"Which studies to run (default: all of them: {', '.join(STUDIES)})."})
    split_seed: int = field(default=2027, metadata={"help": "Seed of the sha256 ranking that cuts the judged queries into train/val/test (default: 2027)."})
    fractions: tuple[float, float, float] = field(default=(0.6, 0.2, 0.2), metadata={
        "help": "Train, val and test shares of the judged queries, the paper protocol (default: (0.6, 0.2, 0.2))."})
    qrels_split: str = field(default="test", metadata={"help": "The qrels file whose judged queries are split, qrels/<split>.tsv (default: 'test')."})
    final_seeds: list[int] = field(default_factory=lambda: [2027, 2028, 2029], metadata={
        "help": "Training seeds of the scored runs; mean and spread are reported over them (default: 2027, 2028 and 2029)."})
    selection_seeds: list[int] = field(default_factory=lambda: [2027, 2028, 2029], metadata={
        "help": "Training seeds of the learning-rate and preset selection runs (default: 2027, 2028 and 2029)."})
    # The shared triplets' mining (MiningOptions); the defaults are the paper's plain top-50 mining.
    n_negatives: int = field(default=4, metadata={"help": "Hard negatives mined per (query, positive) pair (default: 4)."})
    negatives: str = field(default="hard", metadata={
        "help": "How negatives are drawn: 'hard' (the frozen model's top-ranked non-positives) or 'random' (default: 'hard')."})
    skip_top: int = field(default=0, metadata={"help": "Skip this many top-ranked candidates before mining negatives (default: 0, the paper's plain top-50)."})
    false_negative_margin: float | None = field(default=None, metadata={
        "help": "Drop a candidate scoring within this margin of the positive, a likely false negative; None: keep all (default: None)."})
    false_negative_reference: str = field(default="pair", metadata={
        "help": "What the margin is measured from: 'pair' (the pair's own positive) or 'query-min' (the query's lowest-scored positive) (default: 'pair')."})
    max_triplets_per_query: int | None = field(default=None, metadata={
        "help": "Cap on triplets per query, so popular queries do not dominate; None: no cap (default: None)."})
    heads: int = field(default=4, metadata={"help": "DIVE heads H of the main grid, the largest H tried (default: 4)."})
    head_values: list[int] = field(default_factory=lambda: [2, 4, 8], metadata={"help": "The H values of the heads study (default: 2, 4 and 8)."})
    ablations: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(DEFAULT_ABLATIONS), metadata={
        "help": "Named DIVE ablations: {name: config overrides} (default: the paper's: w/o self-limiting, w/o contrast, w/o geometry)."})
    lr_candidates: dict[str, list[float]] = field(default_factory=default_lr_candidates, metadata={
        "help": "Three learning rates per method for the learning-rate audit, chosen on validation queries (default: each method's lr_candidates)."})
    method_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Config overrides per method: {method: {field: value}} (default: none)."})
    # Beyond the paper: named DIVE settings scored on held-out test ("variants"), and candidates
    # for the validation-selected preset ("preset"), e.g. {"pca": {"init": "pca"}}.
    variants: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Named DIVE settings beyond the paper, scored on held-out test: {name: config overrides} (default: none)."})
    preset_candidates: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Candidates of the validation-selected preset: {name: config overrides}; needs a 'paper' entry (default: none)."})
    # "paper": 60/20/20 of the test qrels' judged queries; "beir-train": train/val from
    # qrels/train.tsv (val_fraction held out), test = every judged test query.
    protocol: str = field(default="paper", metadata={
        "help": "'paper': a query-disjoint 60/20/20 split of the test qrels; 'beir-train': train/val from qrels/train.tsv, "
                "test on every judged test query (default: 'paper')."})
    val_fraction: float = field(default=0.2, metadata={"help": "With 'beir-train': the share of the training queries held out for validation (default: 0.2)."})
    n_resamples: int = field(default=10_000, metadata={"help": "Resamples of the paired bootstrap and randomisation tests (default: 10000)."})
    results_dir: str = field(default="benchmarks/results/dive", metadata={
        "help": "Folder of the grid's run records and summary, read to resume (default: 'benchmarks/results/dive')."})
    threads: int = field(default=1, metadata={"help": "Torch threads per run (default: 1)."})
    source: str = field(default=DEFAULT_SOURCE, metadata={"help": f"Where the config was read from, for error messages (default: {DEFAULT_SOURCE!r})."})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "split_seed": [Interval(int, None, None)],
        "qrels_split": [Text("a qrels split name such as 'test'")],
        **{key: MINING_CONSTRAINTS[key] for key in MINING_KEYS},
        "heads": [Interval(int, 1, None)],
        "protocol": [Options(PROTOCOLS)],
        "val_fraction": [Interval(float, 0, 1, "neither")],
        "n_resamples": [Interval(int, 1, None)],
        "results_dir": [Text("a folder path")],
        "threads": [Interval(int, 1, None)],
    }

    def __post_init__(self) -> None:
        where = "" if self.source == DEFAULT_SOURCE else f"{self.source} [protocol]: "
        try:
            validate_constraints(self)
            check_random_negatives(self.negatives, self.skip_top, self.false_negative_margin)
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        registered = available_methods()
        for table, names in (("methods", self.methods), ("lr_candidates", list(self.lr_candidates)),
                             ("method_overrides", list(self.method_overrides))):
            unknown = [m for m in names if m not in registered]
            if unknown:
                raise ValueError(f"{self.source}: field '{table}' has unknown methods {unknown}; registered: {registered}.")
        unknown = [s for s in self.studies if s not in STUDIES]
        if unknown:
            raise ValueError(f"{self.source}: field 'studies' has unknown entries {unknown}; valid: {STUDIES}.")
        for method, candidates in self.lr_candidates.items():
            if len(candidates) != 3:
                raise ValueError(f"{self.source}: lr_candidates.{method} must list exactly three learning rates (the paper's audit); got {candidates}.")
        if "preset" in self.studies and self.preset_candidates and "paper" not in self.preset_candidates:
            raise ValueError(f"{self.source}: [studies.preset_candidates] needs a 'paper' entry (the reference, usually {{}}).")
        if not self.datasets or not self.backbones:
            raise ValueError(f"{self.source}: give at least one [[datasets]] and one [[backbones]] entry.")

    def mining(self) -> MiningOptions:
        """The shared triplets' mining (validated by :class:`MiningOptions`)."""
        return MiningOptions(self.negatives, self.n_negatives, self.skip_top, self.false_negative_margin,
                             self.false_negative_reference, self.max_triplets_per_query)


def load_protocol_config(path: str | Path | None = None, **overrides: Any) -> ProtocolConfig:
    """Read the TOML file (or the built-in paper defaults when ``path`` is None)."""
    raw: dict[str, Any] = {}
    source = DEFAULT_SOURCE
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: protocol config not found.")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: invalid TOML ({error}).") from error
        source = str(path)
    protocol = dict(raw.get("protocol", {}))
    datasets = [DatasetSpec(d["name"], d["path"]) for d in raw.get("datasets", [])] or list(DEFAULT_DATASETS)
    backbones = [BackboneSpec(b["name"], b.get("model", b["name"]), tuple(b["dims"])) for b in raw.get("backbones", [])] or list(DEFAULT_BACKBONES)
    studies_cfg = raw.get("studies", {})
    values: dict[str, Any] = {"datasets": datasets, "backbones": backbones, "source": source}
    unknown = sorted(set(protocol) - set(PROTOCOL_KEYS) - {"fractions"})
    if unknown:
        raise ValueError(f"{source}: unknown [protocol] keys {unknown}; valid: {sorted([*PROTOCOL_KEYS, 'fractions'])}.")
    for key in PROTOCOL_KEYS:
        if key in protocol:
            values[key] = protocol[key]
    if "fractions" in protocol:
        values["fractions"] = tuple(protocol["fractions"])
    if "ablations" in studies_cfg:
        values["ablations"] = {name: dict(v) for name, v in studies_cfg["ablations"].items()}
    for table in ("variants", "preset_candidates"):
        if table in studies_cfg:
            values[table] = {name: dict(v) for name, v in studies_cfg[table].items()}
    if "lr_candidates" in studies_cfg:
        values["lr_candidates"] = {m: list(v) for m, v in studies_cfg["lr_candidates"].items()}
    if "method_overrides" in raw:
        values["method_overrides"] = {m: dict(v) for m, v in raw["method_overrides"].items()}
    known = set(ProtocolConfig.__dataclass_fields__)
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in known:
            raise ValueError(f"unknown protocol override {key!r}.")
        values[key] = value
    return ProtocolConfig(**values)
