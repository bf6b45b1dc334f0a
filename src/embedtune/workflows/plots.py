"""Training curves as PNGs, where a person would rather look than read a log.

- :func:`plot_dive_training`: DIVE's ``training_log.jsonl`` -> ``training.png``: the active ratio
  ρ(t), each weighted loss term, and validation nDCG@10 by epoch, the selected epoch marked.
- :func:`plot_pace_training`: a PACE run's training record (``results.json``'s ``details``: the trainer's log history) and,
  when a validation callback ran, its ``validation.jsonl`` -> ``training.png``: loss, learning
  rate and validation nDCG@10 by optimizer update, the Stage II start marked.

Legends sit below each panel, outside the axes, so they never cover a curve. matplotlib is
imported inside the functions: it is heavy, and only these plots need it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from embedtune.io import atomic_write
from embedtune.workflows.train_compressor import CompressionResult, compressor_dir

__all__ = ["TRAINING_PLOT_NAME", "read_jsonl", "plot_dive_training", "plot_pace_training", "plot_compression_runs"]

TRAINING_PLOT_NAME = "training.png"
# DIVE's weighted loss terms (what the optimiser sums), in the order they are drawn.
_DIVE_TERMS = (("weighted_triplet", "triplet"), ("weighted_view", "view × weight"), ("weighted_geometry", "geometry × weight"),
               ("loss_total", "total"))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _figure(n_panels: int, title: str):
    from matplotlib.figure import Figure  # heavy optional dependency; the object API keeps pyplot's global state out

    figure = Figure(figsize=(4.6 * n_panels, 4.2), layout="constrained")
    axes = figure.subplots(1, n_panels, squeeze=False)[0]
    figure.suptitle(title, fontsize=11)
    return figure, axes


def _legend_below(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)


def _save(figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy optional dependency (see _figure)

    FigureCanvasAgg(figure)
    return atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=110, format="png"))


def _phases(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    phases: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        phases.setdefault(str(row.get("phase", "train")), []).append(row)
    return phases


def plot_dive_training(log: str | Path | Sequence[Mapping[str, Any]], out: str | Path, selected_epoch: int | None = None,
                       title: str = "DIVE training") -> Path | None:
    """Draw DIVE's per-epoch log into ``out`` (a PNG); None when the log has no epochs.

    Args:
        log: ``training_log.jsonl`` (or its rows): one row per epoch with ``active_ratio``, the
            ``weighted_*`` loss terms and ``loss_total``; ``phase`` is ``select`` (the run that picks
            the epoch count on held-out training queries, with ``holdout_ndcg@10``) or ``refit``
            (the final weights); without ``phase`` one run trained the final weights.
        selected_epoch: the epoch count the final weights were trained for; by default read from
            the log (the number of ``refit`` epochs when a selection ran).
    """
    rows = read_jsonl(log) if isinstance(log, (str, Path)) else list(log)
    if not rows:
        return None
    phases = _phases(rows)
    if selected_epoch is None and "select" in phases:
        selected_epoch = len(phases.get("refit", []))
    final = "refit" if phases.get("refit") else "train" if "train" in phases else "select"
    styles = {"select": ("-", "epoch selection"), "refit": ("--", "refit (final weights)"), "train": ("-", "training")}

    figure, (rho_ax, loss_ax, val_ax) = _figure(3, title)
    for phase, phase_rows in phases.items():
        style, label = styles.get(phase, ("-", phase))
        rho_ax.plot([r["epoch"] for r in phase_rows], [r["active_ratio"] for r in phase_rows], style, label=label)
    rho_ax.set(title="active ratio ρ(t)", xlabel="epoch", ylabel="ρ: share of triplets with a loss")

    final_rows = phases[final]
    for key, label in _DIVE_TERMS:
        points = [(r["epoch"], r[key]) for r in final_rows if key in r and r[key] > 0]
        if points:
            loss_ax.plot(*zip(*points), "-" if key != "loss_total" else "k-", label=label, linewidth=1.2 if key != "loss_total" else 1.8)
    loss_ax.set_yscale("log")
    loss_ax.set(title=f"weighted loss terms, {styles.get(final, ('', final))[1]}", xlabel="epoch", ylabel="loss (log scale)")

    drew = False
    for key, label in (("holdout_ndcg@10", "held-out training queries"), ("val_ndcg@10", "validation queries")):
        for phase, phase_rows in phases.items():
            points = [(r["epoch"], r[key]) for r in phase_rows if r.get(key) is not None]
            if points:
                suffix = f" ({styles.get(phase, ('', phase))[1]})" if key == "val_ndcg@10" and len(phases) > 1 else ""
                val_ax.plot(*zip(*points), "o-", markersize=2.5, label=label + suffix)
                drew = True
    val_ax.set(title="held-out nDCG@10", xlabel="epoch", ylabel="nDCG@10")
    if not drew:
        val_ax.text(0.5, 0.5, "no validation scores in this log\n(epoch_selection='last', no val queries)",
                    ha="center", va="center", transform=val_ax.transAxes, fontsize=9, color="0.4")
    if selected_epoch is not None:
        for ax in (rho_ax, loss_ax, val_ax):
            ax.axvline(selected_epoch, color="tab:red", linestyle=":", linewidth=1.3,
                       label=f"selected epoch {selected_epoch}" + (" (initialisation)" if selected_epoch == 0 else ""))
    for ax in (rho_ax, loss_ax, val_ax):
        ax.grid(alpha=0.3)
        _legend_below(ax)
    return _save(figure, Path(out))


def plot_pace_training(result: str | Path | Mapping[str, Any], out: str | Path,
                       validation_log: str | Path | Sequence[Mapping[str, Any]] | None = None,
                       title: str = "PACE training") -> Path | None:
    """Draw a PACE run's loss and learning rate (and validation nDCG@10) by optimizer update into ``out``.

    Args:
        result: the run's training record (``results.json``'s ``details``, :meth:`PACEResult.to_dict`): each stage's
            ``log_history`` and ``stage2_init_step``.
        validation_log: ``validation.jsonl`` rows of a :class:`embedtune.finetune.validation.ValidationCallback`
            (``stage``, ``update``, ``ndcg@10``); the panel is left out without one.

    Stage II updates are counted on from the Stage I checkpoint it started from, so both stages
    share the x axis of the final model's path. None when no stage logged a loss.
    """
    if isinstance(result, (str, Path)):
        result = json.loads(Path(result).read_text(encoding="utf-8"))
    init_step = result.get("stage2_init_step")
    curves: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for stage in result.get("stages", []):
        name = stage.get("name", "stage")
        offset = init_step if name == "stage2" and init_step is not None else 0
        for entry in stage.get("log_history", []):
            if "loss" not in entry or "step" not in entry:
                continue
            update = entry["step"] + offset
            curves.setdefault("loss", {}).setdefault(name, []).append((update, entry["loss"]))
            if "learning_rate" in entry:
                curves.setdefault("learning_rate", {}).setdefault(name, []).append((update, entry["learning_rate"]))
    if not curves.get("loss"):
        return None
    validation: list[Mapping[str, Any]] = []
    if validation_log is not None:
        validation = read_jsonl(validation_log) if isinstance(validation_log, (str, Path)) else list(validation_log)
    panels = [("loss", "training loss", "loss"), ("learning_rate", "learning rate", "lr")]
    if validation:
        panels.append(("validation", "validation nDCG@10", "nDCG@10"))
    figure, axes = _figure(len(panels), title)
    for ax, (key, panel_title, ylabel) in zip(axes, panels):
        if key == "validation":
            by_stage: dict[str, list[tuple[float, float]]] = {}
            for row in validation:
                by_stage.setdefault(str(row.get("stage", "stage1")), []).append((row["update"], row["ndcg@10"]))
            for name, points in by_stage.items():
                ax.plot(*zip(*sorted(points)), "o-", markersize=3, label=name)
        else:
            for name, points in curves.get(key, {}).items():
                ax.plot(*zip(*points), "-", marker="." if len(points) < 30 else None, label=name)
        if init_step is not None:
            ax.axvline(init_step, color="tab:red", linestyle=":", linewidth=1.3, label=f"Stage II starts (Stage I step {init_step})")
        ax.set(title=panel_title, xlabel="optimizer update (final model's path)", ylabel=ylabel)
        ax.grid(alpha=0.3)
        _legend_below(ax)
    return _save(figure, Path(out))


def plot_compression_runs(result: CompressionResult, label: str = "") -> list[Path]:
    """``training.png`` next to each saved compressor's ``training_log.jsonl`` (DIVE's); methods without a log are skipped.

    ``label`` (e.g. ``"scifact / minilm"``) goes into each title.
    """
    if result.out is None:
        return []
    written = []
    for method, runs in result.runs.items():
        for run in runs:
            folder = compressor_dir(result.out, method, run.seed, len(runs))
            log = folder / "training_log.jsonl"
            rows = read_jsonl(log) if log.is_file() else []
            if not rows or "active_ratio" not in rows[0]:
                continue
            seed = f", seed {run.seed}" if len(runs) > 1 else ""
            title = f"{method} {run.details.get('out_dim', run.dim)}-d{seed}" + (f": {label}" if label else "")
            path = plot_dive_training(rows, folder / TRAINING_PLOT_NAME, getattr(run.compressor, "selected_epoch_", None), title)
            if path is not None:
                written.append(path)
    return written
