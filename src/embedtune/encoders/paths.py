"""Where embedtune keeps its user cache (models, embeddings): ``$EMBEDTUNE_CACHE`` or
``$XDG_CACHE_HOME/embedtune`` (``~/.cache/embedtune``)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    override = os.environ.get("EMBEDTUNE_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "embedtune"
