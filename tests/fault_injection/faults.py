"""Fault injection for embedtune's files and runs: damage a file, or kill a benchmark, and judge what follows.

Shared by ``tests/fault_injection/`` (a few hundred trials, fast) and ``benchmarks/fault_injection.py``
(the same trials at larger counts, printed as a table).

Every trial ends in one of four outcomes:

* ``identical``: the damaged file gave the same result as the intact one (e.g. the damage hit
  JSON whitespace, or overwrote a byte with itself);
* ``clear error``: embedtune refused the file with its own error naming it (for the embedding
  cache, and a benchmark run record: the damage was detected, logged, and the entry is rebuilt
  or the run redone);
* ``wrong``: a different result and no error (the target is 0);
* ``unclear failure``: another exception, or a crash (the target is 0).

The damage is either ``corrupt`` (1-4 random bytes overwritten at a random offset) or
``truncate`` (the file cut at a random length). FAISS index trials run in a worker process,
because FAISS may crash the process on damaged bytes; a crash is recorded, never hidden.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

OUTCOMES = ("clear error", "identical", "wrong", "unclear failure")
DAMAGE = ("corrupt", "truncate")
INDEX_KINDS = ("flat", "sq8", "binary")


@dataclass
class Trial:
    artefact: str
    damage: str
    seed: int
    file: str
    outcome: str
    detail: str = ""


def damage_file(path: Path, damage: str, rng: np.random.Generator) -> str:
    """Overwrite 1-4 bytes at a random offset (``corrupt``) or cut the file (``truncate``); describe it."""
    data = bytearray(path.read_bytes())
    if damage == "corrupt":
        n = int(rng.integers(1, 5))
        offset = int(rng.integers(0, max(1, len(data) - n + 1)))
        data[offset : offset + n] = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
        description = f"{n} bytes at offset {offset} of {len(data)}"
    elif damage == "truncate":
        length = int(rng.integers(0, len(data))) if data else 0
        data = data[:length]
        description = f"cut to {length} bytes"
    else:
        raise ValueError(f"unknown damage {damage!r}; valid: {DAMAGE}")
    path.write_bytes(bytes(data))
    return description


def classify_error(error: BaseException, names: list[str]) -> str:
    """``clear error`` for an embedtune error (or a missing file) whose message names one of ``names``."""
    from embedtune.errors import EmbedtuneError

    message = str(error)
    if isinstance(error, (EmbedtuneError, FileNotFoundError)) and any(name in message for name in names):
        return "clear error"
    return "unclear failure"


def _rng(artefact: str, damage: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([sum(map(ord, artefact)), DAMAGE.index(damage), seed])


def _fresh_copy(source: Path, scratch: Path) -> Path:
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(source, scratch)
    return scratch


# -- adapters ---------------------------------------------------------------------------------
class AdapterArtefact:
    """A saved compressor (PCA or a small DIVE): ``model.safetensors`` and ``config.json``."""

    files = ("model.safetensors", "config.json")

    def __init__(self, root: Path, method: str) -> None:
        from embedtune.compress import DIVECompressor, DIVEConfig, make_compressor
        from embedtune.compress.base import TrainingData

        self.name = f"adapter ({method})"
        rng = np.random.default_rng(0)
        X = rng.normal(size=(64, 24)).astype(np.float32)
        ids = [f"x{i}" for i in range(len(X))]
        if method == "dive":
            triplets = np.array([[i, (i + 1) % 64, (i + 9) % 64] for i in range(64)], dtype=np.int64)
            compressor = DIVECompressor(DIVEConfig(dim=8, heads=2, epochs=1, batch_size=16, device="cpu", progress=False))
            compressor.fit(TrainingData(ids, X, ids, X, {}, triplets))
        else:
            compressor = make_compressor(method, dim=8).fit(TrainingData(ids, X, ids, X, {}))
        self.folder = compressor.save(Path(root) / method)
        self.X = X
        self.reference = compressor.transform(X)

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.compress import load_compressor

        rng = _rng(self.name, damage, seed)
        name = self.files[int(rng.integers(0, len(self.files)))]
        folder = _fresh_copy(self.folder, scratch)
        detail = damage_file(folder / name, damage, rng)
        try:
            result = load_compressor(folder).transform(self.X)
        except Exception as error:  # noqa: BLE001 - every exception is judged
            return Trial(self.name, damage, seed, name, classify_error(error, [name]), f"{detail}: {type(error).__name__}: {error}")
        outcome = "identical" if np.array_equal(result, self.reference) else "wrong"
        return Trial(self.name, damage, seed, name, outcome, detail)


# -- embedding cache --------------------------------------------------------------------------
class CacheArtefact:
    """An embedding-cache entry: ``embeddings.npy``, ``ids.json`` and ``meta.json``."""

    files = ("embeddings.npy", "ids.json", "meta.json")
    name = "cache entry"

    def __init__(self, root: Path) -> None:
        from embedtune.encoders.cache import EmbeddingCache, cache_key

        self.parts = {"model": "fake", "data": "toy", "recipe": "fault injection"}
        self.key = cache_key(self.parts)
        self.ids = [f"doc-{i}" for i in range(50)]
        self.embeddings = np.random.default_rng(0).normal(size=(50, 16)).astype(np.float32)
        self.root = Path(root) / "cache"
        EmbeddingCache(self.root).store(self.key, self.ids, self.embeddings, {"parts": self.parts})

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.encoders.cache import EmbeddingCache

        rng = _rng(self.name, damage, seed)
        name = self.files[int(rng.integers(0, len(self.files)))]
        root = _fresh_copy(self.root, scratch)
        cache = EmbeddingCache(root)
        detail = damage_file(cache.entry(self.key) / name, damage, rng)
        logging.getLogger("embedtune.encoders.cache").disabled = True  # the "rebuilding it" warning, once per trial
        try:
            # No expected ids: the entry's own checks must catch damaged ids too.
            loaded = cache.load(self.key)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, "unclear failure", f"{detail}: {type(error).__name__}: {error}")
        finally:
            logging.getLogger("embedtune.encoders.cache").disabled = False
        if loaded is None:
            return Trial(self.name, damage, seed, name, "clear error", f"{detail}: detected, rebuilt")
        ids, embeddings = loaded
        same = ids == self.ids and np.array_equal(np.asarray(embeddings), self.embeddings)
        return Trial(self.name, damage, seed, name, "identical" if same else "wrong", detail)


# -- benchmark run records --------------------------------------------------------------------
class RecordArtefact:
    """A finished benchmark run's record (``runs/<key>.json``)."""

    files = ("record",)
    name = "run record"

    def __init__(self, root: Path) -> None:
        from embedtune.bench.grid import RunStore, make_spec

        self.spec = make_spec("toy", "data/toy", "tiny", "model", "test", "dive", 8, 2027, {"margin": 0.4}, study="main")
        self.root = Path(root) / "results"
        rng = np.random.default_rng(0)
        per_query = {f"q{i}": {"ndcg@10": float(v)} for i, v in enumerate(rng.random(12))}
        record = {"metrics": {"ndcg@10": 0.4321987654, "recall@10": 0.61875, "n_queries": 12}, "per_query": per_query,
                  "config": {"dim": 8, "heads": 2, "margin": 0.4}, "history": [{"epoch": 1, "loss": 0.123456789}], "fit_seconds": 1.5}
        RunStore(self.root).save(self.spec, record)
        self.reference = RunStore(self.root).load(self.spec)
        assert self.reference is not None

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.bench.grid import RunStore

        rng = _rng(self.name, damage, seed)
        root = _fresh_copy(self.root, scratch)
        store = RunStore(root)
        path = store.path(self.spec)
        detail = damage_file(path, damage, rng)
        logging.getLogger("embedtune.bench.grid").disabled = True  # the "redone" warning, once per trial
        try:
            record = store.load(self.spec)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, path.name, "unclear failure", f"{detail}: {type(error).__name__}: {error}")
        finally:
            logging.getLogger("embedtune.bench.grid").disabled = False
        if record is None:
            return Trial(self.name, damage, seed, path.name, "clear error", f"{detail}: detected, run redone")
        return Trial(self.name, damage, seed, path.name, "identical" if record == self.reference else "wrong", detail)


# -- FAISS indexes (in a worker process) ------------------------------------------------------
def build_indexes(root: Path) -> dict[str, Any]:
    """One index folder per kind, with the query vectors and each kind's reference hits."""
    from embedtune.index import build_index, load_index

    root = Path(root)
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(60, 16)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = rng.normal(size=(5, 16)).astype(np.float32)
    np.save(root / "xb.npy", xb)
    np.save(root / "xq.npy", xq)
    ids = [f"doc-{i}" for i in range(len(xb))]
    titles = {doc_id: f"title {i}" for i, doc_id in enumerate(ids)}
    spec: dict[str, Any] = {"xq": str(root / "xq.npy"), "indexes": {}}
    for kind in INDEX_KINDS:
        folder = build_index(root / "xb.npy", root / f"index-{kind}", ids=ids, kind=kind, titles=titles)
        index = load_index(folder)
        D, I = index.search(xq, 5, rescore_with="float" if kind == "binary" else None)
        spec["indexes"][kind] = {"folder": str(folder), "hits": index.hits(D, I),
                                 "files": sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))}
    return spec


def _index_trial(spec: dict[str, Any], kind: str, damage: str, seed: int, scratch: Path) -> Trial:
    from embedtune.index import load_index

    name = f"FAISS index ({kind})"
    reference = spec["indexes"][kind]
    rng = _rng(name, damage, seed)
    files = reference["files"]
    file = files[int(rng.integers(0, len(files)))]
    folder = _fresh_copy(Path(reference["folder"]), scratch)
    detail = damage_file(folder / file, damage, rng)
    try:
        index = load_index(folder)
        D, I = index.search(np.load(spec["xq"]), 5, rescore_with="float" if kind == "binary" else None)
        hits = index.hits(D, I)
    except Exception as error:  # noqa: BLE001
        return Trial(name, damage, seed, file, classify_error(error, [file]), f"{detail}: {type(error).__name__}: {error}")
    return Trial(name, damage, seed, file, "identical" if hits == reference["hits"] else "wrong", detail)


def _index_worker(spec_path: str) -> None:
    """Run the trials listed in ``spec_path``; one JSON line per trial, a "start" line before each."""
    job = json.loads(Path(spec_path).read_text())
    scratch = Path(job["scratch"])
    for kind, damage, seed in job["trials"]:
        print(json.dumps({"start": [kind, damage, seed]}), flush=True)
        trial = _index_trial(job["spec"], kind, damage, seed, scratch)
        print(json.dumps({"trial": asdict(trial)}), flush=True)


def run_index_trials(spec: dict[str, Any], trials: list[tuple[str, str, int]], workdir: Path, timeout: float = 600) -> list[Trial]:
    """Run FAISS trials in worker processes; a worker that dies records a crash and the next one goes on."""
    workdir = Path(workdir)
    results: list[Trial] = []
    pending = list(trials)
    while pending:
        job_path = workdir / "index-job.json"
        job_path.write_text(json.dumps({"spec": spec, "trials": pending, "scratch": str(workdir / "scratch-index")}))
        process = subprocess.run([sys.executable, __file__, "index-worker", str(job_path)], capture_output=True, text=True, timeout=timeout)
        current = None
        for line in process.stdout.splitlines():
            message = json.loads(line)
            if "start" in message:
                current = tuple(message["start"])
            else:
                results.append(Trial(**message["trial"]))
                current = None
                pending.pop(0)
        if process.returncode != 0:
            if current is None:
                raise RuntimeError(f"index worker failed outside a trial (exit {process.returncode}):\n{process.stderr[-2000:]}")
            kind, damage, seed = current
            reason = f"signal {-process.returncode}" if process.returncode < 0 else f"exit {process.returncode}"
            results.append(Trial(f"FAISS index ({kind})", damage, seed, "?", "unclear failure", f"the process died ({reason}): {process.stderr[-300:]}"))
            pending.pop(0)
    return results


# -- killing a benchmark ----------------------------------------------------------------------
def make_tiny_model(root: Path) -> Path:
    """A randomly initialised 1-layer BERT as a sentence-transformers folder (as tests/conftest.py builds it)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = Path(root)
    hf_dir = root / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    words = sorted({w for i in range(40) for w in f"document number {i} about topic title what".split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(hf_dir / "vocab.txt"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        max_position_embeddings=64)
    BertModel(config).save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=32)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")], device="cpu")
    model.save(str(root / "st"))
    return root / "st"


def write_tiny_benchmark(root: Path, model_dir: Path) -> Path:
    """A toy BEIR folder (40 docs, 20 queries) and a TOML protocol config over it; returns the config."""
    root = Path(root)
    data = root / "toy"
    (data / "qrels").mkdir(parents=True, exist_ok=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"document number {i} about topic {i % 5}"}) + "\n"
                                               for i in range(40)))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"}) + "\n" for i in range(20)))
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    config = root / "tiny.toml"
    config.write_text(f"""[protocol]
methods = ["frozen", "truncate", "pca", "dive"]
studies = ["main", "heads"]
final_seeds = [2027, 2028]
selection_seeds = [2027]
n_negatives = 2
head_values = [2, 4]
n_resamples = 50
threads = 1

[[datasets]]
name = "toy"
path = "{data}"

[[backbones]]
name = "tiny"
model = "{model_dir}"
dims = [8]

[method_overrides.dive]
epochs = 1
batch_size = 8
""")
    return config


def _benchmark_child(argv: list[str], env: dict[str, str], log: str) -> None:
    os.environ.update(env)
    from embedtune.cli import main

    with open(log, "ab") as handle:  # the grid's output goes to a log: only the records count
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_PRELOAD = ["embedtune.cli", "embedtune.cli.bench", "embedtune.bench.dive_protocol", "embedtune.bench.dive_report",
            "embedtune.workflows.experiment", "sentence_transformers", "torch", "faiss"]


def _context() -> Any:
    # A fork server imports the stack once; every benchmark process forks from it, ready in milliseconds.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def _run_benchmark(context: Any, config: Path, results: Path, env: dict[str, str], kill_after: float | None) -> tuple[bool, float]:
    """Start ``benchmark dive``; SIGKILL it after ``kill_after`` seconds. Returns (killed, seconds)."""
    argv = ["--threads", "1", "benchmark", "dive", "--config", str(config), "--out", str(results), "--no-report"]
    process = context.Process(target=_benchmark_child, args=(argv, env, str(results) + ".log"))
    start = time.perf_counter()
    process.start()
    process.join(kill_after)
    killed = False
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        killed = True
    elif process.exitcode != 0:
        log = Path(str(results) + ".log")
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        raise RuntimeError(f"benchmark dive exited with {process.exitcode} (results in {results}):\n{tail}")
    return killed, time.perf_counter() - start


def comparable_records(results: Path) -> dict[str, dict[str, Any]]:
    """Each finished run's result fields by key: metrics, per-query values, training history (timings left out)."""
    from embedtune.bench.grid import RunStore

    records = {}
    for record in RunStore(results).all_records():
        values = {field: record.get(field) for field in ("metrics", "per_query", "skipped", "n_triplets", "heads", "config")}
        values["history"] = [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in record.get("history") or []]
        records[record["spec"]["key"]] = values
    return records


def _finished_runs(results: Path) -> int:
    return len(list((results / "runs").rglob("*.json"))) if (results / "runs").is_dir() else 0


@dataclass
class KillReport:
    kills: int
    episodes: int
    runs: int
    reference_seconds: float
    mismatches: list[str]
    trials: list[Trial]
    finished_at_kill: list[int]  # runs already finished when each kill landed: where in the grid the kills fell


def kill_benchmark(workdir: Path, model_dir: Path, n_kills: int, seed: int = 0, env: dict[str, str] | None = None,
                   max_seconds: float = 600) -> KillReport:
    """Kill a tiny ``benchmark dive`` at random points ``n_kills`` times, resume it each time, and compare.

    One uninterrupted run gives the reference records. Then episodes: a fresh results folder is
    run, SIGKILLed after a random delay (uniform over the reference run's duration), resumed, and
    so on until it finishes; its records must equal the reference's. Episodes repeat until
    ``n_kills`` kills landed.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_tiny_benchmark(workdir, model_dir)
    env = dict(env or {})
    env.setdefault("EMBEDTUNE_CACHE", str(workdir / "cache"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    context = _context()
    rng = np.random.default_rng(seed)
    _run_benchmark(context, config, workdir / "warm-up", env, None)  # the fork server starts; the embeddings are cached
    _, reference_seconds = _run_benchmark(context, config, workdir / "reference", env, None)
    reference = comparable_records(workdir / "reference")
    kills = episodes = 0
    mismatches: list[str] = []
    trials: list[Trial] = []
    finished_at_kill: list[int] = []
    started = time.perf_counter()
    while kills < n_kills and time.perf_counter() - started < max_seconds:
        episodes += 1
        results = workdir / f"episode-{episodes}"
        killed_here = 0
        while True:
            delay = float(rng.uniform(0, reference_seconds))
            killed, _ = _run_benchmark(context, config, results, env, delay if kills < n_kills else None)
            if not killed:
                break
            finished_at_kill.append(_finished_runs(results))
            kills += 1
            killed_here += 1
        got = comparable_records(results)
        wrong = sorted(key for key in set(reference) | set(got) if reference.get(key) != got.get(key))
        mismatches += [f"episode {episodes}: {key}" for key in wrong]
        # One trial per kill: each is judged by the records its episode ends with.
        trials += [Trial("benchmark dive", "kill", episodes, f"kill {i + 1} of {killed_here}", "wrong" if wrong else "identical",
                         f"{len(got)} records" + (f", differing: {wrong[:3]}" if wrong else "")) for i in range(killed_here)]
    return KillReport(kills, episodes, len(reference), reference_seconds, mismatches, trials, finished_at_kill)


# -- running trials ---------------------------------------------------------------------------
def run_trials(artefact: Any, damage: str, seeds: range, scratch: Path) -> list[Trial]:
    return [artefact.trial(damage, seed, scratch) for seed in seeds]


def summarise(trials: list[Trial]) -> list[dict[str, Any]]:
    """One row per (artefact, damage): tried and the count of each outcome."""
    rows: dict[tuple[str, str], Counter] = {}
    for trial in trials:
        rows.setdefault((trial.artefact, trial.damage), Counter())[trial.outcome] += 1
    return [{"artefact": artefact, "kind": damage, "tried": sum(counts.values()), **{outcome: counts.get(outcome, 0) for outcome in OUTCOMES}}
            for (artefact, damage), counts in rows.items()]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    header = ["artefact", "kind", "tried", "clear error", "identical result", "wrong result", "unclear failure"]
    keys = ["artefact", "kind", "tried", "clear error", "identical", "wrong", "unclear failure"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(row[key]) for key in keys) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "index-worker":
    _index_worker(sys.argv[2])
