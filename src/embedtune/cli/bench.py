"""``embedtune benchmark dive`` and ``embedtune report dive``."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    bench = commands.add_parser("benchmark", help="run a paper's evaluation protocol (resumable)")
    sub = bench.add_subparsers(dest="benchmark_name", metavar="PROTOCOL", required=True)
    dive = sub.add_parser("dive", formatter_class=fmt, help="the DIVE paper's protocol: every table and figure",
                          description="Runs the main comparison, ablation, unsupervised, learning-rate audit, head-count, dynamics "
                          "and significance studies. Finished runs are skipped, so an interrupted grid resumes where it stopped.")
    dive.add_argument("--config", default=None, help="protocol TOML (default: the paper's protocol, benchmarks/dive_paper.toml)")
    dive.add_argument("--backbones", nargs="+", default=None, help="only these backbone names from the config")
    dive.add_argument("--datasets", nargs="+", default=None, help="only these dataset names from the config")
    dive.add_argument("--studies", nargs="+", default=None, help="only these studies")
    dive.add_argument("--methods", nargs="+", default=None, help="only these methods")
    dive.add_argument("--final-seeds", type=int, nargs="+", default=None, help="override the final seeds")
    dive.add_argument("--selection-seeds", type=int, nargs="+", default=None, help="override the validation-study seeds")
    dive.add_argument("--results", default=None, help="results folder (default: the config's results_dir)")
    dive.add_argument("--no-report", action="store_true", help="skip building REPORT.md at the end")
    dive.add_argument("--protocol", default=None, choices=["paper", "beir-train"],
                      help="paper: 60/20/20 of the test qrels; beir-train: train on qrels/train.tsv, test on every test query")
    dive.add_argument("--selection-only", action="store_true",
                      help="run phase one only (no retraining of selected learning rates / preset), e.g. to select across datasets run separately")
    dive.add_argument("--workers", type=int, default=1,
                      help="processes sharing the grid through claim files (each uses the config's threads); "
                           "2 on a 2-core machine halves the wall-clock time")
    dive.set_defaults(handler=run_benchmark_dive)

    report = commands.add_parser("report", help="build a Markdown report from a results folder")
    rsub = report.add_subparsers(dest="report_name", metavar="PROTOCOL", required=True)
    rdive = rsub.add_parser("dive", formatter_class=fmt, help="REPORT.md + PNGs from a DIVE protocol results folder")
    rdive.add_argument("--results", default="benchmarks/results/dive", help="results folder")
    rdive.add_argument("--n-resamples", type=int, default=10_000, help="significance resamples")
    rdive.set_defaults(handler=run_report_dive)


def run_benchmark_dive(args: argparse.Namespace) -> int:
    import time

    from embedtune.bench.dive_protocol import run_protocol
    from embedtune.bench.dive_report import build_report
    from embedtune.bench.protocol_config import load_protocol_config

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
    start = time.perf_counter()
    records = run_protocol(config, phase_two=not args.selection_only, workers=args.workers)
    print(f"{len(records)} runs finished in {time.perf_counter() - start:.1f}s; results in {config.results_dir}")
    if not args.no_report:
        print(f"report: {build_report(config.results_dir, config.n_resamples)}")
    return 0


def run_report_dive(args: argparse.Namespace) -> int:
    from embedtune.bench.dive_report import build_report

    print(build_report(args.results, args.n_resamples))
    return 0
