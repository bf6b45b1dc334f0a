"""Focal Embedding Loss against sentence-transformers' MNRL, and GradCache focal against CMNRL.

Usage (from the repo root): python benchmarks/pace_loss_speed.py [--rounds 6] [--batch 16] [--seq 128]

Every loss trains the same LoRA MiniLM on the same (query, positive, hard negative) batch of real
SciFact texts. The losses are timed round-robin, one optimizer step each per round, so machine noise
falls on all of them alike; the figure is the ratio of median step times, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)

from embedtune.data.beir import document_text, load_beir
from embedtune.finetune.losses import CachedFocalEmbeddingLoss, FocalEmbeddingLoss
from embedtune.finetune.modeling import add_lora, load_base_model


def batch_texts(batch: int) -> list[list[str]]:
    dataset = load_beir("scifact", "train")
    query_ids = dataset.judged_query_ids()[:batch]
    doc_ids = list(dataset.corpus)
    positives = [next(iter(dataset.qrels[q])) for q in query_ids]
    negatives = [doc_ids[(7 * i + 11) % len(doc_ids)] for i in range(batch)]
    return [[dataset.queries[q] for q in query_ids], [document_text(dataset.corpus[d]) for d in positives],
            [document_text(dataset.corpus[d]) for d in negatives]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--mini-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = add_lora(load_base_model("minilm", max_seq_length=args.seq), rank=32, alpha=64, dropout=0.0,
                     target_modules="all-linear", exclude_modules=r".*pooler.*")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
    texts = batch_texts(args.batch)
    features = [model.preprocess(column) for column in texts]
    # τ = 0.1 for every loss: MNRL's scale is 1/τ.
    losses = {
        "focal": FocalEmbeddingLoss(model, similarity="cosine", temperature=0.1, gather_across_devices=False),
        "mnrl": MultipleNegativesRankingLoss(model, scale=10.0),
        "focal-gradcache": CachedFocalEmbeddingLoss(model, similarity="cosine", temperature=0.1, mini_batch_size=args.mini_batch,
                                                    gather_across_devices=False),
        "cmnrl": CachedMultipleNegativesRankingLoss(model, scale=10.0, mini_batch_size=args.mini_batch),
    }
    times: dict[str, list[float]] = {name: [] for name in losses}
    for round_index in range(args.rounds + 1):
        for name, loss in losses.items():
            start = time.perf_counter()
            value = loss([{k: (v.clone() if torch.is_tensor(v) else v) for k, v in f.items()} for f in features], None)
            value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if round_index:  # round 0 warms every code path up
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    ratios = {"focal vs MNRL": median["mnrl"] / median["focal"], "GradCache focal vs CMNRL": median["cmnrl"] / median["focal-gradcache"]}
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(), "cpus": os.cpu_count(),
        "torch_threads": args.threads, "batch": args.batch, "mini_batch": args.mini_batch, "max_seq_length": args.seq,
        "rounds": args.rounds, "median_step_seconds": median, "steps_per_second_ratio": ratios, "all_step_seconds": times,
    }
    for name, seconds in median.items():
        print(f"{name:16s} median {seconds:.3f} s/step over {len(times[name])} steps")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.3f}x the steps per second (target >= 0.95)")
    if args.out:
        from embedtune.io import atomic_write_json

        atomic_write_json(args.out, record)
    print(json.dumps({"steps_per_second_ratio": ratios}))


if __name__ == "__main__":
    main()
