"""Acceptance runs of PACE on SciFact (real MiniLM, CPU). Usage: python benchmarks/pace_minilm_scifact.py NAME [NAME ...]"""
import json, logging, os, sys, time
import torch
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
for n in ("sentence_transformers", "transformers", "httpx", "faiss.loader"): logging.getLogger(n).setLevel(logging.WARNING)
from embedtune.finetune import preset_config, train_pace, evaluate_model
from embedtune.workflows.diagnose import diagnose_model
from embedtune.io import atomic_write_json

ROOT = os.environ.get("PACE_RUNS", "runs/pace")
CAP = 64          # max_seq_length for training, evaluation and diagnostics
SEED = 2027
BATCH = 16
S1, S2 = 40, 30   # PACE: Stage I schedule 40 steps, Stage II from step 10 (25%), 30 steps -> 40 updates on its path
COMMON = dict(model="minilm", data="scifact", train_split="train", max_seq_length=CAP, batch_size=BATCH, seed=SEED, save_steps=10)

def run(name):
    out = f"{ROOT}/{name}"
    record = {"name": name, "cap": CAP, "seed": SEED, "batch": BATCH}
    t = time.perf_counter()
    if name == "frozen":
        metrics = evaluate_model("minilm", "scifact", "test", similarity="cosine", max_seq_length=CAP)
        record.update(similarity="cosine", metrics=metrics.to_dict())
    elif name == "frozen-dot":
        # The frozen model without its Normalize module, ranked by the raw dot product.
        from embedtune.finetune import load_base_model
        load_base_model("minilm", max_seq_length=CAP).save(f"{out}/model")
        metrics = evaluate_model(f"{out}/model", "scifact", "test", similarity="dot", max_seq_length=CAP)
        record.update(similarity="dot", metrics=metrics.to_dict())
    elif name.startswith("diag-"):
        target = name[5:]
        model = "minilm" if target == "frozen" else f"{ROOT}/{target}/model"
        report = diagnose_model(model, "scifact", "train", n_pairs=None, seed=0, max_seq_length=CAP, out_dir=out)
        record.update(report.to_dict())
    else:
        preset, _, variant = name.partition("@")
        extra = {}
        if preset in ("pace", "no-focal"):
            extra = dict(stop_stage1_at_init=True)  # same init checkpoint as the full Stage I run, less compute
        if variant.startswith("gamma"):
            extra["gamma"] = float(variant[5:])
        elif variant:
            extra["weighting"] = variant
        if preset == "stage1-only":
            config = preset_config(preset, stage1_steps=S1, output_dir=out, **COMMON, **extra)
        else:
            config = preset_config(preset, stage1_steps=S1, stage2_steps=S2, output_dir=out, **COMMON, **extra)
        result = train_pace(config, evaluate_split="test")
        record.update(similarity=result.similarity, metrics=result.metrics, seconds=result.seconds,
                      stages=[{k: getattr(s, k) for k in ("name", "similarity", "parameters", "steps", "steps_run", "learning_rate",
                               "temperature", "norm_product_median", "weighting", "gamma", "seconds", "init_checkpoint",
                               "trainable_parameters", "total_parameters")} for s in result.stages])
    record["wall_seconds"] = time.perf_counter() - t
    atomic_write_json(f"{ROOT}/results/{name}.json", record)
    logging.info("DONE %s %s", name, json.dumps({k: record.get("metrics", {}).get(k) for k in ("ndcg@10", "recall@10")} if "metrics" in record else {k: record.get(k) for k in ("coupling_r", "random_pair_cosine")}))

for name in sys.argv[1:]:
    run(name)
