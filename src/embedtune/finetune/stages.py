"""The two-stage schedule shared by every backbone, what it asks of a backbone family, and what a stage reports.

:func:`run_stages` owns the order of the stages (Stage I, the Stage II init checkpoint, Stage II, the
``τ`` of each) and :func:`embedtune.finetune.recipe.train_pace` the run around them (data, model, final
model, evaluation, ``results.json``); a :class:`Backbone` owns everything that
differs by family: how training data is read, how the model is loaded, which parameters a stage
trains (LoRA targets, the frozen vision tower), the training loop of one stage, how Stage II starts
from the init step, how the final model is saved and evaluated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from embedtune.finetune.config import PACEConfig, StageConfig, stage_steps
from embedtune.finetune.modeling import parameter_fingerprint

logger = logging.getLogger(__name__)

__all__ = ["Backbone", "StageResult", "StagesOutcome", "resolve_temperature", "run_stages"]


@dataclass
class StageResult:
    """What one stage did.

    Attributes:
        name: ``stage1`` or ``stage2``.
        steps: optimizer steps of the schedule; ``steps_run``: steps actually taken.
        temperature: the resolved ``τ``; ``norm_product_median``: the measured median(‖q‖·‖c‖) when 'auto'.
        init_checkpoint: the checkpoint the stage started from (Stage II), when one was written.
        seconds: wall-clock training time of the stage.
        log_history: one dict per logged step (``step``, ``loss``, ``learning_rate`` and the focal-loss components).
        checkpoints: checkpoint (text) or adapter (vl) folders written.
    """

    name: str
    similarity: str
    parameters: str
    steps: int
    steps_run: int
    learning_rate: float
    temperature: float
    weighting: str
    gamma: float
    trainable_parameters: int
    total_parameters: int
    seconds: float
    norm_product_median: float | None = None
    init_checkpoint: str | None = None
    init_fingerprint: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)
    log_history: list[dict[str, Any]] = field(default_factory=list)


class Backbone(Protocol):
    """The family-specific half of PACE. Implementations: ``TextBackbone`` and ``VisionLanguageBackbone``."""

    world_size: int  # processes sharing one optimizer step (sets the length of an epoch)

    def seed(self, config: PACEConfig) -> None:
        """Seed what the family's earlier releases seeded before loading data and model."""

    def load_training_data(self, config: PACEConfig, output_dir: Path, prepared: Any = None) -> Sequence:
        """The training set (anything with ``len``); ``prepared`` is data the caller already has."""

    def load_model(self, config: PACEConfig) -> Any: ...

    def prepare_stage_one(self, model: Any, config: PACEConfig) -> Any:
        """Attach LoRA or make the language model trainable, as ``config.stage1.parameters`` says."""

    def norm_product_median(self, model: Any, data: Sequence, config: PACEConfig) -> float:
        """median(‖q‖·‖c‖) over a sample of training queries and candidates (for ``temperature="auto"``)."""

    def run_stage(self, name: str, model: Any, data: Sequence, stage: StageConfig, config: PACEConfig,
                  output_dir: Path | None, *, steps: int, temperature: float, save_at: set[int],
                  stop_after: int | None, callbacks: list | None, norm_product_median: float | None = None) -> StageResult:
        """Train ``model`` in place for ``steps`` steps; keep the weights of each step in ``save_at``."""

    def start_stage_two(self, model: Any, config: PACEConfig, stage1: StageResult | None, stage1_dir: Path | None,
                        init_step: int | None) -> tuple[Any, str | None]:
        """Stage II's model (Stage I's weights at ``init_step``, LoRA merged, ``stage2.parameters`` trainable)
        and the checkpoint it came from."""

    def finalize(self, model: Any, similarity: str) -> Any:
        """Merge what is left to merge, so the model ranks with ``similarity``."""

    def save_model(self, model: Any, config: PACEConfig, model_dir: Path, similarity: str) -> None: ...

    def evaluate(self, model: Any, model_dir: Path, config: PACEConfig, similarity: str, target: Any) -> dict[str, Any]:
        """Metrics of the final model on ``target`` (text: a qrels split; vl: MMEB-eval files)."""


@dataclass
class StagesOutcome:
    """What :func:`run_stages` hands back: the trained model (not yet finalized) and the stages' results."""

    model: Any
    stages: list[StageResult]
    similarity: str
    stage1_steps: int
    init_step: int | None
    seconds: dict[str, float]


def resolve_temperature(backbone: Backbone, model: Any, data: Sequence, stage: StageConfig, config: PACEConfig,
                        name: str) -> tuple[float, float | None]:
    """The stage's ``τ`` and, for a measured ``"auto"``, the median(‖q‖·‖c‖) (:meth:`StageConfig.resolve_temperature`).

    Measured on the model as the stage starts (Stage II: Stage I's weights at the init step), so the
    first dot-product logits sit at the scale of Stage I's cosine logits for a typical pair.
    """
    temperature, median = stage.resolve_temperature(lambda: backbone.norm_product_median(model, data, config))
    if median is not None:
        logger.debug("%s: temperature auto = %.4g × median(‖q‖·‖c‖) %.4g = %.4g", name, stage.base_temperature, median, temperature)
    return temperature, median


def run_stages(backbone: Backbone, model: Any, data: Sequence, config: PACEConfig, stage1_dir: Path | None, stage2_dir: Path | None,
               stage_callbacks: Callable[[str, int, str], list] | None = None,
               barrier: Callable[[], None] = lambda: None) -> StagesOutcome:
    """Stage I, then Stage II from Stage I's weights at ``config.stage2_init_step(...)``; trains ``model`` in place.

    Stage I keeps its weights at the init step (a checkpoint, or a snapshot in memory) and may stop there
    (``stop_stage1_at_init``: the same Stage II, less compute). Stage outputs (checkpoints, adapters) go to
    ``stage1_dir`` and ``stage2_dir`` (None: the backbone keeps nothing on disk, where it can).
    """
    timings: dict[str, float] = {}
    stage1_steps = stage_steps(config.stage1, len(data), config.batch_size, backbone.world_size)
    init_step = config.stage2_init_step(stage1_steps) if config.stage2 is not None and stage1_steps > 0 else None
    stages: list[StageResult] = []
    stage1: StageResult | None = None
    if stage1_steps > 0:  # 0: no Stage I (vl only)
        model = backbone.prepare_stage_one(model, config)
        temperature, median = resolve_temperature(backbone, model, data, config.stage1, config, "stage1")
        stage1 = backbone.run_stage(
            "stage1", model, data, config.stage1, config, stage1_dir, steps=stage1_steps, temperature=temperature,
            save_at={init_step, stage1_steps} if init_step else {stage1_steps},
            stop_after=init_step if config.stop_stage1_at_init else None,
            callbacks=stage_callbacks("stage1", 0, config.stage1.similarity) if stage_callbacks else None,
            norm_product_median=median,
        )
        timings["stage1"] = stage1.seconds
        stages.append(stage1)
    similarity = config.stage1.similarity
    if config.stage2 is not None:
        barrier()  # the main process wrote the init checkpoint
        start = time.perf_counter()
        handoff = [model]  # no reference stays here: the text backbone frees Stage I's model before loading the checkpoint
        del model
        model, checkpoint = backbone.start_stage_two(handoff.pop(), config, stage1, stage1_dir, init_step)
        timings["stage2_prepare"] = time.perf_counter() - start
        fingerprint = parameter_fingerprint(model)
        stage2_steps = stage_steps(config.stage2, len(data), config.batch_size, backbone.world_size)
        temperature, median = resolve_temperature(backbone, model, data, config.stage2, config, "stage2")
        stage2 = backbone.run_stage(
            "stage2", model, data, config.stage2, config, stage2_dir, steps=stage2_steps, temperature=temperature, save_at=set(),
            stop_after=None, callbacks=stage_callbacks("stage2", init_step or 0, config.stage2.similarity) if stage_callbacks else None,
            norm_product_median=median,
        )
        stage2.init_checkpoint = checkpoint
        stage2.init_fingerprint = fingerprint
        timings["stage2"] = stage2.seconds
        stages.append(stage2)
        similarity = config.stage2.similarity
    return StagesOutcome(model=model, stages=stages, similarity=similarity, stage1_steps=stage1_steps, init_step=init_step, seconds=timings)
