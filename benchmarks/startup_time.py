"""Start-up of commands that need no model, two source trees side by side.

Runs ``python -m embedtune ARGS`` for each command with ``PYTHONPATH`` set to each tree in turn,
interleaved, ``--repeats`` times, and prints the median wall and CPU seconds per command and tree.
Bytecode goes to ``--pycache`` (``PYTHONPYCACHEPREFIX``), so the trees are timed as installed
packages run (compiled once); ``--no-pycache`` keeps ``PYTHONDONTWRITEBYTECODE`` as the environment has it.

    git archive <before-commit> src | tar -x -C /tmp/before
    python benchmarks/startup_time.py --tree before=/tmp/before/src --tree after=src
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = (("--version",), ("--help",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=SRC", help="a source tree to time (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(), "embedtune-startup-pycache"))
    parser.add_argument("--no-pycache", action="store_true")
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.tree)
    base = dict(os.environ)
    if not args.no_pycache:
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        base["PYTHONPYCACHEPREFIX"] = args.pycache
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for command in COMMANDS:
            for name, src in trees.items():
                env = {**base, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "embedtune", *command], env=env, stdout=subprocess.DEVNULL, check=True)
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                runs.setdefault((" ".join(command), name), []).append((wall, cpu))
    for (command, name), values in runs.items():
        print(f"embedtune {command:10s} {name:8s} wall median {statistics.median(v[0] for v in values):.2f}s "
              f"(runs {' '.join(f'{v[0]:.2f}' for v in values)}), CPU median {statistics.median(v[1] for v in values):.2f}s")


if __name__ == "__main__":
    main()
