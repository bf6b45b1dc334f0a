"""A SentenceTransformerTrainer that logs the focal-loss components, and the stage callbacks.

A stage draws one progress bar over its optimizer steps (:class:`StepProgressCallback`, loss and
learning rate in its postfix); the per-step log lines, with every loss component, are DEBUG
(``embedtune -v``), and all of them stay in the trainer's ``log_history``.
"""

from __future__ import annotations

import logging
import time

from sentence_transformers import SentenceTransformerTrainer
from transformers import PrinterCallback, TrainerCallback

from embedtune.finetune.modeling import has_lora, load_adapter_weights
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["PACETrainer", "StageCheckpointCallback", "LoggingCallback", "StepProgressCallback"]


def _duration(seconds: float) -> str:
    """``95`` -> ``"1:35 min"``, ``4000`` -> ``"1:07 h"``."""
    minutes = int(round(seconds / 60))
    if seconds < 3600:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d} min"
    return f"{minutes // 60}:{minutes % 60:02d} h"


class LoggingCallback(TrainerCallback):
    """Send the trainer's logs to ``logging`` at DEBUG (stderr, ``embedtune -v``) instead of printing them to stdout."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            logger.debug("step %d: %s", state.global_step, ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in logs.items()))
        return control


class StepProgressCallback(TrainerCallback):
    """One bar over a stage's optimizer steps, with the latest loss and learning rate in its postfix.

    Drawn by the main process only; a resumed stage starts the bar at its checkpoint's step.

    Args:
        desc: the bar's label, e.g. ``"PACE stage1"``.
        enabled: False draws nothing (``embedtune --quiet`` hides every bar anyway).
    """

    def __init__(self, desc: str, enabled: bool = True) -> None:
        self.desc = desc
        self.enabled = enabled
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = progress_bar(state.max_steps, self.desc, unit="step", initial=state.global_step, enabled=self.enabled)
            self._started, self._first_step = time.perf_counter(), state.global_step
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None and state.global_step > self.bar.n:
            self.bar.update(state.global_step - self.bar.n)
        if state.is_world_process_zero and state.global_step == getattr(self, "_first_step", -2) + 1:
            # Said once, after the first step: how long the whole stage will take at this pace (minutes per step on a CPU).
            seconds = time.perf_counter() - self._started
            left = max(0, state.max_steps - state.global_step)
            if left and seconds * left > 120:
                logger.info("%s: the first step took %s; the %d steps will take about %s at this pace (fewer: --stage1-steps/"
                            "--stage2-steps or --steps)", self.desc, _duration(seconds), state.max_steps,
                            _duration(seconds * state.max_steps))
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            postfix = {"loss": f"{logs['loss']:.4f}"}
            if "learning_rate" in logs:
                postfix["lr"] = f"{logs['learning_rate']:.2e}"
            self.bar.set_postfix(postfix)  # on_log runs after on_step_end: redraw, or the bar shows the step before
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        return control


def _no_widget_examples(dataset) -> None:
    """Stands in for ``SentenceTransformerModelCardData.set_widget_examples`` in a fine-tune (no widget, no bar)."""


class PACETrainer(SentenceTransformerTrainer):
    """``SentenceTransformerTrainer`` whose training logs also carry the loss components
    (``mean_weight``, ``mean_confidence``, ``positive_accuracy``), averaged since the last log,
    and go to ``logging`` rather than stdout (so ``--json`` output stays parseable)."""

    def __init__(self, *args, **kwargs) -> None:
        model = kwargs.get("model", args[0] if args else None)
        card = getattr(model, "model_card_data", None)
        if card is not None and not getattr(card, "widget", None):
            # sentence-transformers fills a Hub model card's widget from the training data when the
            # trainer starts, under its own "Computing widget examples" bar: nothing a fine-tune needs.
            card.set_widget_examples = _no_widget_examples
        super().__init__(*args, **kwargs)
        self.remove_callback(PrinterCallback)
        self.add_callback(LoggingCallback())

    def load_checkpoint(self, checkpoint: str) -> None:
        """Load the model weights of a checkpoint of this stage (a stage already complete on disk)."""
        self._load_from_checkpoint(checkpoint)

    def _load_from_checkpoint(self, checkpoint, *args, **kwargs) -> None:
        # A LoRA stage resumes by loading the adapter weights into the adapter it already has.
        if has_lora(self.model):
            load_adapter_weights(self.model, checkpoint)
            return
        super()._load_from_checkpoint(checkpoint, *args, **kwargs)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            pop = getattr(self.loss, "pop_components", None)
            if callable(pop):
                components = pop()
                components.pop("loss", None)
                logs = {**logs, **{key: round(value, 6) for key, value in components.items()}}
        super().log(logs, *args, **kwargs)


class StageCheckpointCallback(TrainerCallback):
    """Forces a checkpoint at chosen steps (e.g. the Stage II init step, whatever ``save_steps`` is)
    and can end the stage early, right after that checkpoint.

    Args:
        save_at: steps that must have a checkpoint.
        stop_after: end training after this step (its checkpoint is saved first).
    """

    def __init__(self, save_at: set[int] | None = None, stop_after: int | None = None) -> None:
        self.save_at = set(save_at or ())
        self.stop_after = stop_after

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.save_at:
            control.should_save = True
        if self.stop_after is not None and state.global_step >= self.stop_after:
            control.should_save = True
            control.should_training_stop = True
        return control
