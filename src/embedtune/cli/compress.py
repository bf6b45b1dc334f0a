"""``embedtune compress ...``: train, apply and export compressors (filled in by the DIVE work)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    return None
