"""PACE from an unconverged readout, on a lent GPU in one call of at most 10 minutes.

What it runs (``run``, the default), every run on the same data and one JSON per run:

- two readouts of MiniLM: ``mean`` (its own mean pooling) and ``lasttoken`` (a copied folder whose
  ``1_Pooling/config.json`` sets ``pooling_mode_lasttoken``: a readout not trained for similarity);
- per readout and seed (2027, 2028), the frozen model and the arms, in the paper's protocol with
  ``T`` updates (``--updates``):

  ===  =================  ==========================================================
  A    infonce-lora       one stage, T updates
  B    direct-dot-full    one stage, T updates
  C    pace               Stage I on a T-update schedule, stopped at 0.25 T (its Stage II
                          init), then Stage II for T updates from that checkpoint
  D    direct-dot-full    one stage, 1.25 T updates (compute-matched to C)
  E    no-dot             C with cosine in Stage II
  ===  =================  ==========================================================

  at batch 32 queries with 5 hard negatives each (the paper's), max sequence length 256, Stage II at
  the paper's lr 2e-6 (``--arms`` takes ``C@s2lr2e-5``-style variants too); T defaults to 150 updates;
- each run reports SciFact test nDCG@10 on all, seen and unseen queries (per query too), the
  validation curve (every ``--eval-every`` updates), the geometry diagnostics of the final model
  (raw outputs, ``Normalize`` stripped), per-step seconds and peak GPU memory;
- a tiny random Qwen2-VL PACE run (Stage I and II, a few steps each) for step time and peak memory.

The data is the committed ``benchmarks/data/pace-gpu-study/`` (``prepare-data``): the 80/20 split of
SciFact train queries (seed 2027), hard negatives mined by the frozen fp32 MiniLM with mean pooling
(top 50, false-negative filter query-min 0.05, as ``pace_convergence.py``) and the validation pool
(frozen top 20 plus positives). The GPU machine can fetch nothing and takes at most 64 MiB with the
working tree, so ``bundle`` (run here, on CPU) writes ``runs/gpu-bundle/``: MiniLM in bf16
(byte-planes, xz; only the vocabulary rows SciFact's queries and documents use are kept, the others
are zero, so the copy is for SciFact only), and the
wheels that machine lacks (datasets, dill, multiprocess, pytrec-eval-terrier). SciFact itself is the
package's compressed copy (``src/embedtune/datasets/scifact.zip``). On the device the weights are
restored to fp32 and trained with bf16 autocast; searches use the torch kernel (no FAISS there).

Commands (``bash benchmarks/gpu_smoke.sh`` wraps this file, same arguments)::

    bash benchmarks/gpu_smoke.sh bundle                       # here: writes runs/gpu-bundle (≈ 24 MiB), prints its size
    # device, one call, carry ["runs/gpu-bundle"], timeout 600:
    bash benchmarks/gpu_smoke.sh run --pack "$OUT/pace-gpu-study.tar.gz" 2>&1 | tee "$OUT/log.txt"
    # here: tar -xzf <files_at>/pace-gpu-study.tar.gz -C benchmarks/results/
    bash benchmarks/gpu_smoke.sh --dry-run                    # CPU, tiny: one step per arm (CI covers it)
    bash benchmarks/gpu_smoke.sh vl [STEPS HIDDEN FAMILY]      # the tiny Qwen-VL smoke check alone

``run`` stops starting runs when ``--budget-s`` (default 530 s) is spent, the first seed of both readouts
first, and repacks the tarball after every run, so a call killed at its limit still returns what finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # readout_model.py

log = logging.getLogger("pace_gpu_study")

# The study's data: the settings of pace_convergence.py (tests/test_gpu_study.py checks they agree), but
# the paper's 5 hard negatives and batch 32.
SEED = 2027
MAX_SEQ = 256
HARD_POOL = 50
FN_MARGIN, FN_REFERENCE = 0.05, "query-min"
VAL_FRACTION = 0.2
VAL_POOL = 20
STAGE2_INIT = 0.25
BATCH = 32
N_NEGATIVES = 5
SEEDS = (2027, 2028)
READOUTS = ("mean", "lasttoken")
DATA_DIR = REPO / "benchmarks" / "data" / "pace-gpu-study"
BUNDLE = Path(os.environ.get("EMBEDTUNE_BUNDLE", REPO / "runs" / "gpu-bundle"))
RESULTS = REPO / "benchmarks" / "results" / "pace-gpu-study"
WHEELS = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "pytrec-eval-terrier==0.5.11")
DEVICE_PYTHON = "3.12"  # the lent machine's python3 (/work/.library/device/KINDS.md)
SMALL_TENSOR = 100_000  # tensors with fewer elements travel in float32 (biases, LayerNorm)

# Arm letter -> (preset, length in units of T for a one-stage arm, or None for a two-stage one).
ARMS: dict[str, tuple[str, float | None]] = {
    "A": ("infonce-lora", 1.0),
    "B": ("direct-dot-full", 1.0),
    "C": ("pace", None),
    "D": ("direct-dot-full", 1.25),
    "E": ("no-dot", None),
}


# -- data (here, once) -------------------------------------------------------------------------------------

def prepare_data(out: Path = DATA_DIR, model: str = "minilm") -> None:
    """Split SciFact train queries, mine 5 hard negatives per pair and pick the validation pool (fp32, CPU)."""
    from embedtune.data.beir import load_beir
    from embedtune.data.splits import train_qrels_split
    from embedtune.encoders.dataset import embed_dataset
    from embedtune.encoders.sentence_transformer import SentenceEncoder
    from embedtune.finetune.data import mine_training_tuples
    from embedtune.finetune.validation import build_validation_set
    from embedtune.io import atomic_write_json

    train, test = load_beir("scifact", "train"), load_beir("scifact", "test")
    split = train_qrels_split(train, test, val_fraction=VAL_FRACTION, seed=SEED)
    encoder = SentenceEncoder(model, max_seq_length=MAX_SEQ, normalize=True, show_progress=False)
    tuples = mine_training_tuples(train, encoder, query_ids=split.train, n_negatives=N_NEGATIVES, hard_pool=HARD_POOL, seed=SEED,
                                  false_negative_margin=FN_MARGIN, false_negative_reference=FN_REFERENCE)
    frozen = embed_dataset(encoder, train)
    validation = build_validation_set(train, split.val, frozen.queries(split.val), frozen.doc_ids, frozen.doc_embeddings, VAL_POOL)
    out.mkdir(parents=True, exist_ok=True)
    tuples.meta = {**tuples.meta, "data": "scifact (bundled zip)", "fingerprints": train.fingerprints, "mined_by": f"{model} fp32, mean pooling",
                   "max_seq_length": MAX_SEQ}
    tuples.save(out / "train_tuples.json")
    atomic_write_json(out / "validation.json", {**validation.manifest(), "train_query_ids": split.train, "pool": VAL_POOL,
                                                "seed": SEED, "val_fraction": VAL_FRACTION})
    log.info("prepared %d tuples (%d train queries), validation %d queries over %d docs in %s",
             len(tuples), len(split.train), len(validation.query_ids), len(validation.doc_ids), out)


def load_data(data_dir: Path, dataset):
    """The committed tuples and validation set, with ``dataset`` (SciFact train) supplying the texts."""
    from embedtune.data.beir import document_text
    from embedtune.finetune.data import TrainingTuples
    from embedtune.finetune.validation import ValidationSet

    rows = json.loads((data_dir / "train_tuples.json").read_text())
    tuples = TrainingTuples([r[0] for r in rows["tuples"]], [r[1] for r in rows["tuples"]], [r[2] for r in rows["tuples"]], rows["meta"])
    manifest = json.loads((data_dir / "validation.json").read_text())
    validation = ValidationSet(
        query_ids=manifest["query_ids"], query_texts=[dataset.queries[q] for q in manifest["query_ids"]],
        doc_ids=manifest["doc_ids"], doc_texts=[document_text(dataset.corpus[d]) for d in manifest["doc_ids"]],
        qrels={q: dict(dataset.qrels[q]) for q in manifest["query_ids"]},
    )
    return tuples, validation


# -- the bundle (here) and its unpacking (device) ---------------------------------------------------------

def used_token_ids(model_dir: Path, texts: list[str]) -> np.ndarray:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    used = set(tokenizer.all_special_ids)
    for lo in range(0, len(texts), 512):
        for ids in tokenizer(texts[lo : lo + 512], add_special_tokens=True)["input_ids"]:
            used.update(ids)
    return np.array(sorted(used), dtype=np.int64)


def pack_model(model_dir: Path, out: Path, keep_rows: np.ndarray | None = None) -> dict[str, Any]:
    """``model_dir``'s weights as bf16 byte-planes in ``weights.xz`` (small tensors float32), every other file copied.

    ``keep_rows``: the word-embedding rows kept (the others are restored as zeros: no text the study
    reads uses them).
    """
    import torch
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    for path in model_dir.rglob("*"):
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("README.md", ".gitattributes", "data_config.json"):
            target = out / path.relative_to(model_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    state = load_file(str(model_dir / "model.safetensors"))
    index: list[dict[str, Any]] = []
    wide, narrow = [], []
    for name in sorted(state):
        tensor = state[name].detach()
        entry: dict[str, Any] = {"name": name, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")}
        if name.endswith("word_embeddings.weight") and keep_rows is not None:
            entry["rows"] = keep_rows.tolist()
            tensor = tensor[torch.as_tensor(keep_rows)]
        if tensor.numel() < SMALL_TENSOR:
            entry["stored"] = "float32"
            narrow.append(tensor.float().numpy().tobytes())
        else:
            entry["stored"] = "bfloat16"
            wide.append(tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint8).reshape(-1, 2))
        entry["numel"] = int(tensor.numel())
        index.append(entry)
    planes = np.concatenate(wide) if wide else np.zeros((0, 2), np.uint8)
    payload = planes[:, 1].tobytes() + planes[:, 0].tobytes() + b"".join(narrow)  # high bytes (sign, exponent) compress
    (out / "weights.xz").write_bytes(lzma.compress(payload, preset=6))
    meta = {"format": "pace-gpu-study bf16 planes", "tensors": index, "n_bf16": int(len(planes)), "bytes": len(payload)}
    (out / "weights.json").write_text(json.dumps(meta))
    return meta


def unpack_model(packed: Path, out: Path) -> Path:
    """Restore a :func:`pack_model` folder as a float32 ``model.safetensors`` model folder."""
    import torch
    from safetensors.torch import save_file

    meta = json.loads((packed / "weights.json").read_text())
    payload = lzma.decompress((packed / "weights.xz").read_bytes())
    n = meta["n_bf16"]
    planes = np.empty((n, 2), np.uint8)
    planes[:, 1] = np.frombuffer(payload, np.uint8, n, 0)
    planes[:, 0] = np.frombuffer(payload, np.uint8, n, n)
    bf16 = torch.from_numpy(planes.reshape(-1).view(np.int16).copy()).view(torch.bfloat16)
    narrow = memoryview(payload)[2 * n :]
    state, wide_at, narrow_at = {}, 0, 0
    for entry in meta["tensors"]:
        count = entry["numel"]
        if entry["stored"] == "bfloat16":
            values = bf16[wide_at : wide_at + count].float()
            wide_at += count
        else:
            values = torch.from_numpy(np.frombuffer(narrow, np.float32, count, narrow_at).copy())
            narrow_at += 4 * count
        shape = list(entry["shape"])
        if "rows" in entry:
            full = torch.zeros(shape, dtype=torch.float32)
            full[torch.as_tensor(entry["rows"])] = values.reshape(len(entry["rows"]), *shape[1:])
            values = full
        state[entry["name"]] = values.reshape(shape).contiguous()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(packed, out, ignore=shutil.ignore_patterns("weights.xz", "weights.json"))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def build_bundle(bundle: Path = BUNDLE, model: str = "minilm", wheels: bool = True) -> dict[str, Any]:
    """Write ``bundle``: the packed model and the wheels the GPU machine lacks; returns its manifest."""
    from embedtune.data.beir import document_text, load_beir
    from embedtune.encoders.bundled import resolve_model_path

    model_dir = Path(resolve_model_path(model))
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    dataset = load_beir("scifact", "train")
    texts = [*dataset.queries.values(), *(document_text(doc) for doc in dataset.corpus.values())]
    keep = used_token_ids(model_dir, texts)
    meta = pack_model(model_dir, bundle / "minilm", keep)
    manifest: dict[str, Any] = {"model": model, "source": str(model_dir), "vocabulary_rows_kept": int(len(keep)),
                                "weights_bytes": meta["bytes"], "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if wheels:
        target = bundle / "wheels"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
                   "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                   "--platform", "manylinux2014_x86_64", "-d", str(target), *WHEELS]
        subprocess.run(command, check=True)
        manifest["wheels"] = sorted(path.name for path in target.glob("*.whl"))
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(path.stat().st_size for path in bundle.rglob("*") if path.is_file())
    manifest["bundle_bytes"] = size
    print(f"{bundle}: {size / 2**20:.1f} MiB ({len(keep)} of the vocabulary's rows kept); carry it: run(..., carry=['runs/gpu-bundle'])")
    return manifest


# -- one run ------------------------------------------------------------------------------------------------

def arm_config(arm: str, readout_dir: Path, out: Path, updates: int, seed: int, settings: dict[str, Any]):
    """The PACEConfig of arm ``A``..``E`` (or ``<letter>@s2lr<lr>``) at ``updates`` = T."""
    from embedtune.finetune import preset_config

    letter, _, variant = arm.partition("@")
    preset, length = ARMS[letter]
    common = dict(model=str(readout_dir), data=settings["data"], train_split="train", max_seq_length=settings["max_seq_length"],
                  batch_size=settings["batch_size"], n_negatives=settings["n_negatives"], hard_pool=HARD_POOL, seed=seed,
                  save_steps=10**6, logging_steps=10, output_dir=str(out), precision=settings["precision"])
    if length is not None:
        return preset_config(preset, steps=max(1, round(length * updates)), **common)
    config = preset_config(preset, stage1_steps=updates, stage2_steps=updates, stage2_init=STAGE2_INIT, stop_stage1_at_init=True, **common)
    if variant.startswith("s2lr"):
        config.stage2.learning_rate = float(variant[4:])
    elif variant:
        raise SystemExit(f"arm {arm!r}: the only variant is @s2lr<lr>, e.g. C@s2lr2e-5")
    return config


def score_test(model_dir: str, similarity: str, settings: dict[str, Any], seen_docs: set[str]) -> dict[str, Any]:
    from embedtune.evaluate.subsets import query_subsets, subset_means
    from embedtune.finetune.recipe import evaluate_model

    start = time.perf_counter()
    metrics = evaluate_model(model_dir, settings["data"], "test", similarity=similarity, max_seq_length=settings["max_seq_length"],
                             batch_size=settings["encode_batch"])
    test_qrels = settings["test_qrels"]
    subsets = query_subsets({q: test_qrels[q] for q in metrics.per_query if q in test_qrels}, seen_docs)
    return {"scifact": {**metrics.to_dict(), "subsets": subset_means(metrics.per_query, subsets),
                        "per_query_ndcg@10": {q: v["ndcg@10"] for q, v in sorted(metrics.per_query.items())},
                        "seconds": round(time.perf_counter() - start, 2)}}


def diagnostics(model_dir: str, settings: dict[str, Any]) -> dict[str, Any]:
    from embedtune.workflows.diagnose import diagnose_model

    report = diagnose_model(model_dir, settings["data"], "train", n_pairs=settings["diagnose_pairs"], seed=0,
                            max_seq_length=settings["max_seq_length"], batch_size=settings["encode_batch"])
    values = {k: v for k, v in report.to_dict().items() if not isinstance(v, (list, dict))}
    return {**values, "normalize_stripped": report.meta["normalize_stripped"], "outputs": report.meta["outputs"]}


def step_timer(stage: str, log: dict[str, list[float]]):
    """A TrainerCallback that appends each optimizer step's seconds (forward, backward, update; the GPU
    synchronised at both ends) to ``log[stage]``. Listed before the validation callback, so a step's time
    never includes its validation."""
    import torch
    from transformers import TrainerCallback

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        start: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if self.start is not None:
                sync()
                log.setdefault(stage, []).append(time.perf_counter() - self.start)
                self.start = None

    return StepTimer()


def step_summary(seconds: list[float]) -> dict[str, Any]:
    """Median and mean step time after the first two steps (warm-up: kernels, allocator), and all of them."""
    timed = seconds[2:] or seconds
    return {"n_steps": len(seconds), "median_s": round(float(np.median(timed)), 5) if timed else None,
            "mean_s": round(float(np.mean(timed)), 5) if timed else None, "first_s": round(seconds[0], 4) if seconds else None}


def _peak_memory_mib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None


def run_one(arm: str, readout: str, readout_dir: Path, seed: int, updates: int, work: Path, results: Path, settings: dict[str, Any],
            tuples, validation, seen_docs: set[str]) -> dict[str, Any]:
    import torch

    from embedtune.finetune import train_pace
    from embedtune.finetune.validation import ValidationCallback, score_model

    name = f"{arm}+seed{seed}"
    path = results / readout / f"{name}.json"
    if path.is_file():
        log.info("%s/%s: already finished", readout, name)
        return json.loads(path.read_text())
    out = work / readout / name
    shutil.rmtree(out, ignore_errors=True)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    record: dict[str, Any] = {"arm": arm, "readout": readout, "seed": seed, "updates_T": updates, **settings["record"]}
    start = time.perf_counter()
    if arm == "frozen":
        from embedtune.finetune.modeling import load_base_model

        model_dir, similarity = str(readout_dir), "cosine"
        model = load_base_model(model_dir, settings["max_seq_length"])
        record["curve"] = [{"stage": "frozen", "step": 0, "update": 0, **score_model(model, validation, "cosine", settings["encode_batch"])}]
        del model
    else:
        config = arm_config(arm, readout_dir, out, updates, seed, settings)
        curve_path = out / "validation.jsonl"
        step_seconds: dict[str, list[float]] = {}

        def callbacks(stage: str, offset: int, stage_similarity: str):
            return [step_timer(stage, step_seconds),
                    ValidationCallback(validation, curve_path, settings["eval_every"], stage_similarity, stage=stage, update_offset=offset)]

        result = train_pace(config, tuples=tuples, stage_callbacks=callbacks)
        model_dir, similarity = result.model_dir, result.similarity
        record["preset"] = config.preset
        record["config"] = result.config
        record["stages"] = [{**{k: getattr(s, k) for k in ("name", "similarity", "parameters", "steps", "steps_run", "learning_rate",
                                                             "temperature", "norm_product_median", "weighting", "seconds",
                                                             "trainable_parameters", "total_parameters")},
                             "step_seconds": step_summary(step_seconds.get(s.name, []))} for s in result.stages]
        record["updates"] = sum(s.steps_run for s in result.stages)
        record["curve"] = [json.loads(line) for line in curve_path.read_text().splitlines() if line.strip()]
    record["train_seconds"] = round(time.perf_counter() - start, 2)
    record["peak_gpu_memory_mib"] = _peak_memory_mib()
    record["similarity"] = similarity
    record["test"] = score_test(model_dir, similarity, settings, seen_docs)
    record["diagnostics"] = diagnostics(model_dir, settings)
    record["wall_seconds"] = round(time.perf_counter() - start, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if arm != "frozen":
        shutil.rmtree(out, ignore_errors=True)  # checkpoints and the model: a GPU machine's disk is not kept
    scores = record["test"]["scifact"]["subsets"]
    log.info("%s/%s: SciFact nDCG@10 all %.4f seen %s unseen %s, r %s, %.0f s", readout, name, scores["all"]["ndcg@10"],
             scores.get("seen", {}).get("ndcg@10"), scores.get("unseen", {}).get("ndcg@10"), record["diagnostics"]["coupling_r"],
             record["wall_seconds"])
    return record


# -- the tiny Qwen2-VL step ----------------------------------------------------------------------------------

def vl_step(steps: int = 3, hidden: int = 256, family: str = "qwen2_vl", allow_cpu: bool = False) -> dict[str, Any]:
    """A few Stage I (cosine + LoRA) and Stage II (merged, dot, full LM) steps on a tiny random Qwen-VL, bf16 autocast."""
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise SystemExit("vl step: no CUDA GPU visible; EMBEDTUNE_SMOKE_ALLOW_CPU=1 (or --dry-run) runs it on CPU")
    from embedtune.data.mmeb import MMEBTrainExample
    from embedtune.encoders.tiny_vl import synthetic_image, tiny_vl_embedder
    from embedtune.encoders.vision_language import TASK_INSTRUCTIONS, VLInput
    from embedtune.finetune import PACEConfig, StageConfig, train_vl_pace

    device = "cuda" if torch.cuda.is_available() else "cpu"
    embedder = tiny_vl_embedder(family, seed=0, hidden_size=hidden).to(device)
    examples = [MMEBTrainExample(VLInput("a red cat", [synthetic_image(i)], TASK_INSTRUCTIONS["vqa"]), VLInput("red"),
                                 [VLInput("", [synthetic_image(100 + i)])]) for i in range(16)]
    vision_before = {name: p.detach().clone() for name, p in embedder.vision_parameters()}
    config = PACEConfig(backbone="vl", seed=0, n_negatives=None, stage2_init="final",
                        stage1=StageConfig(steps=steps, similarity="cosine", parameters="lora", learning_rate=1e-4, temperature=0.02, warmup_ratio=0.0),
                        stage2=StageConfig(steps=steps, similarity="dot", parameters="full", learning_rate=1e-5, temperature=1.0, warmup_ratio=0.0),
                        batch_size=8, lora_rank=8)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = train_vl_pace(embedder, examples, config, autocast_dtype=torch.bfloat16)
    total = time.perf_counter() - start
    record: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                              "family": family, "hidden": hidden, "batch": config.batch_size, "dtype": "bf16-autocast", "steps_per_stage": steps,
                              "steps": [{"stage": log_.stage, "step": log_.step, "loss": log_.loss, "seconds": log_.seconds} for log_ in result["logs"]]}
    for stage in (1, 2):
        times = [log_.seconds for log_ in result["logs"] if log_.stage == stage][1:] or [float("nan")]
        record[f"stage{stage}_ms_per_step_after_warmup"] = round(1000 * sum(times) / len(times), 2)
    record["vision_frozen"] = all(torch.equal(p, vision_before[name]) for name, p in embedder.vision_parameters())
    record["peak_gpu_memory_mib"] = _peak_memory_mib()
    record["total_seconds"] = round(total, 2)
    print(f"device={record['device']} torch={record['torch']} family={family} hidden={hidden} batch={config.batch_size} dtype=bf16-autocast")
    for row in record["steps"]:
        print(f"stage {row['stage']} step {row['step']}: loss={row['loss']:.4f} step_time={row['seconds'] * 1000:.1f} ms")
    for stage in (1, 2):
        print(f"stage {stage}: mean step time after warm-up {record[f'stage{stage}_ms_per_step_after_warmup']:.1f} ms")
    print(f"vision tower + projector unchanged: {record['vision_frozen']}")
    if record["peak_gpu_memory_mib"] is not None:
        print(f"peak GPU memory allocated: {record['peak_gpu_memory_mib']:.1f} MiB")
    print(f"total: {total:.2f} s")
    return record


# -- the study ------------------------------------------------------------------------------------------------

def pack_results(results: Path, pack: Path | None) -> None:
    if pack is None:
        return
    pack.parent.mkdir(parents=True, exist_ok=True)
    staging = pack.with_name(pack.name + ".tmp")
    with tarfile.open(staging, "w:gz") as archive:
        archive.add(results, arcname=results.name)
    staging.replace(pack)


def summarise(results: Path) -> dict[str, Any]:
    """Mean SciFact nDCG@10 (all/seen/unseen) and coupling r per readout and arm, over the seeds that finished."""
    table: dict[str, Any] = {}
    for path in sorted(results.glob("*/*.json")):
        record = json.loads(path.read_text())
        key = table.setdefault(record["readout"], {}).setdefault(record["arm"], {"seeds": [], "all": [], "seen": [], "unseen": [], "coupling_r": []})
        subsets = record["test"]["scifact"]["subsets"]
        key["seeds"].append(record["seed"])
        for name in ("all", "seen", "unseen"):
            key[name].append(subsets.get(name, {}).get("ndcg@10"))
        key["coupling_r"].append(record["diagnostics"]["coupling_r"])
    for arms in table.values():
        for row in arms.values():
            for name in ("all", "seen", "unseen", "coupling_r"):
                values = [v for v in row[name] if v is not None]
                row[f"{name}_mean"] = float(np.mean(values)) if values else None
    return table


def study(args: argparse.Namespace) -> int:
    import torch

    from embedtune.data.beir import load_beir
    from embedtune.evaluate.subsets import training_positives
    from readout_model import copy_with_pooling

    deadline = time.perf_counter() + args.budget_s
    results = Path(args.out)
    results.mkdir(parents=True, exist_ok=True)
    pack = Path(args.pack) if args.pack else None
    if args.dry_run:
        setup = dry_run_setup(Path(args.work))
        bundle, data_dir, data = setup["bundle"], setup["data_dir"], setup["data"]
    else:
        if not torch.cuda.is_available() and os.environ.get("EMBEDTUNE_SMOKE_ALLOW_CPU") != "1":
            print("pace_gpu_study: no CUDA GPU visible (torch.cuda.is_available() is False); nothing was measured. "
                  "--dry-run checks the set-up on CPU.", file=sys.stderr)
            return 3
        bundle, data_dir, data = Path(args.bundle), Path(args.data_dir), "scifact"
        if not (bundle / "minilm" / "weights.xz").is_file():
            print(f"pace_gpu_study: no bundle at {bundle}; run `bash benchmarks/gpu_smoke.sh bundle` here and carry runs/gpu-bundle.",
                  file=sys.stderr)
            return 2
    os.environ.setdefault("EMBEDTUNE_SEARCH_KERNEL", "torch-64m")  # no FAISS on the GPU machine
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EMBEDTUNE_CACHE", str(work / "cache"))

    records: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:], "runs": [], "skipped": []}
    if not args.skip_vl:
        vl = vl_step(args.vl_steps, args.vl_hidden, "qwen2_vl", allow_cpu=True)
        (results / "vl_step.json").write_text(json.dumps(vl, indent=1) + "\n")
        pack_results(results, pack)
    unpacked = unpack_model(bundle / "minilm", work / "minilm-fp32")
    readouts = {"mean": unpacked, "lasttoken": copy_with_pooling(unpacked, work / "minilm-lasttoken", "lasttoken")}
    train = load_beir(data, "train")
    tuples, validation = load_data(data_dir, train)
    seen_docs = training_positives(train.qrels)
    settings = {
        "data": data, "max_seq_length": args.max_seq_length, "batch_size": args.batch_size, "n_negatives": N_NEGATIVES,
        "precision": "auto", "eval_every": args.eval_every, "encode_batch": 256 if torch.cuda.is_available() else 16,
        "diagnose_pairs": args.diagnose_pairs, "test_qrels": {q: dict(v) for q, v in load_beir(data, "test").qrels.items()},
    }
    settings["record"] = {"batch": args.batch_size, "n_negatives": N_NEGATIVES, "max_seq_length": args.max_seq_length, "stage2_init": STAGE2_INIT,
                          "n_tuples": len(tuples), "validation": {"n_queries": len(validation.query_ids), "n_docs": len(validation.doc_ids)},
                          "model": "MiniLM-L6 (all-MiniLM-L6-v2) from a bf16 copy, trained in fp32 + bf16 autocast" if not args.dry_run else "tiny random BERT (dry run)",
                          "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
                          "dry_run": bool(args.dry_run)}
    plan = [(seed, readout, arm) for seed in args.seeds for readout in args.readouts for arm in ["frozen", *args.arms]]
    last = 0.0
    for seed, readout, arm in plan:
        if arm == "frozen" and seed != args.seeds[0]:
            continue  # the frozen model has no seed
        if time.perf_counter() + last > deadline:
            records["skipped"].append(f"{readout}/{arm}+seed{seed}")
            continue
        started = time.perf_counter()
        record = run_one(arm, readout, readouts[readout], seed, args.updates, work / "runs", results, settings, tuples, validation, seen_docs)
        last = max(last, time.perf_counter() - started) if arm != "frozen" else last
        records["runs"].append({"readout": readout, "arm": arm, "seed": seed, "wall_seconds": record["wall_seconds"],
                                "ndcg@10": record["test"]["scifact"]["ndcg@10"]})
        (results / "summary.json").write_text(json.dumps({**records, "table": summarise(results)}, indent=1) + "\n")
        pack_results(results, pack)
    records["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (results / "summary.json").write_text(json.dumps({**records, "table": summarise(results)}, indent=1) + "\n")
    pack_results(results, pack)
    if records["skipped"]:
        log.warning("budget spent: %d runs not started (%s); rerun the same command to resume", len(records["skipped"]), ", ".join(records["skipped"]))
    return 0


# -- the dry run: the same path on CPU, tiny ------------------------------------------------------------------

def dry_run_setup(work: Path) -> dict[str, Any]:
    """A tiny bundle and data set in ``work``: a random 1-layer BERT packed as the study packs MiniLM, a
    SciFact subset holding the first committed tuples, and those tuples."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from embedtune.data.beir import load_beir

    sys.modules["faiss"] = None  # the GPU machine has no FAISS: the study must not need it
    work.mkdir(parents=True, exist_ok=True)
    rows = json.loads((DATA_DIR / "train_tuples.json").read_text())
    manifest = json.loads((DATA_DIR / "validation.json").read_text())
    tuples = rows["tuples"][:12]
    val_queries = manifest["query_ids"][:6]
    train, test = load_beir("scifact", "train"), load_beir("scifact", "test")
    test_queries = test.judged_query_ids()[:8]
    docs = {d for _, p, n in tuples for d in [p, *n]}
    docs |= {d for q in val_queries for d in train.qrels[q]} | {d for q in test_queries for d in test.qrels[q]}
    docs |= set(manifest["doc_ids"][:20])
    docs |= set(list(train.corpus)[:40])
    docs &= set(train.corpus)
    root = work / "beir-tiny"
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": train.corpus[d].get("title", ""), "text": train.corpus[d].get("text", "")}) + "\n"
                                               for d in train.corpus if d in docs))
    queries = {q for q, _, _ in tuples} | set(val_queries)
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": train.queries[q]}) + "\n" for q in sorted(queries))
                                        + "".join(json.dumps({"_id": q, "text": test.queries[q]}) + "\n" for q in test_queries))
    (root / "qrels").mkdir(exist_ok=True)
    train_lines = [f"{q}\t{d}\t{r}" for q in sorted(queries) for d, r in train.qrels.get(q, {}).items() if d in docs]
    test_lines = [f"{q}\t{d}\t{r}" for q in test_queries for d, r in test.qrels[q].items() if d in docs]
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(train_lines) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(test_lines) + "\n")
    data_dir = work / "data"
    data_dir.mkdir(exist_ok=True)
    (data_dir / "train_tuples.json").write_text(json.dumps({**rows, "tuples": tuples}))
    val_docs = [d for d in manifest["doc_ids"] if d in docs]
    (data_dir / "validation.json").write_text(json.dumps({**manifest, "query_ids": val_queries, "doc_ids": val_docs}))

    dataset = load_beir(root, "train")
    words = sorted({w for text in [*dataset.queries.values(), *(f"{d.get('title', '')} {d.get('text', '')}" for d in dataset.corpus.values())]
                    for w in text.lower().split()})[:2000]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    hf = work / "tiny-hf"
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                                max_position_embeddings=64))
    with torch.no_grad():
        bert.embeddings.word_embeddings.weight.normal_(0, 1.0)
    bert.save_pretrained(hf)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(hf)
    transformer = Transformer(str(hf), max_seq_length=32)
    model_dir = work / "tiny-st"
    SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()], device="cpu").save(str(model_dir))
    texts = [*dataset.queries.values(), *(f"{d.get('title', '')} {d.get('text', '')}" for d in dataset.corpus.values())]
    bundle = work / "bundle"
    pack_model(model_dir, bundle / "minilm", used_token_ids(model_dir, texts))
    return {"bundle": bundle, "data_dir": data_dir, "data": str(root)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from embedtune.runtime import set_progress

    set_progress(os.environ.get("PACE_STUDY_PROGRESS") == "1")  # bars would fill the device call's 12,000-character tail
    for noisy in ("sentence_transformers", "transformers", "httpx", "faiss.loader", "datasets", "embedtune"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--dry-run" in argv and not any(a in ("run", "bundle", "prepare-data", "vl") for a in argv):
        argv = ["run", *argv]
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    if argv[0] == "vl" or argv[0].isdigit():  # the former gpu_smoke.sh: [STEPS_PER_STAGE] [HIDDEN_SIZE] [FAMILY]
        rest = argv[1:] if argv[0] == "vl" else argv
        steps, hidden, family = int(rest[0]) if rest else 3, int(rest[1]) if len(rest) > 1 else 256, rest[2] if len(rest) > 2 else "qwen2_vl"
        import torch

        allow = os.environ.get("EMBEDTUNE_SMOKE_ALLOW_CPU") == "1"
        if not torch.cuda.is_available() and not allow:
            print("gpu_smoke: no CUDA GPU visible (torch.cuda.is_available() is False); nothing was measured.", file=sys.stderr)
            return 3
        return 0 if vl_step(steps, hidden, family, allow_cpu=allow)["vision_frozen"] else 1
    parser = argparse.ArgumentParser(prog="pace_gpu_study", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare-data", help="here, once: split, mine 5 hard negatives, validation pool -> benchmarks/data/pace-gpu-study")
    bundle = commands.add_parser("bundle", help="here: runs/gpu-bundle (MiniLM in bf16, the wheels the GPU machine lacks)")
    bundle.add_argument("--no-wheels", action="store_true", help="skip the pip download of the wheels")
    run = commands.add_parser("run", help="the study (GPU), or --dry-run (CPU, tiny)")
    run.add_argument("--dry-run", action="store_true", help="CPU, tiny settings: one step per arm, one seed, both readouts")
    run.add_argument("--updates", type=int, default=150,
                     help="T (default 150: 6.5 passes over the 736 tuples at batch 32, the passes of the CPU study's 300 updates at batch 16)")
    run.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    run.add_argument("--readouts", nargs="+", default=list(READOUTS), choices=READOUTS)
    run.add_argument("--arms", nargs="+", default=list(ARMS), help="A..E, or <letter>@s2lr<lr> for a Stage II learning rate")
    run.add_argument("--eval-every", type=int, default=50, help="validation interval in updates")
    run.add_argument("--batch-size", type=int, default=BATCH)
    run.add_argument("--max-seq-length", type=int, default=MAX_SEQ)
    run.add_argument("--diagnose-pairs", type=int, default=None, help="train pairs diagnosed (default: all)")
    run.add_argument("--budget-s", type=float, default=530.0, help="start no run that would end past this many seconds")
    run.add_argument("--vl-steps", type=int, default=3)
    run.add_argument("--vl-hidden", type=int, default=256)
    run.add_argument("--skip-vl", action="store_true")
    run.add_argument("--bundle", default=str(BUNDLE))
    run.add_argument("--data-dir", default=str(DATA_DIR))
    run.add_argument("--out", default=None, help=f"results folder (default {RESULTS.relative_to(REPO)}; dry run: <work>/results)")
    run.add_argument("--work", default=None, help="models, checkpoints, caches (default: a temporary folder)")
    run.add_argument("--pack", default=None, help="also write the results folder as this .tar.gz after every run (e.g. $OUT/...)")
    args = parser.parse_args(argv)
    if args.command == "prepare-data":
        prepare_data()
        return 0
    if args.command == "bundle":
        build_bundle(wheels=not args.no_wheels)
        return 0
    with contextlib.ExitStack() as stack:
        if args.work is None:
            args.work = stack.enter_context(tempfile.TemporaryDirectory(prefix="pace-gpu-study-"))
        if args.dry_run:
            args.updates, args.seeds, args.eval_every, args.batch_size, args.max_seq_length = 1, args.seeds[:1], 1, 4, 32
            args.vl_steps, args.vl_hidden, args.diagnose_pairs = 1, 32, 8
            args.budget_s = float("inf")
            import torch

            torch.set_num_threads(1)
        if args.out is None:
            args.out = str(Path(args.work) / "results") if args.dry_run else str(RESULTS)
        return study(args)


if __name__ == "__main__":
    sys.exit(main())
