"""Encode a corpus into sharded ``.npy`` files, in one process or on a Ray Data actor pool, resumable by shard.

The corpus is cut into shards of ``shard_size`` texts, in order. Shard ``i`` is written as
``shard-0000i.npy`` (float32 ``(rows, d)``), ``shard-0000i.ids.txt`` and, last,
``shard-0000i.json`` (its rows, dimension and the sha256 of both files), each atomically. A shard
is complete when its record is there and both files match it (their digests, and as many vector
rows as ids as the corpus has for that shard, and those ids the corpus's own); a rerun skips
complete shards and encodes the rest, a damaged, truncated or foreign one included (a shard copied
in from a run over another corpus holds other ids). ``manifest.json`` (written when every shard is
there) lists the shards, their digests, the model, the rows and the digest of the corpus's ids;
:func:`read_shards` checks every shard against its record again, every vector for NaN and
infinity, and the ids against the corpus the folder was made for (``manifest.json`` and
``run.json``).

Single process::

    from embedtune.encoders.ray_encode import encode_sharded
    encode_sharded(ids, texts, "minilm", "vectors/", shard_size=50_000)

Ray Data, one encoder per actor (``pip install "embedtune[ray]"``)::

    import ray
    from embedtune.encoders.ray_encode import encode_sharded_ray
    ray.init()                                     # ray.init(address="auto") on a cluster
    encode_sharded_ray(ids, texts, "minilm", "/shared/vectors/", shard_size=50_000, actors=8, num_gpus=1)

Every actor loads the model once and encodes whole shards (a shard is one batch of the
pipeline), so a shard's vectors do not depend on which actor or process encoded it. The output
folder must be writable from every worker: on a cluster, shared storage (NFS, a mounted
bucket). :func:`read_shards` loads them back in order as one matrix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.errors import VECTORS_FIX, EmbedtuneError, check_finite
from embedtune.io import (
    OUT_SPACE_FIX,
    IntegrityError,
    atomic_save_npy,
    atomic_write,
    atomic_write_json,
    read_json_verified,
    sha256_file,
    sha256_json,
    write_json_with_digest,
    writing,
)
from embedtune.runtime import RAY_CHATTER, native_chatter_filtered, progress_bar, verbose_enabled

logger = logging.getLogger(__name__)

__all__ = ["ShardEncoder", "encode_sharded", "encode_sharded_ray", "is_shard_folder", "pending_shards", "read_shards", "shard_files",
           "shard_folder_shape",
           "SHARD_MANIFEST"]

SHARD_MANIFEST = "manifest.json"
_PLURAL = {"document": "documents", "query": "queries"}  # progress-bar labels
_UNIT = {"document": "doc", "query": "query"}


def _shard_paths(out: Path, index: int) -> tuple[Path, Path]:
    return out / f"shard-{index:05d}.npy", out / f"shard-{index:05d}.ids.txt"


def _record_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.json"


SHARD_FIX = "Run `embedtune embed-corpus` again with the same --out: a damaged or incomplete shard is encoded again."


def _ids_text_sha256(ids: Sequence[str]) -> str:
    """sha256 of a shard's ids file holding ``ids`` (one per line), as :meth:`ShardEncoder.encode_shard` writes it."""
    return hashlib.sha256("".join(f"{i}\n" for i in ids).encode("utf-8")).hexdigest()


def shard_problem(out: str | Path, index: int, rows: int | None = None, ids: Sequence[str] | None = None) -> str | None:
    """Why shard ``index`` of ``out`` is not complete and intact (None when it is).

    ``rows``: how many texts the corpus has for this shard (None: take the record's word for it).
    ``ids``: the corpus's ids for this shard; a shard holding others (copied in from a run over
    another corpus, its record and all) is not this corpus's shard.
    """
    out = Path(out)
    npy, id_file = _shard_paths(out, index)
    record_path = _record_path(out, index)
    if not record_path.is_file():
        return f"{record_path.name} is missing" + (" (the shard predates shard records)" if id_file.is_file() else "")
    try:
        record, _ = read_json_verified(record_path, SHARD_FIX, require_digest=True)
    except IntegrityError as error:
        return str(error)
    for path, key in ((npy, "npy_sha256"), (id_file, "ids_sha256")):
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != record.get(key):
            return f"{path}: sha256 differs from the one {record_path.name} recorded (damaged or truncated)"
    if ids is not None and record.get("ids_sha256") != _ids_text_sha256([str(i) for i in ids]):
        return f"{id_file}: holds other ids than this corpus's {len(ids)} ids for shard {index} (a shard of a run over another corpus?)"
    try:
        vectors = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        return f"{npy}: not a readable .npy array ({error})"
    n_ids = len(id_file.read_text(encoding="utf-8").split("\n")) - 1
    expected = record.get("rows") if rows is None else rows
    if vectors.ndim != 2 or vectors.shape[0] != n_ids or n_ids != expected or vectors.shape[1] != record.get("dim"):
        return (f"{npy}: {vectors.shape} vectors and {n_ids} ids, but the shard should hold {expected} rows of "
                f"{record.get('dim')} dims")
    return None


def _check(ids: Sequence[str], texts: Sequence[str], shard_size: int) -> None:
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids but {len(texts)} texts; give one id per text.")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1; got {shard_size}.")
    bad = next((i for i in ids if "\n" in str(i) or "\r" in str(i)), None)
    if bad is not None:
        raise ValueError(f"id {bad!r} contains a line break, which a shard's ids.txt cannot hold.")


def pending_shards(out: str | Path, n: int, shard_size: int, ids: Sequence[str] | None = None) -> list[int]:
    """Indices of the shards of an ``n``-text corpus that are not complete and intact in ``out`` yet.

    A shard that is there but damaged, truncated, of the wrong size or (given the corpus's
    ``ids``) holding other ids is pending too (with a warning naming it).
    """
    out = Path(out)
    n_shards = (n + shard_size - 1) // shard_size
    pending = []
    for i in range(n_shards):
        shard_ids = None if ids is None else ids[i * shard_size : (i + 1) * shard_size]
        problem = shard_problem(out, i, min(shard_size, n - i * shard_size), shard_ids)
        if problem is not None:
            if _shard_paths(out, i)[0].exists() or _shard_paths(out, i)[1].exists():
                logger.warning("%s: shard %d is encoded again: %s", out, i, problem)
            pending.append(i)
    return pending


RUN_RECORD = "run.json"


def _claim(out: Path, ids: Sequence[str], texts: Sequence[str], model: str, kind: str, shard_size: int,
           encoder_options: dict[str, Any]) -> None:
    """Record what this folder's shards are made of; refuse to resume a folder made with other settings.

    Resuming with another model, shard size or corpus (its ids, or the texts under the same ids)
    would mix two encodings in one matrix. So would another int8 graph (a new quantisation recipe,
    another onnxruntime) or, for int8, another batch size (activation ranges are set per batch):
    an ``onnx-int8`` folder records both, and one made before they were recorded is not resumed.
    """
    record = {"model": model, "kind": kind, "shard_size": shard_size, "rows": len(ids), "ids_sha256": sha256_json([str(i) for i in ids]),
              "texts_sha256": sha256_json([str(t) for t in texts]),
              "encoder_options": {k: v for k, v in sorted(encoder_options.items()) if k in ("max_seq_length", "normalize", "prompt", "query_prompt", "document_prompt")
                                  or (k == "backend" and v != "torch")}}  # torch: folders made before backends resume
    if encoder_options.get("backend") == "onnx-int8":
        record["int8_graph"] = _int8_graph(model, encoder_options)
    path = out / RUN_RECORD
    if path.is_file():
        previous = read_run_record(out)
        # A folder from before texts were recorded has no texts_sha256: what it does record must agree.
        changed = sorted(k for k in record if (k in previous or k != "texts_sha256") and previous.get(k) != record[k])
        if changed:
            shown = ", ".join(f"{k}: {previous.get(k)!r} -> {record[k]!r}" for k in changed if k not in ("ids_sha256", "texts_sha256", "int8_graph"))
            notes = [*(["another corpus"] if "ids_sha256" in changed else []), *(["other texts"] if "texts_sha256" in changed else [])]
            if "int8_graph" in changed:
                notes.append("made before embedtune recorded which int8 graph encoded a folder, so it cannot be resumed safely"
                             if "int8_graph" not in previous else
                             f"another int8 graph or batch size: {previous['int8_graph']!r} -> {record['int8_graph']!r}")
            raise ValueError(f"{out}: its shards were made with other settings ({'; '.join(filter(None, [shown, *notes]))}). "
                             f"Fix: write to a new --out folder, or delete {out}.")
        return
    atomic_write_json(path, record)


def read_run_record(out: str | Path) -> dict[str, Any] | None:
    """``out``'s ``run.json`` (what its shards are made of), or None when there is none; a damaged one is an error naming it."""
    path = Path(out) / RUN_RECORD
    if not path.is_file():
        return None
    fix = f"Fix: write to a new --out folder, or delete {path} (the shards are then checked against the corpus again)."
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise IntegrityError(f"{path}: not a readable JSON file ({error}); the file is damaged. {fix}") from None
    if not isinstance(record, dict):
        raise IntegrityError(f"{path}: expected a JSON object (the settings the shards were made with), found a "
                             f"{type(record).__name__}; the file is damaged or was replaced. {fix}")
    return record


def _int8_graph(model: str, encoder_options: dict[str, Any]) -> dict[str, Any]:
    """What makes an int8 encoding: its graph's sha256 (built and checked now, as encoding would) and the batch size."""
    encoder = SentenceEncoder(model, show_progress=False, **encoder_options)
    return {"sha256": encoder.int8_graph_sha256, "batch_size": encoder.batch_size}


def _check_int8_graph(out: Path, encoder: SentenceEncoder) -> None:
    """Refuse to write shards with another int8 graph than the folder's (a Ray worker on a node with another onnxruntime)."""
    path = out / RUN_RECORD
    claimed = (read_run_record(out) or {}).get("int8_graph")
    if claimed is not None and claimed["sha256"] != encoder.int8_graph_sha256:
        raise EmbedtuneError(f"{path}: this folder's shards were encoded by int8 graph {claimed['sha256'][:12]}, but this worker built "
                             f"{encoder.int8_graph_sha256[:12]} (another onnxruntime or quantisation recipe); mixing them would "
                             "mix two encodings in one matrix. Fix: the same embedtune and onnxruntime on every worker, or --backend onnx.")


class ShardEncoder:
    """Callable for ``Dataset.map_batches``: encodes each batch (one shard) and writes it; loads the model once.

    Args:
        model: an alias or a local sentence-transformers folder.
        out: the shard folder.
        kind: ``document`` or ``query`` (prompts and the embedding recipe follow it).
        encoder_options: more :class:`SentenceEncoder` keyword arguments (``batch_size``,
            ``max_seq_length``, ``device``...).
    """

    def __init__(self, model: str, out: str | Path, kind: str = "document", threads: int | None = None, **encoder_options: Any) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        self.encoder = SentenceEncoder(model, show_progress=False, **encoder_options)
        self.out, self.kind = Path(out), kind
        if self.encoder.backend == "onnx-int8":
            _check_int8_graph(self.out, self.encoder)

    def encode_shard(self, index: int, ids: Sequence[str], texts: Sequence[str], progress: Callable[[int], object] | None = None) -> int:
        """Encode and write shard ``index``; ``progress`` is called with each finished batch's size."""
        vectors = np.ascontiguousarray(self.encoder.encode(list(texts), kind=self.kind, progress=progress), dtype=np.float32)  # type: ignore[arg-type]
        npy, id_file = _shard_paths(self.out, index)
        check_finite(vectors, f"the encoder's output for shard {index} ({npy.name})", "vectors",
                     fix="the model produced NaN or infinity for these texts; check the model and its inputs")
        with writing(npy, OUT_SPACE_FIX):
            _record_path(self.out, index).unlink(missing_ok=True)  # an older shard's record no longer holds
            atomic_save_npy(npy, vectors)
            atomic_write(id_file, lambda tmp: tmp.write_text("".join(f"{i}\n" for i in ids), encoding="utf-8"))
            write_json_with_digest(_record_path(self.out, index), {  # last: marks it complete
                "rows": int(len(vectors)), "dim": int(vectors.shape[1]) if vectors.ndim == 2 else 0,
                "npy_sha256": sha256_file(npy), "ids_sha256": sha256_file(id_file)})
        return len(vectors)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shards = [int(s) for s in batch["shard"]]
        rows = [self.encode_shard(s, list(i), list(t)) for s, i, t in zip(shards, batch["ids"], batch["texts"])]
        return {"shard": np.array(shards, dtype=np.int64), "rows": np.array(rows, dtype=np.int64)}


def _write_manifest(out: Path, n: int, shard_size: int, model: str, kind: str, seconds: float, backend: str,
                    ids: Sequence[str] | None = None) -> dict[str, Any]:
    n_shards = (n + shard_size - 1) // shard_size
    missing = pending_shards(out, n, shard_size, ids)
    if missing:
        first = missing[0]
        problem = shard_problem(out, first, min(shard_size, n - first * shard_size),
                                None if ids is None else ids[first * shard_size : (first + 1) * shard_size])
        raise EmbedtuneError(f"{_shard_paths(out, first)[0]}: shards {missing[:5]} are missing or incomplete after encoding "
                             f"({problem}). {SHARD_FIX}")
    dims = {np.load(_shard_paths(out, i)[0], mmap_mode="r").shape[1] for i in range(n_shards)} if n_shards else set()
    records = [read_json_verified(_record_path(out, i), SHARD_FIX, require_digest=True)[0] for i in range(n_shards)]
    manifest = {"format": "embedtune-shards", "model": model, "kind": kind, "rows": n, "shard_size": shard_size,
                "shards": [_shard_paths(out, i)[0].name for i in range(n_shards)], "dim": dims.pop() if len(dims) == 1 else None,
                # Each shard's digests again: a shard swapped in from another run, its own record rewritten, still differs here.
                "shard_sha256": [{"npy": r["npy_sha256"], "ids": r["ids_sha256"]} for r in records],
                # The corpus's ids in order: shards that are each intact but hold another corpus's rows differ here.
                **({"ids_sha256": sha256_json([str(i) for i in ids])} if ids is not None else {}),
                "last_run": {"backend": backend, "seconds": seconds}}
    with writing(out / SHARD_MANIFEST, OUT_SPACE_FIX):
        write_json_with_digest(out / SHARD_MANIFEST, manifest)
    return manifest


def _items(ids: Sequence[str], texts: Sequence[str], shard_size: int, shards: list[int]) -> list[dict[str, Any]]:
    return [{"shard": s, "ids": [str(i) for i in ids[s * shard_size : (s + 1) * shard_size]],
             "texts": list(texts[s * shard_size : (s + 1) * shard_size])} for s in shards]


def encode_sharded(ids: Sequence[str], texts: Sequence[str], model: str, out: str | Path, shard_size: int = 50_000,
                   kind: str = "document", show_progress: bool = True, **encoder_options: Any) -> dict[str, Any]:
    """Encode ``texts`` shard by shard in this process, skipping complete shards; returns the manifest.

    ``show_progress``: one bar over the corpus, moving after every batch (``embedtune -q`` hides it).
    """
    _check(ids, texts, shard_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _claim(out, ids, texts, model, kind, shard_size, encoder_options)
    todo = pending_shards(out, len(texts), shard_size, ids)
    start = time.perf_counter()
    if todo:
        encoder = ShardEncoder(model, out, kind, **encoder_options)
        items = _items(ids, texts, shard_size, todo)
        # One bar over the whole corpus; complete shards from an earlier run count as done.
        with progress_bar(len(texts), f"encoding {len(texts)} {_PLURAL.get(kind, kind)}", unit=_UNIT.get(kind, "text"),
                          initial=len(texts) - sum(len(item["ids"]) for item in items), enabled=show_progress) as bar:
            for item in items:
                encoder.encode_shard(item["shard"], item["ids"], item["texts"], progress=bar.update)
                logger.debug("encode_sharded: shard %d done", item["shard"])
    return _write_manifest(out, len(texts), shard_size, model, kind, time.perf_counter() - start, "local", ids)


def encode_sharded_ray(ids: Sequence[str], texts: Sequence[str], model: str, out: str | Path, shard_size: int = 50_000,
                       kind: str = "document", actors: int = 2, num_cpus: float = 1.0, num_gpus: float = 0.0,
                       threads_per_actor: int | None = None, show_progress: bool = True, **encoder_options: Any) -> dict[str, Any]:
    """The same on a Ray Data actor pool of ``actors`` encoders (one per GPU with ``num_gpus=1``).

    Needs ``ray.init()`` first (a local one or a cluster). Each actor reserves ``num_cpus`` and
    ``num_gpus``; keep some CPU free for Ray's own tasks on a small machine (e.g. 2 actors of
    0.5 CPU on 2 cores). ``threads_per_actor`` (torch threads in each actor) defaults to the CPUs
    it reserves, at least 1, so that the actors together use the cores they reserved, not each of
    them every core of the node.
    """
    if threads_per_actor is None:
        threads_per_actor = max(1, int(num_cpus))
    import ray  # the optional `ray` extra, only for this backend

    _check(ids, texts, shard_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _claim(out, ids, texts, model, kind, shard_size, encoder_options)
    todo = pending_shards(out, len(texts), shard_size, ids)
    start = time.perf_counter()
    if todo:
        # Ray Data's own bars and per-run log lines are replaced by one embedtune bar over the
        # corpus, moved as each shard comes back (Ray's are shown with `embedtune -v`).
        context = ray.data.DataContext.get_current()
        quiet = not verbose_enabled()
        saved = (context.enable_progress_bars, context.print_on_execution_start)
        saved_levels = {name: logging.getLogger(name).level for name in ("ray", "ray.data")}
        if quiet:
            context.enable_progress_bars = False
            context.print_on_execution_start = False
            for name in saved_levels:
                logging.getLogger(name).setLevel(logging.ERROR)
        items = _items(ids, texts, shard_size, todo)
        dataset = ray.data.from_items(items, override_num_blocks=len(todo))
        mapped = dataset.map_batches(
            ShardEncoder,
            fn_constructor_kwargs={"model": model, "out": str(out.resolve()), "kind": kind, "threads": threads_per_actor, **encoder_options},
            batch_size=1,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=num_cpus,
            num_gpus=num_gpus,
        )
        done = []
        try:
            # Ray's core logs one C++ line per actor pool on the driver's stderr (RAY_CHATTER): hidden unless -v.
            with native_chatter_filtered(RAY_CHATTER), progress_bar(
                    len(texts), f"encoding {len(texts)} {_PLURAL.get(kind, kind)} on {actors} Ray actors", unit=_UNIT.get(kind, "text"),
                    initial=len(texts) - sum(len(item["ids"]) for item in items), enabled=show_progress) as bar:
                for row in mapped.iter_rows():
                    done.append(row)
                    bar.update(int(row["rows"]))
        finally:
            context.enable_progress_bars, context.print_on_execution_start = saved
            for name, level in saved_levels.items():
                logging.getLogger(name).setLevel(level)
        logger.debug("encode_sharded_ray: %d shards, %d rows", len(done), sum(int(r["rows"]) for r in done))
    return _write_manifest(out, len(texts), shard_size, model, kind, time.perf_counter() - start, f"ray ({actors} actors)", ids)


def shard_files(out: str | Path) -> tuple[list[tuple[Path, list[str]]], int]:
    """The shards of a complete folder, each checked against its digests and the corpus, in corpus
    order: ``([(shard .npy, its ids), ...], dim)``. Reads no vectors into memory (each shard is
    hashed), so a folder larger than RAM can be streamed shard by shard.
    """
    out = Path(out)
    path = out / SHARD_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{out}: no {SHARD_MANIFEST}; the encoding has not finished (run it again to resume).")
    manifest, _ = read_json_verified(path, SHARD_FIX, require_digest=True)
    shards: list[tuple[Path, list[str]]] = []
    ids: list[str] = []
    rows, dim = 0, int(manifest.get("dim") or 0)
    listed = manifest.get("shard_sha256")
    if not isinstance(listed, list) or len(listed) != len(manifest["shards"]):
        raise IntegrityError(f"{path}: field 'shard_sha256' is missing or does not list every shard. {SHARD_FIX}")
    for index, name in enumerate(manifest["shards"]):
        npy = out / name
        problem = shard_problem(out, index)
        if problem is None:
            record, _ = read_json_verified(_record_path(out, index), SHARD_FIX, require_digest=True)
            if {"npy": record["npy_sha256"], "ids": record["ids_sha256"]} != listed[index]:
                problem = f"its digests are not the ones {path.name} field 'shard_sha256' recorded (a shard of another run?)"
        if problem is not None or npy != _shard_paths(out, index)[0]:
            raise IntegrityError(f"{npy}: {problem or 'not the shard manifest.json lists at this place'}. {SHARD_FIX}")
        shard_ids = npy.with_name(npy.name.removesuffix(".npy") + ".ids.txt").read_text(encoding="utf-8").split("\n")[:-1]
        shape = np.load(npy, mmap_mode="r", allow_pickle=False).shape
        rows, dim = rows + shape[0], shape[1]
        shards.append((npy, shard_ids))
        ids += shard_ids
    if len(ids) != rows or len(ids) != manifest["rows"]:
        raise IntegrityError(f"{path}: field 'rows' is {manifest['rows']!r}, but its shards hold {len(ids)} ids and {rows} vectors. "
                             f"{SHARD_FIX}")
    # The corpus the folder was made for (the manifest's record, else run.json's): another corpus's shards, each intact, differ here.
    run = read_run_record(out) or {}
    for source, expected in ((path, manifest.get("ids_sha256")), (out / RUN_RECORD, run.get("ids_sha256"))):
        if expected is not None and sha256_json(ids) != expected:
            raise IntegrityError(f"{source}: its shards hold other ids than the corpus this folder was made for (field 'ids_sha256'); "
                                 f"a shard of a run over another corpus was copied in? {SHARD_FIX}")
    return shards, dim


def shard_folder_shape(out: str | Path) -> tuple[int, int]:
    """``(rows, dim)`` of a complete shard folder, from its manifest (its own digest checked), reading no shard:
    the shards themselves are checked when they are read (:func:`shard_files`)."""
    out = Path(out)
    path = out / SHARD_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{out}: no {SHARD_MANIFEST}; the encoding has not finished (run it again to resume).")
    manifest, _ = read_json_verified(path, SHARD_FIX, require_digest=True)
    dim = manifest.get("dim")
    if not dim and manifest.get("shards"):
        dim = np.load(out / manifest["shards"][0], mmap_mode="r", allow_pickle=False).shape[1]
    return int(manifest["rows"]), int(dim or 0)


def is_shard_folder(path: str | Path) -> bool:
    """True for a folder written by ``embed-corpus`` (it holds its run record, ``run.json``)."""
    path = Path(path)
    return path.is_dir() and (path / RUN_RECORD).is_file()


def read_shards(out: str | Path) -> tuple[list[str], np.ndarray]:
    """The ids and ``(n, d)`` vectors of a complete shard folder, in corpus order."""
    shards, dim = shard_files(out)
    ids: list[str] = []
    blocks = []
    for npy, shard_ids in shards:
        block = np.load(npy, allow_pickle=False)
        check_finite(block, str(npy), "vectors", fix=VECTORS_FIX)
        blocks.append(block)
        ids += shard_ids
    vectors = np.concatenate(blocks) if blocks else np.zeros((0, dim), np.float32)
    return ids, vectors
