"""The DIVE paper's protocol as a readable TOML config (``benchmarks/dive_paper.toml``).

Defaults reproduce the paper (§4.1): query-disjoint 60/20/20 split with seed 2027, final runs
on train+val with seeds 2027/2028/2029, shared deterministic triplets, DIVE at m=0.7, λ=0.01,
γ=10, τ=0.1, H=4 (or the largest feasible H).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedtune.compress import available_methods, get_compressor_class
from embedtune.compress.presets import MiningOptions

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


@dataclass
class ProtocolConfig:
    datasets: list[DatasetSpec] = field(metadata={"help": 'The [[datasets]] entries: name, data folder and the dims of the grid.'})
    backbones: list[BackboneSpec] = field(metadata={"help": 'The [[backbones]] entries: name, model alias or folder, and the output dims k.'})
    methods: list[str] = field(default_factory=available_methods, metadata={"help": 'Registered compressors to run (default: every registered one).'})
    studies: list[str] = field(default_factory=lambda: list(STUDIES), metadata={"help": 'Which studies to run: main, ablation, unsupervised, lr_audit, heads, dynamics, significance, variants, preset.'})
    split_seed: int = field(default=2027, metadata={"help": 'Seed of the sha256 ranking that cuts the judged queries into train/val/test.'})
    fractions: tuple[float, float, float] = field(default=(0.6, 0.2, 0.2), metadata={"help": 'Train, val and test shares of the judged queries (the paper protocol).'})
    qrels_split: str = field(default="test", metadata={"help": 'The qrels file whose judged queries are split (qrels/<split>.tsv).'})
    final_seeds: list[int] = field(default_factory=lambda: [2027, 2028, 2029], metadata={"help": 'Training seeds of the scored runs; mean and spread are reported over them.'})
    selection_seeds: list[int] = field(default_factory=lambda: [2027, 2028, 2029], metadata={"help": 'Training seeds of the learning-rate and preset selection runs.'})
    n_negatives: int = field(default=4, metadata={"help": 'Hard negatives mined per (query, positive) pair.'})
    negatives: str = field(default="hard", metadata={"help": "How negatives are drawn: 'hard' (the frozen model's top-ranked non-positives) or 'random'."})
    # False-negative filter and cap of the shared triplets (see embedtune.data.triplets.mine_triplets);
    # the defaults are the paper's plain top-50 mining.
    skip_top: int = field(default=0, metadata={"help": "Skip this many top-ranked candidates before mining negatives (0: the paper's plain top-50)."})
    false_negative_margin: float | None = field(default=None, metadata={"help": 'Drop a candidate scoring within this margin of the positive (a likely false negative); None: keep all.'})
    false_negative_reference: str = field(default="pair", metadata={"help": "What the margin is measured from: 'pair' (the pair's own positive) or 'query-min' (the query's lowest-scored positive)."})
    max_triplets_per_query: int | None = field(default=None, metadata={"help": 'Cap on triplets per query, so popular queries do not dominate; None: no cap.'})
    heads: int = field(default=4, metadata={"help": 'DIVE heads H of the main grid.'})
    head_values: list[int] = field(default_factory=lambda: [2, 4, 8], metadata={"help": 'The H values of the heads study.'})
    ablations: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(DEFAULT_ABLATIONS), metadata={"help": 'Named DIVE ablations: {name: config overrides}.'})
    lr_candidates: dict[str, list[float]] = field(default_factory=default_lr_candidates, metadata={"help": 'Three learning rates per method for the learning-rate audit (chosen on validation queries).'})
    method_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": 'Config overrides per method: {method: {field: value}}.'})
    # Beyond the paper: named DIVE settings scored on held-out test ("variants"), and candidates
    # for the validation-selected preset ("preset"), e.g. {"pca": {"init": "pca"}}.
    variants: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": 'Named DIVE settings beyond the paper, scored on held-out test: {name: config overrides}.'})
    preset_candidates: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": "Candidates of the validation-selected preset: {name: config overrides}; needs a 'paper' entry."})
    # "paper": 60/20/20 of the test qrels' judged queries; "beir-train": train/val from
    # qrels/train.tsv (val_fraction held out), test = every judged test query.
    protocol: str = field(default="paper", metadata={"help": "'paper': a query-disjoint 60/20/20 split of the test qrels; 'beir-train': train/val from qrels/train.tsv, test on every judged test query."})
    val_fraction: float = field(default=0.2, metadata={"help": "With 'beir-train': the share of the training queries held out for validation."})
    n_resamples: int = field(default=10_000, metadata={"help": 'Resamples of the paired bootstrap and randomisation tests.'})
    results_dir: str = field(default="benchmarks/results/dive", metadata={"help": "Folder of the grid's run records and summary (read to resume)."})
    threads: int = field(default=1, metadata={"help": 'Torch threads per run.'})
    source: str = field(default="<defaults>", metadata={"help": 'Where the config was read from (for error messages).'})

    def __post_init__(self) -> None:
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
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"{self.source}: [protocol] protocol must be one of {list(PROTOCOLS)}; got {self.protocol!r}.")
        if not isinstance(self.val_fraction, (int, float)) or not 0 < self.val_fraction < 1:
            raise ValueError(f"{self.source}: [protocol] val_fraction must be a number in (0, 1); got {self.val_fraction!r}.")
        if "preset" in self.studies and self.preset_candidates and "paper" not in self.preset_candidates:
            raise ValueError(f"{self.source}: [studies.preset_candidates] needs a 'paper' entry (the reference, usually {{}}).")
        if not self.datasets or not self.backbones:
            raise ValueError(f"{self.source}: give at least one [[datasets]] and one [[backbones]] entry.")
        try:
            self.mining()
        except ValueError as error:
            raise ValueError(f"{self.source} [protocol]: {str(error).removeprefix('mining: ')}") from None

    def mining(self) -> MiningOptions:
        """The shared triplets' mining (validated by :class:`MiningOptions`)."""
        return MiningOptions(self.negatives, self.n_negatives, self.skip_top, self.false_negative_margin,
                             self.false_negative_reference, self.max_triplets_per_query)


def load_protocol_config(path: str | Path | None = None, **overrides: Any) -> ProtocolConfig:
    """Read the TOML file (or the built-in paper defaults when ``path`` is None)."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
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
    datasets = [DatasetSpec(d["name"], d["path"]) for d in raw.get("datasets", [])] or [
        DatasetSpec("scifact", "../shared/data/beir/scifact"),
        DatasetSpec("arguana", "../shared/data/beir/arguana"),
    ]
    backbones = [BackboneSpec(b["name"], b.get("model", b["name"]), tuple(b["dims"])) for b in raw.get("backbones", [])] or [
        BackboneSpec("minilm", "minilm", (64, 128)),
        BackboneSpec("mpnet", "mpnet", (128, 256)),
    ]
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
