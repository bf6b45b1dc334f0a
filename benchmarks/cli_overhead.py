"""`compress apply` (PCA 384 -> 128) and `index build` (flat) against direct numpy / FAISS scripts, side by side.

Each run is a fresh process (start-up included on both sides), interleaved, median of 3, one thread.
The adapter is fitted by the first tree. Bytecode is cached under the work folder (as an installed package runs).

    git archive <before-commit> src | tar -x -C /tmp/before
    python benchmarks/cli_overhead.py --tree before=/tmp/before/src --tree after=src --rows 10000 100000
"""

import argparse, os, statistics, subprocess, sys, tempfile, time
import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tree", action="append", required=True, metavar="NAME=SRC")
parser.add_argument("--rows", type=int, nargs="+", default=[10000, 100000])
parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "embedtune-cli-overhead"))
cli = parser.parse_args()
PY = sys.executable
TREES = dict(tree.split("=", 1) for tree in cli.tree)
W = cli.work
os.makedirs(W, exist_ok=True)
d, k = 384, 128
env0 = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPYCACHEPREFIX": os.path.join(W, "pycache"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
DIRECT_APPLY = """
import sys, numpy as np, json
from safetensors.numpy import load_file
w = load_file(sys.argv[2] + '/model.safetensors'); W = w['components']; mu = w['mean']
x = np.load(sys.argv[1], mmap_mode='r')
out = np.asarray(x, dtype=np.float32) @ W.T - mu @ W.T
out /= np.linalg.norm(out, axis=1, keepdims=True)
np.save(sys.argv[3], out)
"""
DIRECT_INDEX = """
import sys, numpy as np, faiss
faiss.omp_set_num_threads(1)
x = np.load(sys.argv[1])
index = faiss.IndexFlatIP(x.shape[1]); index.add(x)
faiss.write_index(index, sys.argv[2])
"""
def run(cmd, src=None):
    env = dict(env0, PYTHONPATH=src or "")
    t = time.perf_counter(); subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); return time.perf_counter() - t
for n in cli.rows:
    x = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32); x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(f"{W}/docs{n}.npy", x); open(f"{W}/ids{n}.txt", "w").write("".join(f"d{i}\n" for i in range(n)))
    subprocess.run([PY, "-m", "embedtune", "compress", "fit", "--method", "pca", "--dim", str(k), "--doc-embeddings", f"{W}/docs{n}.npy",
                    "--doc-ids", f"{W}/ids{n}.txt", "--out", f"{W}/pca{n}", "--overwrite"], env=dict(env0, PYTHONPATH=next(iter(TREES.values()))), check=True, stdout=subprocess.DEVNULL)
    times = {}
    for rep in range(3):
        for name, src in TREES.items():
            times.setdefault(("apply", name), []).append(run([PY, "-m", "embedtune", "--threads", "1", "compress", "apply", "--adapter", f"{W}/pca{n}",
                                                             "--input", f"{W}/docs{n}.npy", "--out", f"{W}/out{n}-{name}.npy", "--overwrite"], src))
        times.setdefault(("apply", "direct numpy"), []).append(run([PY, "-c", DIRECT_APPLY, f"{W}/docs{n}.npy", f"{W}/pca{n}", f"{W}/direct{n}.npy"]))
        for name, src in TREES.items():
            times.setdefault(("index build", name), []).append(run([PY, "-m", "embedtune", "--threads", "1", "index", "build", "--embeddings", f"{W}/docs{n}.npy",
                                                                   "--ids", f"{W}/ids{n}.txt", "--out", f"{W}/idx{n}-{name}", "--overwrite"], src))
        times.setdefault(("index build", "direct faiss"), []).append(run([PY, "-c", DIRECT_INDEX, f"{W}/docs{n}.npy", f"{W}/direct{n}.faiss"]))
    for task in ("apply", "index build"):
        direct = statistics.median(next(v for (t, nm), v in times.items() if t == task and nm.startswith("direct")))
        for (t, name), values in times.items():
            if t == task:
                m = statistics.median(values)
                print(f"n={n} {task:11s} {name:13s} median {m:.2f}s ({m / direct:.2f}x direct) runs {' '.join(f'{v:.2f}' for v in values)}", flush=True)
    a = np.load(f"{W}/out{n}-{list(TREES)[-1]}.npy"); b = np.load(f"{W}/direct{n}.npy"); print(f"max |{list(TREES)[-1]} - direct|", float(np.abs(a - b).max()))
