"""The choices of PACE's loss (similarity, weighting, normalisation), readable without torch.

The config schema and the CLI's flags read them; :mod:`embedtune.finetune.losses.focal_embedding`
(which needs torch) implements them.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["Similarity", "Weighting", "Normalization", "SIMILARITIES", "WEIGHTINGS", "NORMALIZATIONS"]

# Each choice is declared once, as a type; the tuples that validate values are read from it.
Similarity = Literal["cosine", "dot"]
Weighting = Literal["focal", "random", "qp", "qn", "none"]  # focal (PACE), random / qp / qn (Figure 6b), none (InfoNCE)
Normalization = Literal["global", "local"]
SIMILARITIES: tuple[str, ...] = get_args(Similarity)
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)
NORMALIZATIONS: tuple[str, ...] = get_args(Normalization)
