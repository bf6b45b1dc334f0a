"""Resolve a protocol dataset entry into the BEIR folders it stands for.

CQADupStack is a folder of communities, each a BEIR dataset; the paper averages them with
equal weight. Any folder whose children (not itself) hold ``corpus.jsonl`` is treated so.
"""

from __future__ import annotations

from embedtune.data.beir import resolve_dataset_path

__all__ = ["expand_dataset", "community_parent"]


def expand_dataset(name: str, path: str) -> list[tuple[str, str]]:
    """``[(run name, path)]``: one entry, or one per community as ``name/community``."""
    root = resolve_dataset_path(path)
    if root.is_dir() and not (root / "corpus.jsonl").is_file():
        communities = sorted(child for child in root.iterdir() if (child / "corpus.jsonl").is_file())
        if not communities:
            raise FileNotFoundError(f"{root}: neither a BEIR dataset (no corpus.jsonl) nor a folder of BEIR communities.")
        return [(f"{name}/{child.name}", str(child)) for child in communities]
    return [(name, str(root))]


def community_parent(run_name: str) -> str:
    """``cqadupstack/android`` -> ``cqadupstack``; a plain name maps to itself."""
    return run_name.split("/", 1)[0]
