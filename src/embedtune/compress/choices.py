"""Option names the compressor configs validate against, readable without torch.

The config dataclasses (e.g. :class:`~embedtune.compress.dive.config.DIVEConfig`, whose field help
``compress train --help`` prints) check their values against these; the modules that implement the
options (:mod:`~embedtune.compress.residual_mlp`, :mod:`~embedtune.compress.losses.self_limiting_triplet`,
:mod:`~embedtune.compress.quantization_aware`) need torch and re-export them.
"""

from __future__ import annotations

__all__ = ["ACTIVATION_NAMES", "TRIPLET_KINDS", "QUANTIZATION_AWARE", "check_quantization_aware"]

#: The residual MLP's activations σ (``embedtune.compress.residual_mlp.ACTIVATIONS`` maps each to its module).
ACTIVATION_NAMES = ("gelu", "relu", "silu", "tanh")
#: The self-limiting triplet term: DIVE's hinge, or the paper's "w/o self-limiting" softplus ablation.
TRIPLET_KINDS = ("hinge", "softplus")
#: Quantisation-aware training targets (None: off).
QUANTIZATION_AWARE = (None, "binary", "int8")


def check_quantization_aware(value: object) -> None:
    """Raise a clear error unless ``value`` is None, ``"binary"`` or ``"int8"``."""
    if value not in QUANTIZATION_AWARE:
        raise ValueError(f"quantization_aware must be None, 'binary' or 'int8'; got {value!r}.")
