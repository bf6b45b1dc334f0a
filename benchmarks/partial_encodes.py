"""Carry an unfinished encode from one machine to the next (an encode that outlasts a CPU session).

    .venv/bin/python benchmarks/partial_encodes.py save ef8b9ab67d0b     # cache -> benchmarks/data/partial-encodes/
    .venv/bin/python benchmarks/partial_encodes.py restore               # benchmarks/data/partial-encodes/ -> cache

The embedding cache writes an encode shard by shard (2,048 texts each) under
``<cache>/embeddings/<key[:2]>/<key>/partial/`` and resumes from the finished shards
(:meth:`embedtune.encoders.cache.EmbeddingCache.get_or_compute`). The key is a sha256 of the model
files, the data file, the text recipe and the encoder options, so it is the same on every machine
with the same model package and data. ``save`` copies the finished shards of the entries whose key
starts with the given prefixes, with their records (each shard's ``<lo>-<hi>.json`` and the encode's ``run.json``, which the cache
checks before it reuses a shard) and a manifest of every file's sha256; ``restore`` checks every
file against the manifest and copies it back, so the next run of the same command encodes only the
rest. A complete entry is never touched. An entry saved without its records (before the cache kept
them) is refused by ``restore``: the cache would encode those shards again.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from embedtune.encoders.paths import cache_root
from embedtune.io import atomic_write_json, sha256_file

STORE = Path(__file__).resolve().parent / "data" / "partial-encodes"
MANIFEST = "manifest.json"
#: What a manifest may name: a cache key, and files of a cache entry's partial/ folder (nothing that leaves it).
_KEY = re.compile(r"[0-9a-f]{64}")
_SHARD_FILE = re.compile(r"\d{10}-\d{10}\.(npy|json)|run\.json")


def _entry(key: str) -> Path:
    return cache_root() / "embeddings" / key[:2] / key


def save(prefixes: list[str]) -> int:
    found = [p for p in (cache_root() / "embeddings").glob("*/*/partial") if any(p.parent.name.startswith(x) for x in prefixes)]
    if not found:
        print(f"no unfinished entry in {cache_root() / 'embeddings'} starts with {prefixes}", file=sys.stderr)
        return 1
    for partial in found:
        key = partial.parent.name
        shards = sorted(s for s in partial.glob("*.npy") if s.with_suffix(".json").is_file())
        records = [s.with_suffix(".json") for s in shards] + [partial / "run.json"]
        target = STORE / key
        target.mkdir(parents=True, exist_ok=True)
        for path in shards + records:
            shutil.copy2(path, target / path.name)
        atomic_write_json(target / MANIFEST, {"key": key, "shards": {s.name: sha256_file(s) for s in shards},
                                              "records": {r.name: sha256_file(r) for r in records}})
        print(f"{key[:12]}: {len(shards)} finished shard(s) and their records saved to {target}")
    return 0


def restore() -> int:
    for manifest_path in sorted(STORE.glob(f"*/{MANIFEST}")):
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        key, entry = manifest["key"], _entry(manifest["key"])
        if (entry / "meta.json").is_file():
            print(f"{key[:12]}: already complete in the cache; nothing restored")
            continue
        if "records" not in manifest:
            print(f"{manifest_path}: saved without the shards' records, which the embedding cache checks before it reuses a "
                  "shard; not restored (save the entry again from a cache that holds them, or encode it whole)", file=sys.stderr)
            return 1
        files = {**manifest["shards"], **manifest["records"]}
        strange = [name for name in files if not _SHARD_FILE.fullmatch(name)] + ([] if _KEY.fullmatch(str(key)) else [str(key)])
        if strange:
            print(f"{manifest_path}: {strange[0]!r} is not a cache key or a shard file name (<lo>-<hi>.npy/.json, run.json); "
                  "not restored", file=sys.stderr)
            return 1
        (entry / "partial").mkdir(parents=True, exist_ok=True)
        for name, digest in files.items():
            source = manifest_path.parent / name
            if sha256_file(source) != digest:
                print(f"{source}: sha256 differs from {manifest_path}; not restored", file=sys.stderr)
                return 1
            shutil.copy2(source, entry / "partial" / name)
        print(f"{key[:12]}: {len(manifest['shards'])} shard(s) and their records restored; the next encode of this entry resumes after them")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("prefixes", nargs="*", help="save: cache-key prefixes of the entries to save")
    args = parser.parse_args()
    if args.action == "save":
        if not args.prefixes:
            parser.error("save needs at least one cache-key prefix")
        return save(args.prefixes)
    return restore()


if __name__ == "__main__":
    sys.exit(main())
