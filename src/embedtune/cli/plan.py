"""``embedtune compress plan``: the cheapest setting that meets a quality target, or the best within a byte budget."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import Any

from embedtune.cli.common import (
    HelpFormatter,
    DATA_HELP,
    add_data_flags,
    add_list_flag,
    add_model_flags,
    encoder_options_from_args,
    experiment_from_args,
    print_json,
    print_table,
)
from embedtune.data.pseudo_queries import PSEUDO_QUERY_SOURCES
from embedtune.index.bill import DEFAULT_PRICE_PER_GB_MONTH, PRICE_ASSUMPTION
from embedtune.index.codecs import PRECISIONS, codec_family, is_registered_codec, registered_codecs
from embedtune.index.fit_sample import MIN_FIT_SAMPLE, ROWS_PER_DIMENSION
from embedtune.index.refine import DEFAULT_REFINE_CANDIDATES
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.label_free import (
    DEFAULT_HELD_OUT_FRACTION,
    LABEL_FREE_METHODS,
    LABEL_FREE_OBJECTIVES,
    check_label_free_method,
    encode_unlabelled_queries,
    load_corpus_experiment,
    run_label_free_plan,
)
from embedtune.workflows.pareto import best_within
from embedtune.workflows.plan import (
    CODEC_BUDGETS,
    LEARNED_GATE_P,
    DEFAULT_CODECS,
    SEARCHED_CODEC_BUDGETS,
    SEARCHED_CODECS,
    DEFAULT_PEERS,
    DEFAULT_PRECISIONS,
    REFERENCE_CODEC,
    check_codecs,
    held_once_bytes,
    run_plan,
)

__all__ = ["register", "run_plan_command"]

# gap_db: dB above the Gaussian rate-distortion bound; tier: "disk-rescore" frontier rows are chosen only with --allow-disk-rescore.
# The bill: disk_read (bytes read from disk per query), f32_share (of the float32 vector's bytes), vectors per GB, RAM and $/month
# at a billion vectors (every scale is in plan.json's rows).
BILL_COLUMNS = ["disk_read", "f32_share", "vec/GB", "RAM@1M", "RAM@100M", "RAM@1B", "$/mo@1B"]
COLUMNS = ["setting", "ram_bytes", "disk_bytes", "gap_db", "tier", "ndcg@10", "recall@10", "latency_ms", *BILL_COLUMNS]
LABEL_FREE_COLUMNS = ["setting", "ram_bytes", "disk_bytes", "gap_db", "tier", "objective", "latency_ms", *BILL_COLUMNS]
SUPERVISED_METHODS = ["truncate", "pca", "dive"]


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``plan`` to the ``compress`` group (registered before this)."""
    sub = _subcommands(commands.choices["compress"])
    plan = sub.add_parser(
        "plan",
        formatter_class=HelpFormatter,
        help="sweep compressor x dimension x precision on validation queries, pick the cheapest setting meeting a target "
             "(or the best within a byte budget), fit it and write a deployable folder",
        description="Scores every compressor (--methods) at every dimension (--dims, default d, d/2, d/3, d/6, d/12) and "
                    "precision (--precisions), plus FAISS PQ/OPQ, RaBitQ, TurboQuant and SQ4 on the uncompressed vectors (--peers) "
                    "and the registered codecs on every space (--codecs, --codec-budgets), on the validation queries only; "
                    "chooses among settings served from RAM alone (--allow-disk-rescore adds those that rescore from disk); "
                    "prints the Pareto frontier of nDCG@10 against bytes per vector in RAM, writes frontier.png, and refits the "
                    "choice on train+val into OUT (compressor/, precision.json, int8 calibration, plan.json with the FAISS "
                    "factory string). `embedtune index build --plan OUT` builds exactly that index. --final scores the choice "
                    "once on the held-out test queries.",
    )
    target = plan.add_argument_group("target (one or both)")
    target.add_argument("--budget-bytes", type=float, default=None, help="bytes per vector in RAM the choice may use at most")
    target.add_argument("--target-retention", type=float, default=None,
                        help="share of the uncompressed float32 model's validation nDCG@10 to keep, e.g. 0.97")
    # No default here: a label-free plan on --doc-embeddings reads no dataset (its texts only when --data names one);
    # every other plan defaults to the bundled SciFact (run_plan_command).
    add_data_flags(plan, default=None, help=DATA_HELP + " (default: scifact; none with --label-free and --doc-embeddings)")
    add_model_flags(plan)
    plan.add_argument("--protocol", choices=["paper", "beir-train"], default="paper",
                      help="paper: 60/20/20 split of the judged queries; beir-train: train and validate on qrels/train.tsv, test on --split")
    plan.add_argument("--split-seed", type=int, default=2027, help="seed of the query split")
    add_list_flag(plan, "--methods", default=None, help=f"compressors to sweep (default: {' '.join(SUPERVISED_METHODS)}; with "
                  f"--label-free: {' '.join(LABEL_FREE_METHODS)}, unsupervised ones only)")
    add_list_flag(plan, "--dims", default=[], item_type=int, help="dimensions (default: d, d/2, d/3, d/6, d/12)")
    add_list_flag(plan, "--precisions", default=None, help=f"precisions of each compressed space: {', '.join(PRECISIONS)} "
                  f"(default: {' '.join(DEFAULT_PRECISIONS)}; with --label-free: all of them)")
    add_list_flag(plan, "--peers", default=list(DEFAULT_PEERS), help="FAISS peers on the uncompressed vectors: pq, opq, pq-fs, ivf-pq-fs (at the precisions' byte "
                  "sizes), rq, prq, lsq (FAISS additive quantisers RQmx8, PRQ2x(m/2)x8, LSQmx8 at those sizes; minutes to train, so never "
                  "a default), "
                  "rabitq (rabitq1, rabitq1-rescore, rabitq4), turboquant (turboquant1, turboquant4), int4; and csr (CSR's sparse codes, "
                  "fitted on the corpus like the sweep's compressors: compared, never chosen) ('' for none)")
    add_list_flag(plan, "--codecs", default=list(DEFAULT_CODECS), help="registered codec families scored on the uncompressed vectors "
                  f"and on every compressor's output at each --codec-budgets size that fits: {', '.join(sorted(registered_codecs()))} "
                  f"(default: {' '.join(DEFAULT_CODECS)}, which fits in seconds; a -sphere family ranks its plain family's codes by "
                  "their decoded direction, reuses that fit, and is scored only on vectors of one norm (every compressor's output; "
                  "the uncompressed vectors where theirs share one); "
                  "klt-pq, klt-wpq and klt-apq fit for tens of seconds "
                  "per budget and space, klt-rq for minutes: opt-in. klt-apq kept the most of float32 retrieval in the "
                  "near-limit benchmark at 16-48 B on most corpora, docs/codecs.md); with any, the textbook transform coder "
                  f"({REFERENCE_CODEC}) is scored on the uncompressed vectors as their reference, never chosen ('none' for none)")
    add_list_flag(plan, "--searched-codecs", default=list(SEARCHED_CODECS),
                  help="codec families fitted on the uncompressed vectors only, at the fewest of "
                       f"{' '.join(map(str, SEARCHED_CODEC_BUDGETS))} bytes that find the cheapest keeping --target-retention "
                       "(a bisection: a family's quality grows with its bytes), or the dearest within --budget-bytes "
                       f"(default: {' '.join(SEARCHED_CODECS)}, about a minute a budget on 65,536 rows; 'none' for none)")
    add_list_flag(plan, "--codec-budgets", default=list(CODEC_BUDGETS), item_type=int, help="bytes per vector the codecs are scored at")
    plan.add_argument("--learned-gate-p", type=float, default=LEARNED_GATE_P, metavar="P",
                      help="choose a learned map (DIVE) only where its validation scores beat the best setting without one at its "
                           f"bytes by a paired test below P (default {LEARNED_GATE_P}; above 1: by any higher mean)")
    plan.add_argument("--allow-disk-rescore", action="store_true",
                      help="let the choice be a setting that rescores its candidates with float32 vectors read from disk at query time "
                           "(binary-rescore, rabitq1-rescore), and score a +refine<N> copy of every in-RAM setting within the budget "
                           "(its top N rescored with the original, uncompressed float32 vectors, as FAISS's IndexRefineFlat) beside "
                           "FAISS's IndexRefineFlat over PCA + PQ; by default the plan chooses among settings served from RAM alone")
    plan.add_argument("--count-tables", action="store_true",
                      help="a setting costs its codes plus its share of the corpus's rows of what it holds once (a codec's rotations and "
                           "codebooks, the weights of a PCA or DIVE map in front), in "
                           "the budget, the choice and the frontier: on a small corpus a codec's tables can outweigh its codes and "
                           "even the float32 vectors; with --target-retention every setting is scored, with a budget alone each codec "
                           "and peer ladder is searched down from its dearest level within it. By default a setting costs "
                           "its codes, as FAISS counts them, and the plan says where the tables outweigh them")
    plan.add_argument("--allow-index-over-float32", action="store_true",
                      help="let the choice be a setting whose index, its codes plus its share of its tables and map over the corpus's "
                           "rows, is larger than the float32 vectors (a codec's tables can be, on a corpus of a few thousand rows); "
                           "by default such a setting is scored and listed but not chosen")
    plan.add_argument("--refine-candidates", type=int, default=DEFAULT_REFINE_CANDIDATES, metavar="N",
                      help="with --allow-disk-rescore: the candidates a +refine<N> setting rescores with the original vectors "
                           "(N x 4 x d bytes read from disk per query)")
    add_list_flag(plan, "--variants", default=[], help="named variants swept beside each method's default, where the method "
                  "has the option: qat-binary (DIVE trained for binary codes, straight-through sign), qat-int8")
    free = plan.add_argument_group("without labels (--label-free)")
    free.add_argument("--label-free", choices=LABEL_FREE_OBJECTIVES, default=None,
                      help="choose without relevance labels: agreement (recall@10 of the uncompressed float32 top-10, on held-out "
                           "corpus documents or --unlabelled-queries) or pseudo-queries (nDCG@10 of the held-out documents' titles "
                           "or first sentences, each retrieving its own document); sweeps unsupervised compressors only. Reads "
                           "only the corpus (--data may be a corpus.jsonl, or --doc-embeddings alone); --final then scores the "
                           "choice on the labelled test queries")
    free.add_argument("--unlabelled-queries", default=None, metavar="FILE",
                      help="with --label-free agreement: your queries, no labels (JSONL or TSV, as `index search --queries`), "
                           "encoded with --model; default: held-out corpus documents are the queries")
    free.add_argument("--held-out-fraction", type=float, default=DEFAULT_HELD_OUT_FRACTION,
                      help="share of the corpus withheld from fitting to validate on (hashed by --seed; at most 1000 documents)")
    free.add_argument("--pseudo-query-source", choices=list(PSEUDO_QUERY_SOURCES), default=None,
                      help="what a document's pseudo-query is: its title (its first sentence where the title is empty or shared), "
                           "always its first sentence, or its first 12 words (a corpus without titles or sentence ends). Makes the queries "
                           "of --label-free pseudo-queries and those DIVE's text preset trains and guards on (default: title for "
                           "the first; title, then first-words for the second)")
    scale = plan.add_argument_group("scale and the bill")
    scale.add_argument("--fit-sample", type=int, default=None, metavar="ROWS",
                       help=f"corpus rows the plan fits on, a seeded sample (default: min(N, max({MIN_FIT_SAMPLE:,}, {ROWS_PER_DIMENSION} x d)) "
                            "of an N x d corpus). A label-free plan runs its whole sweep on the sample (fits, held-out documents, "
                            "indexes, scores) and refits the choice on it; a labelled plan trains its FAISS peers and codecs on it. "
                            "Recorded in plan.json (fit_sample)")
    scale.add_argument("--no-full-corpus-check", action="store_true",
                       help="a label-free agreement plan that ran on a sample measures its choice over every document "
                            "afterwards (plan.json: full_corpus), since a denser corpus lowers agreement; skip that check")
    scale.add_argument("--full-sweep", action="store_true",
                       help="fit and score every setting of the sweep, the whole frontier; by default a setting the choice could "
                            "not be (above --budget-bytes, or dearer than a scored setting that keeps --target-retention) is skipped "
                            "and listed in plan.json (skipped_settings, skipped_peers). The choice is the same either way")
    scale.add_argument("--price-per-gb-month", type=float, default=DEFAULT_PRICE_PER_GB_MONTH, metavar="USD",
                       help=f"dollars per GB (10^9 bytes) of RAM a month for the bill's columns (default {DEFAULT_PRICE_PER_GB_MONTH:g}: "
                            f"{PRICE_ASSUMPTION.replace('%', '%%')})")
    plan.add_argument("--seed", type=int, default=2027, help="training seed")
    plan.add_argument("--final", action="store_true", help="also score the choice once on the held-out test queries")
    plan.add_argument("--work", default=None, help="folder of the sweep's fits, reused by a later plan (default: one folder per dataset under "
                      "the embedtune cache, $EMBEDTUNE_CACHE/plan-sweeps, so a second plan on the same data reuses the fits)")
    plan.add_argument("--out", required=True, help="the plan folder to write; a folder an earlier `compress plan` wrote is re-entered, "
                      "reusing its sweep's fits")
    plan.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    plan.add_argument("--json", action="store_true", help="print plan.json instead of tables")
    plan.set_defaults(handler=run_plan_command)


def _check_label_free_flags(args: argparse.Namespace) -> None:
    """Flags that contradict --label-free, or need it, exit 2 with one line."""
    if args.label_free is None:
        given = [flag for flag, value in (("--unlabelled-queries", args.unlabelled_queries),
                                          ("--pseudo-query-source", args.pseudo_query_source is not None),
                                          ("--held-out-fraction", args.held_out_fraction != DEFAULT_HELD_OUT_FRACTION)) if value]
        if given:
            raise ValueError(f"{', '.join(given)} apply to a plan without labels; add --label-free agreement|pseudo-queries.")
        return
    for method in args.methods or []:
        check_label_free_method(method)
    if args.variants:
        raise ValueError("--variants name supervised training settings (quantisation-aware DIVE); a --label-free plan fits no labels.")
    if args.unlabelled_queries and args.label_free != "agreement":
        raise ValueError("--unlabelled-queries are scored by agreement with the uncompressed ranking: use --label-free agreement.")
    if not 0 < args.held_out_fraction < 1:
        raise ValueError(f"--held-out-fraction is a share of the corpus in (0, 1); got {args.held_out_fraction}.")


def run_plan_command(args: argparse.Namespace) -> int:
    if args.budget_bytes is None and args.target_retention is None:
        raise ValueError("give --budget-bytes B, --target-retention R, or both.")
    if args.target_retention is not None and not 0 < args.target_retention <= 1.5:
        raise ValueError(f"--target-retention is a share of the uncompressed model's nDCG@10 (e.g. 0.97); got {args.target_retention}.")
    _check_label_free_flags(args)
    if args.fit_sample is not None and args.fit_sample < 1:
        raise ValueError(f"--fit-sample is a positive number of corpus rows; got {args.fit_sample}.")
    if not args.learned_gate_p > 0:
        raise ValueError(f"--learned-gate-p is a p-value threshold above 0 (above 1 turns the gate off); got {args.learned_gate_p}.")
    if args.refine_candidates < 1:
        raise ValueError(f"--refine-candidates is a positive number of candidates; got {args.refine_candidates}.")
    if args.refine_candidates != DEFAULT_REFINE_CANDIDATES and not args.allow_disk_rescore:
        raise ValueError("--refine-candidates sizes the +refine<N> settings, which only --allow-disk-rescore scores; add it.")
    if not args.price_per_gb_month >= 0 or args.price_per_gb_month == float("inf"):
        raise ValueError(f"--price-per-gb-month is a non-negative number of dollars; got {args.price_per_gb_month}.")
    codecs = [] if [c.lower() for c in args.codecs] == ["none"] else list(args.codecs)
    check_codecs(codecs, args.codec_budgets)
    searched_codecs = [] if [c.lower() for c in args.searched_codecs] == ["none"] else list(args.searched_codecs)
    check_codecs(searched_codecs)
    label_free = args.label_free is not None
    if args.data is None and not (label_free and not args.final and args.doc_embeddings is not None):
        args.data = "scifact"
    methods = args.methods if args.methods is not None else list(LABEL_FREE_METHODS if label_free else SUPERVISED_METHODS)
    precisions = args.precisions if args.precisions is not None else (list(PRECISIONS) if label_free else list(DEFAULT_PRECISIONS))
    inputs = [args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids, args.unlabelled_queries]
    prepare_output_dir(args.out, args.overwrite, inputs=inputs, command="compress plan", resume=True, check_only=True)
    if label_free and not args.final:  # the corpus alone: no qrels or queries are read (or needed)
        experiment = load_corpus_experiment(args.data, args.model, encoder_options_from_args(args), not args.no_cache,
                                            args.doc_embeddings, args.doc_ids)
    else:
        experiment = experiment_from_args(args)
    prepare_output_dir(args.out, args.overwrite, inputs=inputs, command="compress plan", resume=True)
    # The model that made the vectors: the one recorded with them, never --model's default for precomputed ones.
    made_by = experiment.embeddings.model or {}
    labels = {"model": made_by.get("model") or made_by.get("name") or experiment.provenance.get("model", args.model),
              "protocol": args.protocol}
    if label_free:
        queries = encode_unlabelled_queries(experiment, args.unlabelled_queries, cache=not args.no_cache) if args.unlabelled_queries else None
        plan = run_label_free_plan(experiment, args.out, args.label_free, budget_bytes=args.budget_bytes, target_retention=args.target_retention,
                                   methods=methods, dims=args.dims or None, precisions=precisions, peers=args.peers, seed=args.seed,
                                   final=args.final, work=args.work, labels=labels, held_out_fraction=args.held_out_fraction, queries=queries,
                                   pseudo_query_source=args.pseudo_query_source, cache=not args.no_cache, codecs=codecs,
                                   codec_budgets=args.codec_budgets, allow_disk=args.allow_disk_rescore, fit_sample=args.fit_sample,
                                   price_per_gb_month=args.price_per_gb_month, refine_candidates=args.refine_candidates,
                                   check_full_corpus=not args.no_full_corpus_check, full_sweep=args.full_sweep,
                                   searched_codecs=searched_codecs, learned_gate_p=args.learned_gate_p, count_tables=args.count_tables,
                                   allow_index_over_float32=args.allow_index_over_float32)
    else:
        plan = run_plan(experiment, args.out, budget_bytes=args.budget_bytes, target_retention=args.target_retention, methods=methods,
                        dims=args.dims or None, precisions=precisions, peers=args.peers, seed=args.seed, final=args.final,
                        work=args.work, labels=labels, variants=args.variants, codecs=codecs, codec_budgets=args.codec_budgets,
                        allow_disk=args.allow_disk_rescore, fit_sample=args.fit_sample, price_per_gb_month=args.price_per_gb_month,
                        refine_candidates=args.refine_candidates, full_sweep=args.full_sweep, searched_codecs=searched_codecs,
                        learned_gate_p=args.learned_gate_p, count_tables=args.count_tables,
                        allow_index_over_float32=args.allow_index_over_float32)
    finish_output_dir(args.out, "compress plan")
    if args.json:
        print_json(plan)
        return 0
    _print_scale(plan)
    if label_free:
        _print_label_free(plan)
    else:
        _print_supervised(plan)
    _print_deployment(plan, args.out)
    return 0


def _gap(value: float | None) -> str | None:
    """A row's ``gap_db`` as printed: dB above the Gaussian rate-distortion bound, one decimal (blank where not measurable)."""
    return None if value is None else f"{value:+.1f}"


def _gigabytes(value: float | None) -> str | None:
    """GB as printed: three significant figures."""
    return None if value is None else f"{value:.3g} GB"


def _bill_cells(row: dict) -> dict:
    """The printed bill columns of one row (the figures are plan.json's; rows of a plan written before the bill have none)."""
    if "usd_month@1B" not in row:
        return {}
    return {"disk_read": row["disk_read_per_query"], "f32_share": f"{row['float32_share']:.3f}", "vec/GB": f"{row['vectors_per_gb']:,.0f}",
            "RAM@1M": _gigabytes(row["ram_gb@1M"]), "RAM@100M": _gigabytes(row["ram_gb@100M"]), "RAM@1B": _gigabytes(row["ram_gb@1B"]),
            "$/mo@1B": f"{row['usd_month@1B']:,.0f}"}


def _frontier_rows(plan: dict) -> list[dict]:
    return [{**row, "gap_db": _gap(row.get("gap_db")), **_bill_cells(row),
             "with_tables": f"{row['amortized_bytes']:,.1f}" if row.get("amortized_bytes") is not None else ""} for row in plan["frontier"]]


def _frontier_columns(plan: dict, columns: list[str]) -> list[str]:
    """``columns``, with each setting's bytes with its tables' share beside its code bytes where the plan counted them."""
    if not plan.get("count_tables"):
        return columns
    at = columns.index("ram_bytes") + 1
    return [*columns[:at], "with_tables", *columns[at:]]


def _print_scale(plan: dict) -> None:
    """The sample the plan fitted on, the peers it did not train, and the bill's price, one line each."""
    sample = plan.get("fit_sample")
    if sample:
        print(f"fit sample: {sample['rows']:,} of {sample['of']:,} rows ({sample['rule']}, seed {sample['seed']}): {sample['fits']}"
              + ("" if sample.get("sampled") else " (the whole corpus)"))
    skipped = plan.get("skipped_peers") or []
    if skipped:
        print(f"not trained ({len(skipped)} FAISS peers the choice could not be; absent from the frontier): "
              + "; ".join(f"{p['setting']}: {p['reason']}" for p in skipped))
    settings = plan.get("skipped_settings") or []
    if settings:
        print(f"not scored: {len(settings)} settings of the sweep above the budget or dearer than a setting that keeps the target "
              f"(listed in plan.json under skipped_settings)")
    full = plan.get("full_corpus")
    tried = [c for c in plan.get("full_corpus_checks") or [] if c["setting"] != (full or {}).get("setting")]
    if tried:
        print("full-corpus check, settings that fell short of the target over every document: "
              + "; ".join(f"{c['setting']} {c['agreement']:.4f} ({c['on_sample']:.4f} on the sample)" for c in tried))
    if full:
        print(f"full-corpus check: {full['setting']} finds {full['agreement']:.4f} of the exact top-{full['k']} over all "
              f"{full['n_documents']:,} documents ({full['on_sample']:.4f} on the sample), {full['n_queries']} queries")
    bill = plan.get("bill")
    if bill:
        print(f"bill: ${bill['price_per_gb_month']:g} per GB (10^9 bytes) of RAM a month, {bill['price_source']}")


def _bytes_said(plan: dict) -> str:
    """The choice's bytes, in words: in RAM, on disk, and its gap to the Gaussian bound where it has one."""
    gap = _gap(plan["chosen"].get("gap_db"))
    return (f"{plan['ram_bytes']} bytes per vector in RAM ({plan['disk_bytes']} on disk"
            + (f"; {gap} dB from the Gaussian rate-distortion bound" if gap is not None else "") + ")")


def tables_said(row: Mapping[str, Any]) -> str:
    """Where what a setting holds once (its codec's rotations and codebooks, its map's weights) weighs more than all its
    codes on the corpus planned: what a vector costs with its share of them, and from how many vectors on the tables weigh
    less than the codes. Empty otherwise.

    Bytes per vector count the codes only, as FAISS's ``sa_code_size`` does; on a corpus of a few thousand documents a
    codec's tables can be larger than the float32 vectors themselves, which a user sizing RAM should see.
    """
    ram, fixed, amortized = row.get("ram_bytes"), held_once_bytes(row), row.get("amortized_bytes")
    if not ram or not fixed or amortized is None or amortized - ram <= ram:
        return ""
    return (f"tables: the choice's tables ({fixed / 1e6:.3g} MB) outweigh its codes on this corpus: {amortized:,.0f} bytes per "
            f"vector with their share; they weigh less than the codes from about {math.ceil(fixed / ram):,} vectors")


def _print_label_free(plan: dict) -> None:
    objective, reference = plan["objective"], plan["reference"]
    print(f"no labels read: {objective['metric']} on {objective['n_queries']} {objective['queries']}"
          + (f" (withheld from fitting; the compressors fit on the other {objective['fit_documents']} documents)"
             if objective.get("held_out_documents") else ""))
    print(f"Pareto frontier of the settings the plan may choose (reference {reference['setting']}: {reference['objective']:.4f}; "
          "gap_db: dB above the Gaussian bound):")
    print_table(_frontier_rows(plan), _frontier_columns(plan, LABEL_FREE_COLUMNS))
    _print_set_aside(plan, "objective")
    chosen = plan["chosen"]
    print(f"chosen: {chosen['setting']}: {_bytes_said(plan)}, "
          f"{objective['objective']} {chosen['objective']:.4f} ({'n/a' if plan['retention'] is None else format(plan['retention'], '.3f')} "
          f"of the reference), refitted on every document; {_served_by(plan)}")
    _print_tables(plan, "objective", objective["objective"])


def _print_supervised(plan: dict) -> None:
    reference = plan["reference"]
    validation = plan.get("validation", {})
    if validation.get("n_unseen_val") is not None:
        print(f"validation: {validation['rule']} ({plan['chosen']['n_queries']} of {validation['n_val']}), so the choice rewards "
              "what carries over to documents the fit never saw")
    print(f"Pareto frontier of the settings the plan may choose, on {plan['chosen']['n_queries']} validation queries (reference "
          f"{reference['setting']}: nDCG@10 {reference['ndcg@10']:.4f}; gap_db: dB above the Gaussian bound):")
    print_table(_frontier_rows(plan), _frontier_columns(plan, COLUMNS))
    _print_set_aside(plan, "ndcg@10")
    chosen = plan["chosen"]
    print(f"chosen: {chosen['setting']}: {_bytes_said(plan)}, "
          f"validation nDCG@10 {chosen['ndcg@10']:.4f} ({'n/a' if plan['retention'] is None else format(plan['retention'], '.3f')} "
          f"of the reference); {_served_by(plan)}")
    _print_tables(plan, "ndcg@10", "validation nDCG@10")


def _print_set_aside(plan: dict, score: str) -> None:
    """The frontier of the settings measured for comparison that the plan may not choose, each with the reason."""
    rows = plan.get("frontier_not_choosable") or []
    if rows:
        print("measured for comparison, not choosable (their own frontier):")
        print_table([{**row, "why not": row["why_not_choosable"]} for row in rows],
                    ["setting", "ram_bytes", "disk_bytes", "tier", score, "why not"])


def _served_by(plan: dict) -> str:
    """What serves the choice: a FAISS factory string, a registered codec's FAISS index, or embedtune's numpy scan."""
    name = plan["faiss_factory"]
    if is_registered_codec(name):
        family = codec_family(name)
        return (f"codec {name!r}, served by embedtune's numpy scan (no FAISS index type holds its codes)" if family.numpy_scan
                else f"codec {name!r}, a FAISS index fitted on the corpus")
    return f"FAISS factory {name!r}"


def best_smaller_than_float32(plan: Mapping[str, Any], float32_bytes: float, score: str) -> dict[str, Any] | None:
    """The best-scored choosable in-RAM setting within the plan's budget whose codes and tables together stay below the
    float32 vectors (``amortized_bytes``), other than float32 itself; None where no scored setting does."""
    budget = plan.get("budget_bytes")
    pool = [r for r in plan.get("sweep") or [] if r.get("choosable") and r.get("tier", "ram") == "ram" and r.get("amortized_bytes") is not None
            and r["amortized_bytes"] < float32_bytes and r.get(score) is not None]
    found = best_within(pool, math.inf if budget is None else budget, y=score)
    return None if found is None else dict(found)


def best_over_float32(plan: Mapping[str, Any], score: str) -> dict[str, Any] | None:
    """The best-scored setting within the budget that scored above the choice but was not chosen because its index, with its
    tables, is larger than the float32 vectors (``over_float32``); None where none did."""
    budget, chosen = plan.get("budget_bytes"), plan["chosen"]
    cost = "amortized_bytes" if plan.get("count_tables") else "ram_bytes"
    pool = [r for r in plan.get("sweep") or [] if r.get("over_float32") and r.get(score) is not None and r[score] > chosen[score]]
    found = best_within(pool, math.inf if budget is None else budget, x=cost, y=score)
    return None if found is None else dict(found)


def _print_tables(plan: Mapping[str, Any], score: str, label: str) -> None:
    reference = next((r for r in plan.get("sweep") or [] if r["setting"] == plan["reference"]["setting"]), None)
    float32_bytes = None if reference is None else reference["ram_bytes"]
    over = best_over_float32(plan, score)
    if over is not None:
        # From how many rows its tables' share would leave its index below the float32 vectors.
        grows = (f" (from about {math.ceil(held_once_bytes(over) / (float32_bytes - over['ram_bytes'])):,} vectors it would not be)"
                 if float32_bytes and float32_bytes > over["ram_bytes"] else "")
        gap = _gap(over.get("gap_db"))
        print(f"tables: {over['setting']} scored higher ({label} {over[score]:.4f}) but was not chosen: with its tables its index "
              f"takes {over['amortized_bytes']:,.0f} bytes per vector on this corpus, more than the float32 vectors{grows}"
              + (f"; its codes are {gap} dB from the Gaussian bound" if gap is not None else "")
              + "; --allow-index-over-float32 lets the plan choose it")
    said = tables_said(plan["chosen"])
    if said:
        if float32_bytes and plan["chosen"]["amortized_bytes"] > float32_bytes:
            said += (f"; with them the index is larger than the float32 vectors' {float32_bytes:,} bytes per vector"
                     + (" (chosen with --allow-index-over-float32)" if plan.get("allow_index_over_float32") else ""))
            smaller = best_smaller_than_float32(plan, float32_bytes, score)
            if smaller is not None:
                gap = _gap(smaller.get("gap_db"))
                said += (f"; the best setting scored whose index is not: {smaller['setting']} ({label} {smaller[score]:.4f}, "
                         f"{smaller['amortized_bytes']:,.0f} bytes per vector with its tables, all in RAM"
                         + (f", {gap} dB from the Gaussian bound" if gap is not None else "") + ")")
        said += "" if plan.get("count_tables") else "; to count them in the budget and the choice: --count-tables"
        chosen = plan["chosen"]
        # Each vector's share of the codec's own tables: the held-once share (amortized - ram), in the codec's proportion.
        codec_share = (chosen["amortized_bytes"] - chosen["ram_bytes"]) * (chosen.get("fixed_bytes") or 0) / held_once_bytes(chosen)
        if codec_share > chosen["ram_bytes"]:
            # The codec's own tables (not a map's weights) outweigh all its codes: fitted on these documents, they hold part of them.
            said += (". Fitted on these documents, the codec's tables also hold part of them, so a larger corpus of this kind "
                     "scores it lower than this one (docs/codecs.md, \"Fixed bytes and small corpora\")")
        print(said)


def _print_deployment(plan: dict, out: str) -> None:
    lance = (plan.get("deployment") or {}).get("lancedb")
    if lance:
        index = lance["index"]["index_type"] if lance.get("index") else "none (exact scan)"
        rescore = f", rescore the top {lance['candidates']} ({lance['rescore']})" if lance.get("rescore") else ""
        verdict = "finds the planned index's top-k" if lance["exact"] else f"the nearest it has: {lance['note']}"
        print(f"LanceDB: {lance['vector_type']} vectors, distance {lance['distance']}, index {index}{rescore}; {verdict}")
    refine = plan.get("refine")
    if refine:
        print(f"refine: each query's top {refine['candidates']} are rescored with the original {refine['original_dim']}-d float32 vectors "
              f"({refine['vectors']} beside the index, {refine['disk_read_per_query']:,} bytes read from disk per query); "
              "LanceDB serves the codes without this refinement")
    if "test" in plan:
        print(f"test ({plan['test']['n_queries']} held-out queries, scored once): nDCG@10 {plan['test']['ndcg@10']:.4f}, "
              f"Recall@10 {plan['test']['recall@10']:.4f}")
        subsets = plan["test"].get("subsets", {})
        if subsets:
            print("  " + " · ".join(f"{name} {'n/a' if row['ndcg@10'] is None else format(row['ndcg@10'], '.4f')} ({row['n_queries']})"
                                   for name, row in subsets.items())
                  + " (seen: every positive was a train+val positive; unseen: none was)")
    print(f"saved to {out} (plan.json, compressor/, precision.json, frontier.png, frontier_cost.png); build it with "
          f"`embedtune index build --plan {out} --embeddings ... --out INDEX`, or export the model with its precision: "
          f"`embedtune compress export --plan {out} --out MODEL`")
