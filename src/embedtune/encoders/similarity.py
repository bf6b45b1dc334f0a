"""Which similarity ranks a model's embeddings: the one it was saved with, unless asked otherwise.

A sentence-transformers folder records its similarity in ``config_sentence_transformers.json``
(``similarity_fn_name``). PACE Stage II models are saved with ``"dot"``: they are meant to be
ranked by the raw inner product, and normalising them (cosine) scores another model. So the
model's own similarity is the default, an explicit choice that disagrees with it gets a warning,
and precomputed vectors (no model) default to cosine.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from embedtune.encoders.bundled import resolve_model_path
from embedtune.errors import EmbedtuneError

__all__ = ["SimilarityChoice", "saved_similarity", "resolve_similarity", "ST_CONFIG_NAME", "SUPPORTED_SIMILARITIES"]

ST_CONFIG_NAME = "config_sentence_transformers.json"
SUPPORTED_SIMILARITIES = ("cosine", "dot")
# sentence-transformers' names (SimilarityFunction) -> embedtune's.
_ALIASES = {"cosine": "cosine", "dot": "dot", "dot_product": "dot"}


@dataclass(frozen=True)
class SimilarityChoice:
    """The similarity used, and why.

    Attributes:
        name: ``"cosine"`` (L2-normalise, then inner product) or ``"dot"`` (raw inner product).
        source: ``"flag"`` (asked for explicitly), ``"model"`` (the model's saved
            ``similarity_fn_name``) or ``"default"`` (cosine: nothing said otherwise).
        model_similarity: what the model's folder says, if anything (sentence-transformers' name).
    """

    name: str
    source: str
    model_similarity: str | None = None


def saved_similarity(model: str | Path) -> tuple[str | None, Path | None]:
    """``(similarity_fn_name, config file)`` of a model folder or alias; ``(None, None)`` when it records none.

    Raises:
        EmbedtuneError: the config file exists but is not valid JSON.
    """
    folder = Path(resolve_model_path(str(model)))
    path = folder / ST_CONFIG_NAME
    if not path.is_file():
        return None, None
    try:
        config = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EmbedtuneError(f"{path}: not valid JSON ({error}). Fix: repair the file or re-save the model with sentence-transformers.") from None
    name = config.get("similarity_fn_name") if isinstance(config, dict) else None
    return (str(name), path) if name else (None, path)


def resolve_similarity(requested: str | None, model: str | Path | None, precomputed: bool = False) -> SimilarityChoice:
    """The similarity to rank with: ``requested`` if given, else the model's own, else cosine.

    Args:
        requested: ``"cosine"``, ``"dot"`` or None (not asked).
        model: the model alias or folder whose saved ``similarity_fn_name`` is the default.
        precomputed: the vectors were not encoded by ``model`` (its setting does not apply).

    Warns when ``requested`` disagrees with what the model's folder says (the explicit choice
    still wins).

    Raises:
        EmbedtuneError: ``requested`` is not supported, or the model's own similarity is one
            embedtune cannot rank with (euclidean, manhattan) and nothing was requested.
    """
    if requested is not None and requested not in SUPPORTED_SIMILARITIES:
        raise EmbedtuneError(f"similarity must be one of {list(SUPPORTED_SIMILARITIES)}; got {requested!r}.")
    if precomputed or model is None:
        return SimilarityChoice(requested or "cosine", "flag" if requested else "default")
    saved, path = saved_similarity(model)
    own = _ALIASES.get(saved) if saved else None
    if requested is not None:
        if saved is not None and own != requested:
            warnings.warn(
                f"ranking by {requested} as asked, but {path} says this model ranks by {saved!r} (similarity_fn_name); "
                f"drop --similarity to use the model's own.",
                UserWarning,
                stacklevel=2,
            )
        return SimilarityChoice(requested, "flag", saved)
    if saved is None:
        return SimilarityChoice("cosine", "default", None)
    if own is None:
        raise EmbedtuneError(
            f"{path}: field 'similarity_fn_name' is {saved!r}, which embedtune cannot rank with "
            f"(it ranks by {' or '.join(SUPPORTED_SIMILARITIES)}). Fix: pass --similarity cosine or --similarity dot."
        )
    return SimilarityChoice(own, "model", saved)
