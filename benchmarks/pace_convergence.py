"""PACE trained long enough to judge: MiniLM on SciFact, every configuration on one budget.

Usage (from the repo root, one torch thread; every step is resumable, rerun the same command):

    python benchmarks/pace_convergence.py prepare              # split, mining, validation pool
    python benchmarks/pace_convergence.py step-cost            # per-step seconds of each loss, measured alone
    python benchmarks/pace_convergence.py frozen infonce-lora pace ...
    python benchmarks/pace_convergence.py pace+seed2028            # the same configuration, another training seed
    python benchmarks/pace_convergence.py screen:st-hardness@all_negatives:5   # validation only, first SCREEN_UPDATES

Configuration names: ``<preset>[@<variant>][+seed<N>]``. Variants: ``st-hardness@<mode>:<strength>``
(sentence-transformers' hardness weighting), ``pace@s2lr<lr>`` (Stage II learning rate). ``+seed<N>``
changes the training seed only (LoRA init, data order); the split, the mined tuples and the validation
pool stay those of seed 2027, so two seeds differ only by what training draws. ``screen:<name>`` runs
the configuration's first ``SCREEN_UPDATES`` updates (on the full schedule) and records the validation
curve only: the cheap way to choose among settings on validation before a full run.

A PACE variant whose Stage I equals ``pace``'s (``no-dot``, ``pace@s2lr...``) starts from ``pace``'s own
Stage I checkpoint at the transition instead of training the same 75 updates again; the result
records ``stage1_shared_from``. Stage I is a function of its config and seed, so this changes nothing
but the compute.

Settings (same for every configuration): train on 80 % of SciFact qrels ``train`` queries (the other
20 % is validation, ``train_qrels_split`` seed 2027), one hard negative per (query, positive) pair
from the frozen top 50 with the false-negative filter (query-min, margin 0.05), batch 16 queries,
max sequence length 256 (the model's own), ``UPDATES`` optimizer updates on the final model's path,
seed 2027 (same data order). Validation nDCG@10 every ``EVAL_STEPS`` on a sub-corpus (the frozen
top 20 of every validation query plus their positives). Final scores: all 300 SciFact test queries
and all ArguAna queries (zero-shot), each ranked with the model's own similarity.

Environment: ``PACE_EVAL_STEPS`` (validation interval, default 50; 0: none during training), ``PACE_TEST_SETS`` (``scifact,arguana``;
a second-seed run may use ``scifact`` to spend its budget on the in-domain seed variance),
``PACE_UPDATES``, ``PACE_SCREEN_UPDATES``, ``PACE_PROTOCOL`` (below), ``PACE_MAX_SEQ`` (training, validation and
test sequence cap, default 256; the split, tuples and validation pool were mined at 256 and stay those).

Another readout: ``--model FOLDER`` (or ``PACE_MODEL=FOLDER``) trains every configuration from
that model instead of MiniLM, on the same data: the split, the mined tuples and the validation pool
stay those the frozen mean-pooling MiniLM chose (``$PACE_RUNS/data``, shared by every readout). Its
runs and results go to a folder of their own, named ``PACE_MODEL_LABEL`` or the model folder's name::

    python benchmarks/pace_convergence.py --model runs/minilm-lasttoken frozen infonce-lora pace
    # -> benchmarks/results/pace-convergence/minilm-lasttoken/<config>.json, runs under $PACE_RUNS/minilm-lasttoken/

The paper's compute protocol: ``PACE_PROTOCOL=paper`` runs PACE's Stage II for ``PACE_UPDATES``
(T) updates on top of Stage I's 0.25 T (Stage I still on the T-step schedule, stopped at 0.25 T), as
the paper trains Stage II a full epoch from the Stage I checkpoint. The default, ``matched``, is the
earlier study's: Stage II runs the remaining 0.75 T. One-stage arms take ``@x<f>`` for ``round(f T)``
updates, so ``direct-dot-full@x1.25`` is compute-matched to PACE under the paper protocol. Its runs and
results go to a folder of their own, ``<label>-paper`` (``minilm-paper`` for MiniLM)::

    PACE_PROTOCOL=paper PACE_UPDATES=100 PACE_EVAL_STEPS=25 PACE_TEST_SETS=scifact \
        python benchmarks/pace_convergence.py --model runs/minilm-lasttoken frozen direct-dot-full pace direct-dot-full@x1.25 infonce-lora no-dot
    # -> benchmarks/results/pace-convergence/minilm-lasttoken-paper/<config>.json

Results: ``benchmarks/results/pace-convergence/<config>.json`` (metrics with per-query nDCG@10,
the validation curve, weight change per stage, geometry diagnostics, timings). Checkpoints and
models live under ``$PACE_RUNS`` (default ``runs/pace-convergence``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("PACE_THREADS", "1")))
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
for noisy in ("sentence_transformers", "transformers", "httpx", "faiss.loader", "datasets"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

from embedtune.data.beir import load_beir
from embedtune.data.splits import train_qrels_split
from embedtune.encoders.dataset import embed_dataset
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.workflows.diagnose import diagnose_model
from embedtune.finetune import preset_config, train_pace
from embedtune.finetune.data import TrainingTuples, mine_training_tuples
from embedtune.finetune.recipe import evaluate_model
from embedtune.finetune.trainer import StageCheckpointCallback
from embedtune.finetune.validation import ValidationCallback, ValidationSet, build_validation_set
from embedtune.io import atomic_write_bytes, atomic_write_json



def take_model_flag(argv: list[str]) -> None:
    """Move ``--model X`` / ``--model=X`` out of ``argv`` into ``PACE_MODEL`` (read by the settings below)."""
    for i, arg in enumerate(list(argv)):
        if arg == "--model":
            if i + 1 >= len(argv):
                raise SystemExit("--model needs a value: a sentence-transformers folder or alias")
            os.environ["PACE_MODEL"] = argv[i + 1]
            del argv[i : i + 2]
            return
        if arg.startswith("--model="):
            os.environ["PACE_MODEL"] = arg.split("=", 1)[1]
            del argv[i]
            return


if __name__ == "__main__":
    take_model_flag(sys.argv)

REPO = Path(__file__).resolve().parents[1]
# The model every configuration trains from (the readout), and the one that chose the study's data.
MODEL = os.environ.get("PACE_MODEL", "minilm")
MINING_MODEL = "minilm"
# The compute protocol: "matched" (the default, the earlier study's) gives every arm UPDATES
# updates on its path, so Stage II runs UPDATES - 0.25 UPDATES; "paper" runs Stage II for UPDATES on top
# of Stage I's 0.25 UPDATES, as the paper's Stage II trains a full epoch on the Stage I checkpoint.
PROTOCOL = os.environ.get("PACE_PROTOCOL", "matched")
PROTOCOLS = ("matched", "paper")
if PROTOCOL not in PROTOCOLS:
    raise SystemExit(f"PACE_PROTOCOL: {PROTOCOL!r} is not one of {PROTOCOLS}")


def results_label(model: str, label: str | None, protocol: str) -> str:
    """The folder name of a readout's runs and results; "" is the earlier study's own folder.

    The paper protocol always gets a folder of its own (``<label>-paper``, ``minilm-paper`` for MiniLM),
    so its results never overwrite those of the compute-matched protocol.
    """
    base = label or ("" if model == "minilm" else Path(model).name)
    if protocol == "paper" and not base.endswith("-paper"):
        base = f"{base or 'minilm'}-paper"
    return base


READOUT = results_label(MODEL, os.environ.get("PACE_MODEL_LABEL"), PROTOCOL)
READOUT_NAME = results_label(MODEL, os.environ.get("PACE_MODEL_LABEL"), "matched")  # the readout alone, for the record
RUNS = Path(os.environ.get("PACE_RUNS", REPO / "runs" / "pace-convergence"))
DATA = RUNS / "data"  # split, tuples and validation pool: the same for every readout
ROOT = RUNS / READOUT if READOUT else RUNS
RESULTS = REPO / "benchmarks" / "results" / "pace-convergence" / READOUT if READOUT else REPO / "benchmarks" / "results" / "pace-convergence"
SHARED = REPO.parent / "shared" / "data" / "beir"
SCIFACT = str(SHARED / "scifact") if (SHARED / "scifact").is_dir() else "scifact"
ARGUANA = SHARED / "arguana"

SEED = 2027
# The model's own 256 by default; a CPU-bound run may cap it lower (PACE_MAX_SEQ). The mined data stay 256's.
MAX_SEQ = int(os.environ.get("PACE_MAX_SEQ", "256"))
MINING_MAX_SEQ = 256
BATCH = 16
N_NEGATIVES = 1
HARD_POOL = 50
FN_MARGIN, FN_REFERENCE = 0.05, "query-min"
VAL_FRACTION = 0.2
VAL_POOL = 20
UPDATES = int(os.environ.get("PACE_UPDATES", "300"))
EVAL_STEPS = int(os.environ.get("PACE_EVAL_STEPS", "50"))  # 0: no validation during training (the frozen arm still scores it)
SAVE_STEPS = 25
SCREEN_UPDATES = int(os.environ.get("PACE_SCREEN_UPDATES", "100"))
# A second-seed run may score SciFact only: its purpose is the seed variance of the in-domain score.
TEST_SETS = tuple(os.environ.get("PACE_TEST_SETS", "scifact,arguana").split(","))
if set(TEST_SETS) - {"scifact", "arguana"}:  # checked at start-up, not after an hour of training
    raise SystemExit(f"PACE_TEST_SETS: unknown set(s) {sorted(set(TEST_SETS) - {'scifact', 'arguana'})}; use scifact and/or arguana, comma-separated")
STAGE2_INIT = 0.25  # the paper's transition: step 2,000 of 7,847
COMMON = dict(model=MODEL, data=SCIFACT, train_split="train", max_seq_length=MAX_SEQ, batch_size=BATCH,
              n_negatives=N_NEGATIVES, hard_pool=HARD_POOL, seed=SEED, save_steps=SAVE_STEPS, logging_steps=5)
log = logging.getLogger("pace_convergence")


def two_stage_steps(updates: int, init: float = STAGE2_INIT, protocol: str = "matched") -> tuple[int, int]:
    """Stage I schedule and Stage II length for a budget of ``updates`` (T) updates.

    Stage I keeps the one-stage baselines' schedule (T steps, the same warm-up and decay) and stops at
    its checkpoint at ``init`` of it (0.25 T). ``matched``: Stage II runs the remaining T - 0.25 T, so
    the path to the final model has T updates, as every baseline's. ``paper``: Stage II runs T on top,
    1.25 T on the path, as in the paper (Stage II is a full epoch from the Stage I checkpoint).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}; got {protocol!r}")
    init_step = max(1, round(init * updates))
    return updates, updates if protocol == "paper" else updates - init_step


def one_stage_steps(variant: str, updates: int) -> int:
    """Steps of a one-stage configuration: ``updates``, or ``round(f * updates)`` for the variant ``x<f>``.

    ``direct-dot-full@x1.25`` is the compute match of PACE under the paper protocol (0.25 T + T updates).
    """
    if not variant.startswith("x"):
        return updates
    try:
        factor = float(variant[1:])
    except ValueError:
        raise SystemExit(f"variant {variant!r}: x<factor> needs a number, e.g. x1.25") from None
    if factor <= 0:
        raise SystemExit(f"variant {variant!r}: the factor must be positive")
    return max(1, round(factor * updates))


def prepare() -> tuple[TrainingTuples, ValidationSet]:
    """Split, mine and pick the validation pool once; every configuration reads the same files."""
    tuples_path, val_path = DATA / "train_tuples.json", DATA / "validation.json"
    train = load_beir(SCIFACT, "train")
    if tuples_path.is_file() and val_path.is_file():
        rows = json.loads(tuples_path.read_text())
        tuples = TrainingTuples([r[0] for r in rows["tuples"]], [r[1] for r in rows["tuples"]], [r[2] for r in rows["tuples"]], rows["meta"])
        manifest = json.loads(val_path.read_text())
        validation = ValidationSet(
            query_ids=manifest["query_ids"], query_texts=[train.queries[q] for q in manifest["query_ids"]],
            doc_ids=manifest["doc_ids"], doc_texts=[_doc_text(train, d) for d in manifest["doc_ids"]],
            qrels={q: dict(train.qrels[q]) for q in manifest["query_ids"]},
        )
        return tuples, validation
    test = load_beir(SCIFACT, "test")
    split = train_qrels_split(train, test, val_fraction=VAL_FRACTION, seed=SEED)
    encoder = SentenceEncoder(MINING_MODEL, max_seq_length=MINING_MAX_SEQ, normalize=True, show_progress=False)
    tuples = mine_training_tuples(train, encoder, query_ids=split.train, n_negatives=N_NEGATIVES, hard_pool=HARD_POOL, seed=SEED,
                                  false_negative_margin=FN_MARGIN, false_negative_reference=FN_REFERENCE)
    frozen = embed_dataset(encoder, train)
    validation = build_validation_set(train, split.val, frozen.queries(split.val), frozen.doc_ids, frozen.doc_embeddings, VAL_POOL)
    tuples.save(tuples_path)
    atomic_write_json(val_path, {**validation.manifest(), "train_query_ids": split.train, "pool": VAL_POOL})
    log.info("prepared %d tuples (%d train queries), validation %d queries over %d docs",
             len(tuples), len(split.train), len(validation.query_ids), len(validation.doc_ids))
    return tuples, validation


def _doc_text(dataset, doc_id: str) -> str:
    from embedtune.data.beir import document_text

    return document_text(dataset.corpus[doc_id])


def parse_name(name: str) -> tuple[str, str, int]:
    """``<preset>[@<variant>][+seed<N>]`` -> (preset, variant, training seed)."""
    base, _, seed_part = name.partition("+")
    seed = SEED
    if seed_part:
        if not seed_part.startswith("seed") or not seed_part[4:].isdigit():
            raise SystemExit(f"{name!r}: the suffix after '+' must be seed<N>, e.g. pace+seed2028")
        seed = int(seed_part[4:])
    preset, _, variant = base.partition("@")
    return preset, variant, seed


def config_for(name: str, out: Path):
    preset, variant, seed = parse_name(name)
    common = {**COMMON, "seed": seed}
    extra: dict = {}
    if preset == "st-hardness" and variant:
        mode, _, strength = variant.partition(":")
        extra.update(hardness_mode=mode, hardness_strength=float(strength))
    if preset in ("infonce-lora", "direct-dot-full", "st-hardness"):
        steps = one_stage_steps(variant, UPDATES) if preset != "st-hardness" else UPDATES
        return preset_config(preset, steps=steps, output_dir=str(out), **common, **extra)
    stage1, stage2 = two_stage_steps(UPDATES, protocol=PROTOCOL)
    if variant.startswith("s2lr"):
        extra["stage2_lr"] = float(variant[4:])
    stage2_lr = extra.pop("stage2_lr", None)
    config = preset_config(preset, stage1_steps=stage1, stage2_steps=stage2, output_dir=str(out), stop_stage1_at_init=True,
                           **common, **extra)
    if stage2_lr is not None:
        config.stage2.learning_rate = stage2_lr
    return config


def share_stage_one(name: str, config, out: Path) -> str | None:
    """Start ``name`` from ``pace``'s Stage I checkpoint when its Stage I is the same; returns the source run.

    Same means the whole config but Stage II and the output folder is equal, so the checkpoint is the
    one this run would write itself. The Stage I validation rows are copied with it, so the curve is whole.
    """
    if name == "pace" or config.stage2 is None:
        return None
    source = ROOT / "pace"
    saved = source / "pace_config.json"
    init_step = config.stage2_init_step(config.stage1.steps)
    checkpoint = source / "stage1" / f"checkpoint-{init_step}"
    if not (saved.is_file() and checkpoint.is_dir()):
        return None

    def stage_one_view(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in ("stage2", "output_dir", "preset", "embedtune_version")}

    if stage_one_view(json.loads(saved.read_text())) != stage_one_view(json.loads(json.dumps(config.to_dict()))):
        return None
    target = out / "stage1" / checkpoint.name
    if not target.is_dir():
        import shutil

        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(checkpoint, staging)
        staging.rename(target)
        if (source / "validation.jsonl").is_file():  # absent when the runs validate nothing (PACE_EVAL_STEPS=0)
            rows = [line for line in (source / "validation.jsonl").read_text().splitlines()
                    if line.strip() and json.loads(line)["stage"] == "stage1"]
            atomic_write_bytes(out / "validation.jsonl", "".join(r + "\n" for r in rows).encode("utf-8"))
        log.info("%s: Stage I equals pace's; starting from %s", name, checkpoint)
    return "pace"


def weight_change(before, after) -> float:
    """Relative L2 change of the transformer weights: ‖θ_after − θ_before‖ / ‖θ_before‖."""
    a = dict(before.named_parameters())
    num = den = 0.0
    for key, value in after.named_parameters():
        if key in a and a[key].shape == value.shape:
            num += float((value.detach().double() - a[key].detach().double()).pow(2).sum())
            den += float(a[key].detach().double().pow(2).sum())
    return (num / den) ** 0.5 if den else float("nan")


def score(model_dir: str, similarity: str) -> dict:
    out = {}
    for label, data in (("scifact", SCIFACT), ("arguana", str(ARGUANA))):
        if label not in TEST_SETS:
            continue
        start = time.perf_counter()
        metrics = evaluate_model(model_dir, data, "test", similarity=similarity, max_seq_length=MAX_SEQ)
        out[label] = {**metrics.to_dict(), "per_query_ndcg@10": {q: v["ndcg@10"] for q, v in sorted(metrics.per_query.items())},
                      "seconds": round(time.perf_counter() - start, 1)}
        log.info("%s %s: nDCG@10 %.4f over %d queries", model_dir, label, metrics["ndcg@10"], metrics.n_queries)
    return out


def run(name: str) -> None:
    result_path = RESULTS / f"{name}.json"
    if result_path.is_file():
        log.info("%s: already finished (%s)", name, result_path)
        return
    tuples, validation = prepare()
    out = ROOT / name
    record: dict = {"name": name, "model": MODEL, "readout": READOUT_NAME or "mean (the model's own)", "data_mined_by": MINING_MODEL,
                    "protocol": PROTOCOL, "max_seq_length": MAX_SEQ, "batch": BATCH, "n_negatives": N_NEGATIVES,
                    "updates": UPDATES, "eval_steps": EVAL_STEPS, "seed": SEED, "n_tuples": len(tuples),
                    "validation": {"n_queries": len(validation.query_ids), "n_docs": len(validation.doc_ids)}}
    start = time.perf_counter()
    curve_path = out / "validation.jsonl"
    if name == "frozen":
        from embedtune.finetune.modeling import load_base_model
        from embedtune.finetune.validation import score_model

        similarity, model_dir = "cosine", MODEL
        record["curve"] = [{"stage": "frozen", "step": 0, "update": 0, **score_model(load_base_model(MODEL, MAX_SEQ), validation, "cosine")}]
    else:
        config = config_for(name, out)
        shared = share_stage_one(name, config, out)
        if shared:
            record["stage1_shared_from"] = shared

        def callbacks(stage: str, offset: int, similarity: str):
            if EVAL_STEPS == 0:  # no validation: a CPU-bound run that spends its budget on training and test
                return []
            return [ValidationCallback(validation, curve_path, EVAL_STEPS, similarity, stage=stage, update_offset=offset)]

        result = train_pace(config, tuples=tuples, stage_callbacks=callbacks)
        similarity, model_dir = result.similarity, result.model_dir
        record["config"] = result.config
        record["stages"] = [{k: getattr(s, k) for k in ("name", "similarity", "parameters", "steps", "steps_run", "learning_rate",
                                                          "temperature", "norm_product_median", "weighting", "gamma", "seconds",
                                                          "init_checkpoint", "trainable_parameters", "total_parameters")}
                            for s in result.stages]
        record["curve"] = ([json.loads(line) for line in curve_path.read_text().splitlines() if line.strip()]
                           if curve_path.is_file() else [])
        record["weight_change"] = _weight_changes(config, result)
    record["similarity"] = similarity
    record["train_seconds"] = round(time.perf_counter() - start, 1)
    record["test"] = score(model_dir, similarity)
    report = diagnose_model(model_dir, SCIFACT, "train", n_pairs=None, seed=0, max_seq_length=MAX_SEQ)
    record["diagnostics"] = {k: v for k, v in report.to_dict().items() if not isinstance(v, (list, dict))}
    record["wall_seconds"] = round(time.perf_counter() - start, 1)
    record["torch_threads"] = torch.get_num_threads()
    atomic_write_json(result_path, record)
    log.info("DONE %s: %s", name, ", ".join(f"{k} {v['ndcg@10']:.4f}" for k, v in record["test"].items()))


def _weight_changes(config, result) -> dict:
    from embedtune.finetune.modeling import load_base_model, load_stage_checkpoint

    base = load_base_model(MODEL, MAX_SEQ)
    final = load_base_model(result.model_dir, MAX_SEQ)
    changes = {"total": weight_change(base, final)}
    if len(result.stages) == 2:
        init = load_stage_checkpoint(result.stages[1].init_checkpoint, MODEL, MAX_SEQ)
        changes["stage1"] = weight_change(base, init)
        changes["stage2"] = weight_change(init, final)
    return changes


def screen(name: str) -> None:
    """Validation curve of ``name``'s first ``SCREEN_UPDATES`` updates on the full schedule; no test scores."""
    result_path = RESULTS / "screen" / f"{name}.json"
    if result_path.is_file():
        log.info("screen %s: already finished (%s)", name, result_path)
        return
    tuples, validation = prepare()
    out = ROOT / "screen" / name
    config = config_for(name, out)
    if config.stage2 is not None:
        raise SystemExit(f"screen:{name}: screening is for one-stage configurations")
    curve_path = out / "validation.jsonl"
    start = time.perf_counter()

    def callbacks(stage: str, offset: int, similarity: str):
        # Validation runs at the last screened step before the stop takes effect (both act on that step's end).
        return [ValidationCallback(validation, curve_path, EVAL_STEPS, similarity, stage=stage, update_offset=offset),
                StageCheckpointCallback(stop_after=SCREEN_UPDATES)]

    train_pace(config, tuples=tuples, stage_callbacks=callbacks)
    curve = [json.loads(line) for line in curve_path.read_text().splitlines() if line.strip()]
    atomic_write_json(result_path, {"name": name, "screen_updates": SCREEN_UPDATES, "schedule_updates": UPDATES,
                                    "eval_steps": EVAL_STEPS, "seed": config.seed, "curve": curve,
                                    "seconds": round(time.perf_counter() - start, 1), "torch_threads": torch.get_num_threads()})
    log.info("screen %s: best validation nDCG@10 %.4f", name, max(row["ndcg@10"] for row in curve))


def step_cost(n_steps: int = 4) -> None:
    """Seconds per optimizer step of each loss on the same batches, measured alone (one thread)."""
    tuples, _ = prepare()
    rows = {}
    for name in ("infonce-lora", "pace", "direct-dot-full", "st-hardness"):
        out = ROOT / "step-cost" / name
        if out.exists():  # a finished earlier measurement would resume from its checkpoint and time nothing
            import shutil

            shutil.rmtree(out)
        config = config_for(name, out)
        config.stage1.steps = n_steps
        config.stage2 = None
        config.save_steps = 10_000
        small = TrainingTuples(tuples.query_ids[: BATCH * n_steps], tuples.positive_ids[: BATCH * n_steps],
                               tuples.negative_ids[: BATCH * n_steps], tuples.meta)
        result = train_pace(config, tuples=small)
        rows[name] = round(result.stages[0].seconds / n_steps, 2)
        log.info("step cost %s: %.2f s/step", name, rows[name])
    atomic_write_json(RESULTS / "step_cost.json", {"seconds_per_step": rows, "batch": BATCH, "n_negatives": N_NEGATIVES,
                                                   "max_seq_length": MAX_SEQ, "steps": n_steps, "torch_threads": torch.get_num_threads(),
                                                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                   "load_average_after": os.getloadavg()})


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg == "prepare":
            prepare()
        elif arg == "step-cost":
            step_cost(int(os.environ.get("PACE_STEP_COST_STEPS", "4")))
        elif arg.startswith("screen:"):
            screen(arg.split(":", 1)[1])
        else:
            run(arg)
