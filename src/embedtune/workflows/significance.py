"""Paired significance on per-query scores: :mod:`embedtune.evaluate.significance`, where every layer can reach it."""

from __future__ import annotations

from embedtune.evaluate.significance import PairedTest, align_by_query, paired_test

__all__ = ["PairedTest", "align_by_query", "paired_test"]
