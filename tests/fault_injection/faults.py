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

The damage is ``corrupt`` (1-4 random bytes overwritten at a random offset), ``truncate`` (the
file cut at a random length), ``edit`` (one field of a JSON file changed to another plausible
value, with every digest that covers the file recomputed: its own content digest, and its entry in
the file that lists it) or ``swap`` (the file replaced by the same file of another run on other
data, its digest entries recomputed the same way). An edit or a swap passes every digest check of
the file itself; it must be caught by the files' agreement with each other (a digest is integrity,
not authentication). FAISS index trials run in a worker process, because FAISS may crash the
process on damaged bytes; a crash is recorded, never hidden.

Artefacts: saved adapters, embedding-cache entries, benchmark run records, FAISS index folders,
``compress plan`` folders (plan.json, precision.json, the int8 calibration, the compressor), a
plan's cached FAISS files, and ``embed-corpus`` shard folders.
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
EDITS = ("edit", "swap")
ALL_DAMAGE = DAMAGE + EDITS
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
    return np.random.default_rng([sum(map(ord, artefact)), ALL_DAMAGE.index(damage), seed])


_PLAUSIBLE = {"index_kind": ["flat", "sq8", "binary", "SQfp16"], "name": ["float32", "int8", "binary", "binary-asym"],
              "precision": ["faiss:PQ4x4fs", "faiss:PQ2x4fs", "int8"], "method": ["pca", "truncate", "dive"],
              "input_normalization": [None, "unit"], "faiss_factory": ["SQ8", "PQ4x4fs", "Flat"], "kind": ["flat", "sq8", "binary"]}


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list) and value and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, (*path, i))]
    return [path]


def _changed(key: Any, value: Any, rng: np.random.Generator) -> Any:
    if isinstance(key, str) and key in _PLAUSIBLE:
        options = [v for v in _PLAUSIBLE[key] if v != value]
        return options[int(rng.integers(0, len(options)))]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + int(rng.choice([-1, 1, 2]))
    if isinstance(value, float):
        return value * float(rng.choice([0.5, 1.5])) + 0.01
    if isinstance(value, list) and value:
        changed = list(value)
        i = int(rng.integers(0, len(changed)))
        changed[i] = _changed(None, changed[i], rng)
        return changed
    if isinstance(value, str):
        return value[:-1] + ("x" if not value.endswith("x") else "y") if value else "x"
    return 1 if value is None else None


def edit_json(path: Path, rng: np.random.Generator) -> str:
    """Change one field of a JSON file to another plausible value and recompute its own content digest (if it has one)."""
    from embedtune.io import DIGEST_KEY, atomic_write_json, write_json_with_digest

    obj = json.loads(path.read_text(encoding="utf-8"))
    signed = isinstance(obj, dict) and DIGEST_KEY in obj
    body = {k: v for k, v in obj.items() if k != DIGEST_KEY} if isinstance(obj, dict) else obj
    leaves = [leaf for leaf in _leaves(body) if leaf]
    leaf = leaves[int(rng.integers(0, len(leaves)))]
    holder = body
    for part in leaf[:-1]:
        holder = holder[part]
    before = holder[leaf[-1]]
    holder[leaf[-1]] = _changed(leaf[-1], before, rng)
    (write_json_with_digest if signed else atomic_write_json)(path, body)
    shown = ".".join(str(part) for part in leaf)
    return f"{shown}: {str(before)[:40]} -> {str(holder[leaf[-1]])[:40]}{' (digest recomputed)' if signed else ''}"



def damage_in_place(path: Path, damage: str, rng: np.random.Generator) -> str | None:
    """Corrupt, truncate (:func:`damage_file`) or edit (:func:`edit_json`) ``path``; None for a swap,
    which each artefact makes its own way (which files travel together, which digests it recomputes)."""
    if damage in DAMAGE:
        return damage_file(path, damage, rng)
    if damage == "edit":
        return edit_json(path, rng)
    return None

def _resign(path: Path, changes: dict[str, Any]) -> None:
    """Rewrite a digest-carrying JSON file with ``changes`` (nested dicts merged one level), its content digest recomputed."""
    from embedtune.io import read_json_verified, write_json_with_digest

    obj, _ = read_json_verified(path, "")
    for key, value in changes.items():
        obj[key] = {**obj[key], **value} if isinstance(value, dict) and isinstance(obj.get(key), dict) else value
    write_json_with_digest(path, obj)


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
    other = np.random.default_rng(1).normal(size=(60, 16)).astype(np.float32)
    other /= np.linalg.norm(other, axis=1, keepdims=True)
    np.save(root / "other.npy", other)
    spec: dict[str, Any] = {"xq": str(root / "xq.npy"), "indexes": {}}
    for kind in INDEX_KINDS:
        # The same build on other vectors: the files a "swap" trial takes.
        build_index(root / "other.npy", root / f"other-{kind}", ids=ids, kind=kind, titles=titles)
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
    file = "manifest.json" if damage == "edit" else files[int(rng.integers(0, len(files)))]
    folder = _fresh_copy(Path(reference["folder"]), scratch)
    detail = damage_in_place(folder / file, damage, rng)  # edit: the manifest, its own digest recomputed, the files untouched
    if detail is None:  # the manifest lists every file's digest and is the folder's root: a swapped file is taken as is
        shutil.copyfile(Path(reference["folder"]).parent / f"other-{kind}" / file, folder / file)
        detail = "the other run's file"
    try:
        index = load_index(folder)
        D, I = index.search(np.load(spec["xq"]), 5, rescore_with="float" if kind == "binary" else None)
        hits = index.hits(D, I)
    except Exception as error:  # noqa: BLE001
        # The folder's files are checked against each other: the error may name the file the damaged one disagrees with.
        return Trial(name, damage, seed, file, classify_error(error, files if damage in EDITS else [file]),
                     f"{detail}: {type(error).__name__}: {error}")
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


def _run_benchmark(context: Any, config: Path, results: Path, env: dict[str, str], kill_after: float | None,
                   after_runs: int = 0) -> tuple[bool, float]:
    """Start ``benchmark dive``; SIGKILL it ``kill_after`` seconds after ``after_runs`` runs have finished in ``results``.

    Timing a kill from progress (finished runs) rather than from the start keeps the kills spread over
    the grid however loaded the machine is: a clock-only delay lands every kill during start-up when
    the machine is slower than when the reference run was timed. Returns (killed, seconds).
    """
    argv = ["--threads", "1", "benchmark", "dive", "--config", str(config), "--out", str(results), "--no-report"]
    process = context.Process(target=_benchmark_child, args=(argv, env, str(results) + ".log"))
    start = time.perf_counter()
    process.start()
    if kill_after is None:
        process.join()
    else:
        while process.is_alive() and _finished_runs(results) < after_runs:
            process.join(0.02)
        process.join(kill_after)
    killed = False
    if process.is_alive():
        try:
            os.kill(process.pid, signal.SIGKILL)
            killed = True
        except ProcessLookupError:  # it finished on its own between the check and the kill
            pass
        process.join()
    if not killed and process.exitcode != 0:
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
    run and SIGKILLed at a random point, resumed, and so on until it finishes; its records must
    equal the reference's. Episodes repeat until ``n_kills`` kills landed. Each kill waits for 0 or
    1 more finished runs (drawn), then a delay drawn uniformly over one run's share of the reference
    duration, so the kills fall at different points of the grid on a fast or a loaded machine alike.
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
    seconds_per_run = reference_seconds / max(1, len(reference))
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
            delay = float(rng.uniform(0, seconds_per_run))
            after_runs = _finished_runs(results) + int(rng.integers(0, 2))
            killed, _ = _run_benchmark(context, config, results, env, delay if kills < n_kills else None, after_runs)
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


# -- compress plan folders ---------------------------------------------------------------------
def _toy_vectors(root: Path, seed: int) -> dict[str, Any]:
    """60 documents and 40 queries (24-d, raw rows of very different norms), a BEIR folder judging them, and the files."""
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((60, 24)).astype(np.float32) + 0.5
    targets = np.random.default_rng(0).permutation(60)[:40]
    queries = docs[targets] + 0.6 * rng.standard_normal((40, 24)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(60, 1)).astype(np.float32)
    root = Path(root)
    data = root / "beir"
    (data / "qrels").mkdir(parents=True, exist_ok=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": ""}) + "\n" for i in range(60)))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": ""}) + "\n" for i in range(40)))
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{t}\t1\n" for i, t in enumerate(targets)))
    for kind, vectors, n in (("doc", docs, 60), ("query", queries, 40)):
        np.save(root / f"{kind}.npy", vectors.astype(np.float32))
        (root / f"{kind}.txt").write_text("".join(f"{kind[0]}{i}\n" for i in range(n)))
    return {"data": data, "docs": root / "doc.npy", "doc_ids": root / "doc.txt", "queries": root / "query.npy",
            "query_ids": root / "query.txt"}


class PlanArtefact:
    """A ``compress plan`` folder (PCA 24->8, int8): judged by the hits of the index ``index build --plan`` builds from it."""

    files = ("plan.json", "precision.json", "calibration.safetensors", "calibration.json", "compressor/config.json",
             "compressor/model.safetensors")
    json_files = ("plan.json", "precision.json", "calibration.json", "compressor/config.json")
    name = "plan folder"

    def __init__(self, root: Path) -> None:
        from embedtune.workflows.experiment import load_experiment
        from embedtune.workflows.plan import run_plan

        root = Path(root) / "plans"
        self.inputs = {}
        for label, seed in (("plan", 0), ("other", 1)):  # "other": the same setting on other vectors, for swaps
            toy = _toy_vectors(root / f"{label}-data", seed)
            experiment = load_experiment(toy["data"], doc_embeddings=toy["docs"], doc_ids=toy["doc_ids"],
                                         query_embeddings=toy["queries"], query_ids=toy["query_ids"])
            run_plan(experiment, root / label, budget_bytes=8, methods=["pca"], dims=[8], precisions=["int8"], peers=[], rounds=1)
            self.inputs[label] = toy
        self.folder, self.other = root / "plan", root / "other"
        self.reference = self.hits(self.folder, root / "reference-index")

    def hits(self, plan: Path, index_dir: Path) -> list:
        """What ``index build --plan`` then ``search`` give: the top 5 of every query."""
        from embedtune.index import load_index
        from embedtune.index.planned import build_planned_index
        from embedtune.index.query import query_vectors

        shutil.rmtree(index_dir, ignore_errors=True)
        toy = self.inputs["plan"]
        index = load_index(build_planned_index(toy["docs"], index_dir, plan, ids=toy["doc_ids"]))
        D, I = index.search(query_vectors(index, np.load(toy["queries"])), 5)
        return index.hits(D, I)

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.io import sha256_file

        rng = _rng(self.name, damage, seed)
        folder = _fresh_copy(self.folder, Path(scratch) / "plan")
        choices = self.json_files if damage == "edit" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        if damage in DAMAGE:
            detail = damage_file(folder / name, damage, rng)
        else:
            if damage == "edit":
                detail = edit_json(folder / name, rng)
            else:
                shutil.copyfile(self.other / name, folder / name)
                detail = "the other run's file"
            if name == "compressor/model.safetensors":  # the compressor's own record of its weights, recomputed
                _resign(folder / "compressor" / "config.json", {"weights_sha256": sha256_file(folder / name)})
            if name != "plan.json":  # and plan.json's list of file digests
                touched = {n: sha256_file(folder / n) for n in (name, "compressor/config.json") if (folder / n).is_file()}
                _resign(folder / "plan.json", {"files_sha256": touched})
        try:
            hits = self.hits(folder, Path(scratch) / "index")
        except Exception as error:  # noqa: BLE001
            # A plan's files are checked against each other: the error may name the file that disagrees with the damaged one.
            return Trial(self.name, damage, seed, name, classify_error(error, [Path(f).name for f in self.files] + ["compressor"]),
                         f"{detail}: {type(error).__name__}: {error}")
        return Trial(self.name, damage, seed, name, "identical" if hits == self.reference else "wrong", detail)


# -- a plan's cached FAISS files ------------------------------------------------------------------
class FaissCacheArtefact:
    """A sweep's cached FAISS peers (``WORK/frozen-faiss/<corpus digest>/faiss_PQ*.faiss`` + ``.json``)."""

    name = "cached FAISS file"
    precisions = ("faiss:PQ2x4fs", "faiss:PQ4x4fs")

    def __init__(self, root: Path) -> None:
        from embedtune.index.codecs import Precision, QuantizedIndex
        from embedtune.workflows.plan import PROBE_ROWS, save_faiss_cache

        root = Path(root) / "faiss-cache"
        rng = np.random.default_rng(0)
        self.docs = rng.normal(size=(80, 24)).astype(np.float32)
        self.docs /= np.linalg.norm(self.docs, axis=1, keepdims=True)
        self.queries = rng.normal(size=(10, 24)).astype(np.float32)
        self.probe = self.docs[:PROBE_ROWS]
        other_docs = np.random.default_rng(1).normal(size=(80, 24)).astype(np.float32)
        self.folder, self.other = root / "cache", root / "other"
        self.reference = {}
        for folder, docs in ((self.folder, self.docs), (self.other, other_docs)):
            cache = {name: (QuantizedIndex.build(docs, Precision(name)), 0.5) for name in self.precisions}
            save_faiss_cache(folder, cache, probe=docs[:PROBE_ROWS])
            if folder == self.folder:
                self.reference = {name: [a.tolist() for a in index.search(self.queries, 5)] for name, (index, _) in cache.items()}
        self.files = sorted(p.name for p in self.folder.iterdir())

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.io import sha256_file
        from embedtune.workflows.plan import load_faiss_cache

        rng = _rng(self.name, damage, seed)
        folder = _fresh_copy(self.folder, Path(scratch) / "cache")
        choices = [f for f in self.files if f.endswith(".json")] if damage == "edit" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        detail = damage_in_place(folder / name, damage, rng)
        if detail is None:
            shutil.copyfile(self.other / name, folder / name)
            detail = "the other run's file"
            if name.endswith(".faiss"):
                _resign((folder / name).with_suffix(".json"), {"sha256": sha256_file(folder / name)})
        logging.getLogger("embedtune.workflows.plan").disabled = True  # the "rebuilt" warning, once per trial
        try:
            loaded = load_faiss_cache(folder, self.probe)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, "unclear failure", f"{detail}: {type(error).__name__}: {error}")
        finally:
            logging.getLogger("embedtune.workflows.plan").disabled = False
        got = {precision: [a.tolist() for a in index.search(self.queries, 5)] for precision, (index, _) in loaded.items()}
        if any(got[p] != self.reference[p] for p in got):
            return Trial(self.name, damage, seed, name, "wrong", detail)
        if set(got) != set(self.reference):
            return Trial(self.name, damage, seed, name, "clear error", f"{detail}: detected, rebuilt")
        return Trial(self.name, damage, seed, name, "identical", detail)


# -- embed-corpus shard folders -----------------------------------------------------------------
class _StubEncoder:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def encode(self, texts: list[str], kind: str = "document", progress=None) -> np.ndarray:
        vectors = np.stack([np.random.default_rng([self.seed, int(t.split()[-1])]).normal(size=12) for t in texts]).astype(np.float32)
        if progress is not None:  # the shard encoder reports each finished batch, as SentenceEncoder does
            progress(len(texts))
        return vectors


def _write_shards(folder: Path, seed: int) -> None:
    from embedtune.encoders.ray_encode import ShardEncoder, _write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    encoder = ShardEncoder.__new__(ShardEncoder)
    encoder.encoder, encoder.out, encoder.kind = _StubEncoder(seed), folder, "document"
    for shard in range(3):
        rows = range(shard * 10, min(25, shard * 10 + 10))
        encoder.encode_shard(shard, [f"d{i}" for i in rows], [f"text {i}" for i in rows])
    _write_manifest(folder, 25, 10, "stub", "document", 0.0, "local", [f"d{i}" for i in range(25)])


class ShardArtefact:
    """An ``embed-corpus`` folder: 3 shards (``.npy``, ``.ids.txt``, ``.json`` record each) and ``manifest.json``."""

    name = "embedding shards"

    def __init__(self, root: Path) -> None:
        from embedtune.encoders.ray_encode import read_shards

        root = Path(root) / "shards"
        self.folder, self.other = root / "shards", root / "other"
        _write_shards(self.folder, 0)
        _write_shards(self.other, 1)
        self.reference = read_shards(self.folder)
        self.files = sorted(p.name for p in self.folder.iterdir() if not p.name.startswith("."))

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.encoders.ray_encode import read_shards
        from embedtune.io import sha256_file

        rng = _rng(self.name, damage, seed)
        folder = _fresh_copy(self.folder, Path(scratch) / "shards")
        choices = [f for f in self.files if f.endswith(".json")] if damage == "edit" else [f for f in self.files if f != "manifest.json"] \
            if damage == "swap" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        detail = damage_in_place(folder / name, damage, rng)
        if detail is None:
            shutil.copyfile(self.other / name, folder / name)
            detail = "the other run's file"
            stem = name.split(".")[0]
            if not name.endswith(".json"):  # the shard's own record, recomputed
                _resign(folder / f"{stem}.json", {"npy_sha256": sha256_file(folder / f"{stem}.npy"),
                                                  "ids_sha256": sha256_file(folder / f"{stem}.ids.txt")})
        try:
            ids, vectors = read_shards(folder)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, classify_error(error, [name, name.split(".")[0], "manifest.json"]),
                         f"{detail}: {type(error).__name__}: {error}")
        same = ids == self.reference[0] and np.array_equal(vectors, self.reference[1])
        return Trial(self.name, damage, seed, name, "identical" if same else "wrong", detail)


# -- exported model folders (compress export --plan) --------------------------------------------------
class ExportedModelArtefact:
    """A ``compress export --plan`` folder (tiny BERT + PCA 32->16, int8): its ``embedtune_precision/`` files and compressor copy.

    Judged by what a deployment computes from the folder: ``DeployedCodec.load(folder).encode`` of the
    folder's compressor output (``embedtune_compressor/``) for fixed vectors.
    """

    files = ("embedtune_precision/precision.json", "embedtune_precision/calibration.safetensors", "embedtune_precision/calibration.json",
             "embedtune_compressor/config.json", "embedtune_compressor/model.safetensors")
    json_files = ("embedtune_precision/precision.json", "embedtune_precision/calibration.json", "embedtune_compressor/config.json")
    name = "exported model"

    def __init__(self, root: Path, model_dir: Path | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        from embedtune.compress import make_compressor
        from embedtune.index.codecs import Precision
        from embedtune.index.plan_export import export_plan
        from embedtune.index.plan_format import write_plan

        root = Path(root) / "exported"
        model_dir = model_dir or make_tiny_model(root / "base")
        base = SentenceTransformer(str(model_dir), device="cpu")
        texts = [f"document number {i} about topic" for i in range(40)]
        folders = {}
        for label, seed in (("model", 0), ("other", 1)):  # "other": the same export fitted on other vectors, for swaps
            rng = np.random.default_rng(seed)
            docs = base.encode(texts)
            docs = (docs + 0.5 * np.std(docs) * rng.standard_normal(docs.shape)).astype(np.float32)
            compressor = make_compressor("pca", dim=16).fit_unsupervised(docs)
            write_plan(root / f"plan-{label}", compressor, Precision("int8"), docs, {"chosen": {"setting": "pca-16/int8"}})
            folders[label] = export_plan(root / f"plan-{label}", str(model_dir), root / label)
        self.folder, self.other = folders["model"], folders["other"]
        self.X = np.random.default_rng(7).normal(size=(30, base.get_embedding_dimension())).astype(np.float32)
        self.reference = self.codes(self.folder)

    def codes(self, folder: Path) -> np.ndarray:
        from embedtune.compress import load_compressor
        from embedtune.index.codecs import DeployedCodec

        codec = DeployedCodec.load(folder)
        return codec.encode(load_compressor(folder / "embedtune_compressor").transform(self.X))

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.io import sha256_file

        rng = _rng(self.name, damage, seed)
        folder = _fresh_copy(self.folder, Path(scratch) / "model")
        choices = self.json_files if damage == "edit" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        if damage in DAMAGE:
            detail = damage_file(folder / name, damage, rng)
        else:
            if damage == "edit":
                detail = edit_json(folder / name, rng)
            else:
                shutil.copyfile(self.other / name, folder / name)
                detail = "the other export's file"
            if name == "embedtune_compressor/model.safetensors":  # the compressor's own record of its weights, recomputed
                _resign(folder / "embedtune_compressor" / "config.json", {"weights_sha256": sha256_file(folder / name)})
            if name.startswith("embedtune_precision/") and name != "embedtune_precision/precision.json":  # precision.json's digests
                _resign(folder / "embedtune_precision" / "precision.json", {"files_sha256": {Path(name).name: sha256_file(folder / name)}})
        try:
            codes = self.codes(folder)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, classify_error(error, [Path(f).name for f in self.files] + list(self.files)
                                                                       + ["embedtune_precision", "embedtune_compressor"]),
                         f"{detail}: {type(error).__name__}: {error}")
        return Trial(self.name, damage, seed, name, "identical" if np.array_equal(codes, self.reference) else "wrong", detail)


# -- the embedding cache's partial shards -----------------------------------------------------------------
class CachePartialArtefact:
    """An interrupted embedding-cache encode: ``partial/`` holds 3 finished shards (``.npy`` + ``.json`` record) of 5.

    Judged by the resumed encode: it must give the vectors an uninterrupted encode gives (a damaged
    shard detected and encoded again counts as a clear error), never other vectors.
    """

    name = "cache partial shard"
    shard_size = 4

    def __init__(self, root: Path) -> None:
        from embedtune.encoders.cache import EmbeddingCache, cache_key

        root = Path(root) / "cache-partial"
        self.parts = {"model": "fake", "data": "toy", "recipe": "partial shards"}
        self.key = cache_key(self.parts)
        self.ids = [f"doc-{i}" for i in range(18)]
        self.full = np.random.default_rng(0).normal(size=(18, 12)).astype(np.float32)
        other_full = np.random.default_rng(1).normal(size=(18, 12)).astype(np.float32)
        self.root, other_root = root / "cache", root / "other"
        for folder, vectors in ((self.root, self.full), (other_root, other_full)):
            self._interrupt(EmbeddingCache(folder, use_bundled=False), vectors)
        self.partial = EmbeddingCache(self.root).entry(self.key) / "partial"
        self.other = EmbeddingCache(other_root).entry(self.key) / "partial"
        self.files = sorted(p.name for p in self.partial.iterdir() if not p.name.startswith("."))

    def _interrupt(self, cache: Any, vectors: np.ndarray) -> None:
        def compute(lo: int, hi: int) -> np.ndarray:
            if lo >= 3 * self.shard_size:
                raise KeyboardInterrupt("killed mid-encode")
            return vectors[lo:hi]

        try:
            cache.get_or_compute(self.parts, self.ids, compute, shard_size=self.shard_size)
        except KeyboardInterrupt:
            pass

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        from embedtune.encoders.cache import EmbeddingCache

        rng = _rng(self.name, damage, seed)
        root = _fresh_copy(self.root, Path(scratch) / "cache")
        cache = EmbeddingCache(root, use_bundled=False)
        partial = cache.entry(self.key) / "partial"
        choices = [f for f in self.files if f.endswith(".json")] if damage == "edit" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        detail = damage_in_place(partial / name, damage, rng)
        if detail is None:
            # Another run's shard at this place, with its record: a record that agrees with its array, for other rows.
            stem = name.rsplit(".", 1)[0]
            for suffix in (".npy", ".json"):
                if (self.other / f"{stem}{suffix}").is_file():
                    shutil.copyfile(self.other / f"{stem}{suffix}", partial / f"{stem}{suffix}")
            detail = "the other run's shard and record" if stem != "run" else "the other run's run.json"
        encoded: list[int] = []

        def compute(lo: int, hi: int) -> np.ndarray:
            encoded.append(lo)
            return self.full[lo:hi]

        logging.getLogger("embedtune.encoders.cache").disabled = True  # the "encoded again" warning, once per trial
        try:
            vectors, _ = cache.get_or_compute(self.parts, self.ids, compute, shard_size=self.shard_size)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, classify_error(error, [name]), f"{detail}: {type(error).__name__}: {error}")
        finally:
            logging.getLogger("embedtune.encoders.cache").disabled = False
        if not np.array_equal(np.asarray(vectors), self.full):
            return Trial(self.name, damage, seed, name, "wrong", detail)
        redone = [lo for lo in encoded if lo < 3 * self.shard_size]
        return Trial(self.name, damage, seed, name, "clear error" if redone else "identical",
                     f"{detail}: detected, rows {redone} encoded again" if redone else detail)


# -- embed-corpus shard folders, resumed ---------------------------------------------------------------------
class ShardResumeArtefact:
    """An interrupted ``embed-corpus`` folder (3 of 4 shards finished, no manifest), resumed and read back.

    ``swap`` copies a whole finished shard (array, ids and record) from a run over another corpus;
    the resumed folder must hold this corpus's rows, encoded again where needed.
    """

    name = "embedding shards (resumed)"
    shard_size = 8

    def __init__(self, root: Path) -> None:
        root = Path(root) / "shards-resumed"
        self.ids = [f"d{i}" for i in range(30)]
        self.texts = [f"text {i}" for i in range(30)]
        other_ids = [f"e{i}" for i in range(30)]
        self.folder, self.other = root / "shards", root / "other"
        with _stub_sentence_encoder(0):
            self._interrupted(self.folder, self.ids, self.texts)
            self._interrupted(self.other, other_ids, [f"text {i}" for i in range(30, 60)])
            self.reference = self._resume(_fresh_copy(self.folder, root / "reference"))
        self.files = sorted(p.name for p in self.folder.iterdir() if p.name.startswith("shard-"))

    def _interrupted(self, folder: Path, ids: list[str], texts: list[str]) -> None:
        from embedtune.encoders.ray_encode import encode_sharded

        encode_sharded(ids, texts, "stub", folder, shard_size=self.shard_size, show_progress=False)
        for suffix in (".npy", ".ids.txt", ".json"):
            (folder / f"shard-00003{suffix}").unlink()
        (folder / "manifest.json").unlink()

    def _resume(self, folder: Path) -> tuple[list[str], np.ndarray]:
        from embedtune.encoders.ray_encode import encode_sharded, read_shards

        encode_sharded(self.ids, self.texts, "stub", folder, shard_size=self.shard_size, show_progress=False)
        return read_shards(folder)

    def trial(self, damage: str, seed: int, scratch: Path) -> Trial:
        rng = _rng(self.name, damage, seed)
        folder = _fresh_copy(self.folder, Path(scratch) / "shards")
        choices = [f for f in self.files if f.endswith(".json")] if damage == "edit" else self.files
        name = choices[int(rng.integers(0, len(choices)))]
        detail = damage_in_place(folder / name, damage, rng)
        if detail is None:
            stem = name.split(".")[0]
            for suffix in (".npy", ".ids.txt", ".json"):
                shutil.copyfile(self.other / f"{stem}{suffix}", folder / f"{stem}{suffix}")
            detail = "the whole shard of a run over another corpus"
        logging.getLogger("embedtune.encoders.ray_encode").disabled = True  # the "encoded again" warning, once per trial
        try:
            with _stub_sentence_encoder(0) as encoded:
                ids, vectors = self._resume(folder)
        except Exception as error:  # noqa: BLE001
            return Trial(self.name, damage, seed, name, classify_error(error, [name, name.split(".")[0], "manifest.json", "run.json"]),
                         f"{detail}: {type(error).__name__}: {error}")
        finally:
            logging.getLogger("embedtune.encoders.ray_encode").disabled = False
        if ids != self.reference[0] or not np.array_equal(vectors, self.reference[1]):
            return Trial(self.name, damage, seed, name, "wrong", detail)
        redone = sum(encoded) - (len(self.ids) - 3 * self.shard_size)  # beyond the one missing shard
        return Trial(self.name, damage, seed, name, "clear error" if redone else "identical",
                     f"{detail}: detected, {redone} rows encoded again" if redone else detail)


class _StubSentenceEncoder:
    """Stands in for the model in ``embed-corpus``: a text's vector depends on the text and the seed only."""

    backend = "torch"
    batch_size = 8
    seed = 0
    encoded: list[int] = []

    def __init__(self, model: str, show_progress: bool = False, **options: Any) -> None:
        pass

    def encode(self, texts: list[str], kind: str = "document", progress=None) -> np.ndarray:
        type(self).encoded.append(len(texts))
        return _StubEncoder(self.seed).encode(texts, kind, progress)


class _stub_sentence_encoder:
    """``with _stub_sentence_encoder(seed) as encoded:`` ``embed-corpus`` encodes with the stub; ``encoded`` lists each call's rows."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> list[int]:
        from embedtune.encoders import ray_encode

        self.module, self.saved = ray_encode, ray_encode.SentenceEncoder
        _StubSentenceEncoder.seed, _StubSentenceEncoder.encoded = self.seed, []
        ray_encode.SentenceEncoder = _StubSentenceEncoder
        return _StubSentenceEncoder.encoded

    def __exit__(self, *exc: Any) -> None:
        self.module.SentenceEncoder = self.saved


NEW_ARTEFACTS = ("exported model", "cache partial shard", "embedding shards (resumed)")


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
