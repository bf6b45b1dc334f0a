"""``embedtune benchmark index`` as a script: exact flat search at full vs compressed dims.

    EMBEDTUNE_CACHE=/tmp/etcache python benchmarks/efficiency_index.py --data scifact,arguana \
        --synthetic 100000,1000000 --out benchmarks/results/efficiency/index.json

Same code path as the CLI (:func:`embedtune.bench.efficiency.run_index_benchmark`); also prints
the ratio table in Markdown for benchmarks/results/efficiency.md.
"""

from __future__ import annotations

import argparse
import logging

from embedtune.bench.efficiency import ANN_COLUMNS, FLAT_COLUMNS, format_table, run_index_benchmark
from embedtune.io import atomic_write_json


def markdown(rows, columns) -> str:
    def cell(value):
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--synthetic", default="100000")
    parser.add_argument("--synthetic-dim", type=int, default=768)
    parser.add_argument("--dims", default="256,128,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--ann", default="")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    result = run_index_benchmark(
        datasets=[d for d in args.data.split(",") if d],
        model=args.model,
        synthetic=[int(n) for n in args.synthetic.split(",") if n],
        synthetic_dim=args.synthetic_dim,
        dims=[int(d) for d in args.dims.split(",") if d],
        rounds=args.rounds,
        singles=args.singles,
        ann=[f for f in args.ann.split(";") if f],
    )
    if args.out:
        atomic_write_json(args.out, result)
    print(result["machine"])
    print(result["note"])
    print(format_table(result["flat"], FLAT_COLUMNS + ["kernels"]))
    print(markdown(result["flat"], FLAT_COLUMNS))
    if result["ann"]:
        print(format_table(result["ann"], ANN_COLUMNS))
        print(markdown(result["ann"], ANN_COLUMNS))
    for choice in result["kernel_choices"]:
        print(choice)


if __name__ == "__main__":
    main()
