"""``embedtune cache``: what the user cache holds (``info``) and removing what has not been used (``prune``)."""

from __future__ import annotations

import argparse

from embedtune.cli.common import add_list_flag, format_table, print_json
from embedtune.encoders.paths import cache_root
from embedtune.workflows.cache_usage import CACHE_KINDS, cache_usage, prune_cache


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--older-than takes days, a number >= 0; got {value!r}") from None
    if days < 0:
        raise argparse.ArgumentTypeError(f"--older-than takes days, a number >= 0; got {value!r}")
    return days


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cache", help="show the user cache (encoded corpora, ONNX graphs, plan sweeps, models) or prune what has not been used",
        description=f"The user cache ($EMBEDTUNE_CACHE, now {cache_root()}). Every entry is rebuilt on its next use, so pruning "
                    "loses no data, only the time to rebuild it.")
    actions = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="entries and size per kind")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(handler=run_info)
    prune = actions.add_parser(
        "prune", help="remove the entries not used for --older-than days (entries in use are kept)",
        description="Remove the cache entries last used more than --older-than days ago. Only entries embedtune recorded "
                    "writing are removed (an encoded corpus or ONNX graph whose meta.json names its key, a plan sweep with its "
                    "lock, a model embedtune unpacked); any other folder there, and any symbolic link, is listed as "
                    "'not written by embedtune' with the reason, and kept. Entries a running process holds are kept too.")
    prune.add_argument("--older-than", type=_days, required=True, metavar="DAYS", help="remove entries last used more than DAYS ago (0: all)")
    add_list_flag(prune, "--kind", default=None, help=f"kinds to prune (default: all): {', '.join(CACHE_KINDS)}",
                  choices=list(CACHE_KINDS))
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    prune.add_argument("--json", action="store_true", help="print JSON instead of a table")
    prune.set_defaults(handler=run_prune)


def run_info(args: argparse.Namespace) -> int:
    rows = cache_usage()
    if args.json:
        print_json(rows)
        return 0
    shown = [{**row, "size": _size(int(row["bytes"])), "oldest_use_days": f"{row['oldest_use_days']:.1f}",  # type: ignore[arg-type]
              "newest_use_days": f"{row['newest_use_days']:.1f}"} for row in rows]
    print(format_table(shown, ["kind", "entries", "size", "oldest_use_days", "newest_use_days", "folder"]))
    return 0


def run_prune(args: argparse.Namespace) -> int:
    removed, in_use, foreign = prune_cache(args.older_than, args.kind or None, dry_run=args.dry_run)
    kept = "kept: not written by embedtune"
    rows = [{"kind": e.kind, "path": str(e.path), "bytes": e.bytes, "last_use_days": round(e.age_days, 1),
             "action": kept if e in foreign else "in use, kept" if e in in_use else ("would remove" if args.dry_run else "removed"),
             **({"why": e.foreign} if e in foreign else {})} for e in removed + in_use + foreign]
    if args.json:
        print_json({"dry_run": args.dry_run, "older_than_days": args.older_than, "entries": rows,
                    "bytes_freed": 0 if args.dry_run else sum(e.bytes for e in removed)})
        return 0
    if rows:
        print(format_table([{**r, "size": _size(int(r["bytes"])), "last_use_days": f"{r['last_use_days']:.1f}"} for r in rows],
                           ["action", "kind", "size", "last_use_days", "path"]))
    for entry in foreign:
        print(f"kept {entry.path}: {entry.foreign}")
    verb = "would free" if args.dry_run else "freed"
    print(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} last used over {args.older_than:g} days ago: {verb} "
          f"{_size(sum(e.bytes for e in removed))}" + (f"; {len(in_use)} in use by a running process, kept" if in_use else "")
          + (f"; {len(foreign)} not written by embedtune, kept" if foreign else ""))
    return 0
