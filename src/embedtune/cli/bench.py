"""``embedtune benchmark dive|index`` and ``embedtune report dive``.

``embedtune bench`` is the deprecated old name of ``benchmark`` (one release).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from embedtune.bench.dive_protocol import plan_protocol, run_protocol
from embedtune.bench.dive_report import build_report
from embedtune.bench.protocol_config import load_protocol_config
from embedtune.bench.summary import protocol_summary
from embedtune.cli.common import add_data_flags, add_list_flag, command_config, command_line, print_json
from embedtune.encoders import resolve_model_path
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.io import atomic_write_json
from embedtune.workflows.results import json_safe, write_results
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir, prepare_output_file

DEPRECATED_NAME = "bench"


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    bench = commands.add_parser("benchmark", aliases=[DEPRECATED_NAME],
                                help="run a benchmark: a paper's protocol grid (dive) or search efficiency (index); "
                                "`bench` is a deprecated alias")
    sub = bench.add_subparsers(dest="benchmark_name", metavar="BENCHMARK", required=True)
    dive = sub.add_parser("dive", formatter_class=fmt, help="the DIVE paper's protocol: every table and figure",
                          description="Runs the main comparison, ablation, unsupervised, learning-rate audit, head-count, dynamics "
                          "and significance studies. Finished runs are skipped, so an interrupted grid resumes where it stopped.")
    dive.add_argument("--config", default=None, help="protocol TOML (default: the paper's protocol, benchmarks/dive_paper.toml)")
    add_list_flag(dive, "--backbones", default=None, help="only these backbone names from the config")
    add_list_flag(dive, "--datasets", default=None, help="only these dataset names from the config")
    add_list_flag(dive, "--studies", default=None, help="only these studies")
    add_list_flag(dive, "--methods", default=None, help="only these methods")
    add_list_flag(dive, "--final-seeds", default=None, item_type=int, help="override the final seeds")
    add_list_flag(dive, "--selection-seeds", default=None, item_type=int, help="override the validation-study seeds")
    dive.add_argument("--out", "--results", dest="results", default=None,
                      help="results folder, read to resume and written (default: the config's results_dir); a folder an earlier "
                           "benchmark dive wrote is resumed, any other non-empty folder refused")
    dive.add_argument("--overwrite", action="store_true",
                      help=OVERWRITE_HELP + " (re-running into the same folder resumes instead; --overwrite runs the grid again)")
    dive.add_argument("--no-report", action="store_true", help="skip building REPORT.md at the end")
    dive.add_argument("--protocol", default=None, choices=["paper", "beir-train"],
                      help="paper: 60/20/20 of the test qrels; beir-train: train on qrels/train.tsv, test on every test query")
    dive.add_argument("--selection-only", action="store_true",
                      help="run phase one only (no retraining of selected learning rates / preset), e.g. to select across datasets run separately")
    dive.add_argument("--workers", type=int, default=1,
                      help="processes sharing the grid through claim files (each uses the config's threads); "
                           "2 on a 2-core machine halves the wall-clock time")
    dive.add_argument("--rerun-changed", action="store_true",
                      help="run again the finished runs made with other inputs (split, mining, data, model or method config); "
                           "without it such runs stop the benchmark with the differing fields, so a results folder never mixes configs")
    dive.add_argument("--dry-run", action="store_true",
                      help="say how many runs are finished, to do, or made with other inputs, then exit (runs and writes nothing)")
    dive.set_defaults(handler=run_benchmark_dive)

    index = sub.add_parser("index", formatter_class=fmt, help="exact flat search at full vs compressed dims (DIVE §4.9)",
                           description="Memory, build time, single-query latency p50/p95 and batched throughput of exact "
                           "inner-product search, FAISS IndexFlatIP beside embedtune's exact_search, with ratios against full d "
                           "measured in the same run. An exact flat index costs the same whatever the vectors contain.")
    add_data_flags(index, split=False, many=True, help="BEIR corpora ('' for none)")
    index.add_argument("--model", default="minilm", help="encoder of the corpora")
    add_list_flag(index, "--synthetic", default=[100000], item_type=int,
                  help="synthetic corpus sizes, e.g. 100000 1000000 ('' for none)")
    index.add_argument("--synthetic-dim", type=int, default=768, help="full dimension of the synthetic corpora")
    add_list_flag(index, "--dims", default=[256, 128, 64], item_type=int, help="compressed dims to compare with full d")
    index.add_argument("--k", type=int, default=10, help="neighbours per query")
    index.add_argument("--batch", type=int, default=256, help="queries per batched search")
    index.add_argument("--rounds", type=int, default=5, help="timing rounds (every dim and engine per round)")
    index.add_argument("--singles", type=int, default=20, help="single-query searches per dim, engine and round")
    add_list_flag(index, "--engines", default=["faiss", "embedtune"], help="faiss, embedtune, or both")
    # index_factory strings contain commas, so this list is space-separated only (';' still works).
    index.add_argument("--ann", nargs="*", default=[],
                       help="index_factory strings for approximate indexes, e.g. --ann IVF1024,Flat HNSW32")
    index.add_argument("--out", default=None, help="write the full result as JSON here (an existing file is refused unless --overwrite)")
    index.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never one of the --data inputs)")
    index.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    index.set_defaults(handler=run_benchmark_index)

    report = commands.add_parser("report", help="build a Markdown report from a results folder")
    rsub = report.add_subparsers(dest="report_name", metavar="PROTOCOL", required=True)
    rdive = rsub.add_parser("dive", formatter_class=fmt, help="REPORT.md + PNGs from a DIVE protocol results folder")
    rdive.add_argument("--results", default="benchmarks/results/dive", help="results folder")
    rdive.add_argument("--n-resamples", type=int, default=10_000, help="significance resamples")
    rdive.set_defaults(handler=run_report_dive)


def run_benchmark_dive(args: argparse.Namespace) -> int:
    config = load_protocol_config(args.config, studies=args.studies, methods=args.methods, final_seeds=args.final_seeds,
                                  selection_seeds=args.selection_seeds, results_dir=args.results, protocol=args.protocol)
    if args.backbones:
        missing = set(args.backbones) - {b.name for b in config.backbones}
        if missing:
            raise ValueError(f"--backbones {sorted(missing)} not in {config.source}; known: {[b.name for b in config.backbones]}.")
        config.backbones = [b for b in config.backbones if b.name in args.backbones]
    if args.datasets:
        missing = set(args.datasets) - {d.name for d in config.datasets}
        if missing:
            raise ValueError(f"--datasets {sorted(missing)} not in {config.source}; known: {[d.name for d in config.datasets]}.")
        config.datasets = [d for d in config.datasets if d.name in args.datasets]
    # The results folder follows the --out rules of every writer: one an earlier `benchmark dive` wrote (by its marker, or
    # its runs/ and splits/ from before markers) is resumed; any other non-empty folder is refused unless --overwrite.
    prepare_output_dir(config.results_dir, args.overwrite, inputs=[args.config], command="benchmark dive", resume=True,
                       legacy_names=("runs", "splits"), check_only=args.dry_run)
    if args.dry_run:
        for phase, plan in plan_protocol(config, rerun_changed=args.rerun_changed).items():
            print(f"{phase}: {plan.summary()}")
        return 0
    start = time.perf_counter()
    records = run_protocol(config, phase_two=not args.selection_only, workers=args.workers, rerun_changed=args.rerun_changed)
    seconds = time.perf_counter() - start
    metrics, per_query, rows, table = protocol_summary(records)
    root = Path(config.results_dir)
    data = {}
    for dataset in config.datasets:
        manifest = root / "splits" / f"{dataset.name.replace('/', '__')}.json"
        fingerprints = json.loads(manifest.read_text(encoding="utf-8")).get("source_sha256") if manifest.is_file() else None
        data[dataset.name] = {"source": dataset.path, "fingerprints": fingerprints, "split_manifest": str(manifest) if fingerprints else None}
    models = {}
    for backbone in config.backbones:
        path = resolve_model_path(backbone.model)
        models[backbone.name] = {"name": backbone.model, "path": str(path), "fingerprint": fingerprint_model_dir(path)}
    path = write_results(root, task="benchmark dive", command=command_line(args),
                         config={**command_config(args), "protocol": json_safe(dataclasses.asdict(config))},
                         data=data, model=models, metrics=metrics, per_query=per_query, rows=rows, table=table,
                         extra={"n_runs": len(records), "seconds": seconds})
    print("held-out main comparison (mean ± std over seeds where a method ran more than once):")
    print(table)
    print(f"{len(records)} runs finished in {seconds:.1f}s; results: {path}")
    if not args.no_report:
        print(f"report: {build_report(config.results_dir, config.n_resamples)}")
    finish_output_dir(config.results_dir, "benchmark dive")
    return 0


def run_benchmark_index(args: argparse.Namespace) -> int:
    from embedtune.bench.efficiency import ANN_COLUMNS, FLAT_COLUMNS, format_table, run_index_benchmark  # heavy optional dependency: faiss

    unknown = set(args.engines) - {"faiss", "embedtune"}
    if unknown or not args.engines:
        raise ValueError(f"--engines takes faiss and/or embedtune; got {args.engines!r}.")
    if args.out:  # refused before the (long) measurement, like every writer's --out
        prepare_output_file(args.out, args.overwrite, inputs=args.data or ())
    result = run_index_benchmark(
        datasets=args.data,
        model=args.model,
        synthetic=args.synthetic,
        synthetic_dim=args.synthetic_dim,
        dims=args.dims,
        k=args.k,
        batch=args.batch,
        rounds=args.rounds,
        singles=args.singles,
        engines=tuple(args.engines),
        ann=[factory.strip() for value in args.ann for factory in value.split(";") if factory.strip()],
    )
    if args.out:
        atomic_write_json(args.out, result)
    if args.json:
        print_json(result)
        return 0
    machine = result["machine"]
    print(f"machine: {machine['cpu']}, {machine['cpus']} CPUs, threads {machine['threads']}, FAISS {machine['faiss']} "
          f"({machine['faiss_simd_level']}), torch {machine['torch']}; {machine['date']}")
    print(result["note"])
    print(format_table(result["flat"], FLAT_COLUMNS))
    print("ratios: against the largest d of the same corpus and engine, measured in this run (higher is better).")
    print(result["paper"])
    if result["ann"]:
        print(format_table(result["ann"], ANN_COLUMNS))
    if args.out:
        print(f"saved to {args.out}")
    return 0


def run_report_dive(args: argparse.Namespace) -> int:
    print(build_report(args.results, args.n_resamples))
    return 0
