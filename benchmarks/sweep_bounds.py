"""The evidence behind the plan sweep's measured rules, read from finished plans' ``plan.json``.

Two of the sweep's rules (:mod:`embedtune.workflows.plan`) rest on measurement rather than logic:

* ``SPACE_CEILING_MARGIN``: a code of a compressed space ranks no better than that space's float32 vectors;
* ``LabelFreeObjective.learned_start_margin``: label-free DIVE scores little above its PCA starts at float32.

For each plan given, this prints and records the largest excess seen: any non-float32, non-refined setting of a space over
the space's float32 row, and each DIVE space's float32 row over the better of ``pca-k`` and ``pca-uncentred-k`` at float32,
both as a share of the plan's reference (its uncompressed float32 row). Only rows the plan scored count, so a plan made with
the rules on shows nothing about the spaces they skipped: give it plans made with ``--full-sweep`` or before the rules.

    python benchmarks/sweep_bounds.py PLAN_DIR_OR_JSON ... --out benchmarks/results/scale/sweep-bounds.json
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from embedtune.index.plan_format import PLAN_FIX
from embedtune.io import atomic_write_json, read_json_verified


def bounds(plan: dict[str, Any]) -> dict[str, Any]:
    """``{"rows", "code_excess", "dive_gain"}``: the largest of each (a share of the reference) with where it was seen."""
    rows = [r for r in plan.get("sweep", []) if "refine" not in r]
    y = "objective" if any("objective" in r for r in rows) else "ndcg@10"
    reference = next((r[y] for r in rows if r.get("method") == "frozen" and r.get("precision") == "float32"), None)
    if not reference:
        return {"rows": len(rows), "code_excess": None, "dive_gain": None}
    float32 = {r.get("candidate") or "frozen": r[y] for r in rows if r.get("precision") == "float32"}
    excess = max(((r[y] - float32[r.get("candidate") or "frozen"]) / reference, f"{r.get('setting')}")
                 for r in rows if r.get("precision") != "float32" and (r.get("candidate") or "frozen") in float32
                 and r.get("tier") != "disk-rescore")
    gains = []
    for name, value in float32.items():
        if name.startswith("dive-") and name.split("-")[1].isdigit():
            dim = name.split("-")[1]
            starts = [float32[s] for s in (f"pca-{dim}", f"pca-uncentred-{dim}") if s in float32]
            if starts:
                gains.append(((value - max(starts)) / reference, name))
    return {"rows": len(rows), "objective": y, "reference": reference,
            "code_excess": {"share": round(excess[0], 6), "setting": excess[1]},
            "dive_gain": {"share": round(max(gains)[0], 6), "space": max(gains)[1]} if gains else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+", help="plan folders or plan.json files")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args(argv)
    records = []
    for given in args.plans:
        path = Path(given) / "plan.json" if Path(given).is_dir() else Path(given)
        plan, _ = read_json_verified(path, PLAN_FIX, require_digest=True)  # a damaged or edited plan.json is refused
        record = {"plan": str(path), "dataset": plan.get("dataset"), "target_retention": plan.get("target_retention"),
                  "embedtune_version": plan.get("embedtune_version"), **bounds(plan)}
        records.append(record)
        code, dive = record["code_excess"], record["dive_gain"]
        print(f"{path}: {record['rows']} rows; largest code over its space's float32: "
              f"{code['share']:+.4f} ({code['setting']})" if code else f"{path}: no reference row",
              f"; largest DIVE over its PCA start: {dive['share']:+.4f} ({dive['space']})" if dive else "")
    codes = [r["code_excess"]["share"] for r in records if r["code_excess"]]
    gains = [r["dive_gain"]["share"] for r in records if r["dive_gain"]]
    print(f"over {len(records)} plans: code excess at most {max(codes, default=float('nan')):+.4f}, "
          f"DIVE over its start at most {max(gains, default=float('nan')):+.4f} (shares of the reference)")
    if args.out is not None:
        atomic_write_json(args.out, {"command": "python benchmarks/sweep_bounds.py " + " ".join(sys.argv[1:] if argv is None else argv),
                                     "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "plans": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
