"""The encoder recipe: everything besides the text that decides a vector, as one object.

Vectors made by one recipe and queries encoded by another give wrong hits with no error: a
document encoded by the int8 ONNX graph and a query by torch, or a query without the prompt the
documents were written for. So the recipe travels with the vectors, from the encoder to the
embedding files, the index and the plan, and where two of them meet, :meth:`EncoderRecipe.check_same`
refuses a difference that changes the vectors::

    from embedtune.encoders.recipe import EncoderRecipe

    recipe = EncoderRecipe(model="minilm", backend="onnx")
    encoder = recipe.encoder()                 # a SentenceEncoder with exactly these settings
    EncoderRecipe.of(encoder) == recipe        # True
    recipe.check_same(EncoderRecipe(model="minilm"), here="the index", there="--backend")  # raises: backend differs

It is written into files as :meth:`EncoderRecipe.to_dict` and read back by :meth:`EncoderRecipe.from_dict`,
which accepts the older model descriptions (no ``backend`` key means torch).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from embedtune.encoders.bundled import resolve_model_path
from embedtune.encoders.onnx_backend import BACKENDS, backend_precision
from embedtune.encoders.sentence_transformer import SentenceEncoder, fingerprint_model_dir
from embedtune.errors import EmbedtuneError
from embedtune.io import read_json_verified, write_json_with_digest


__all__ = ["EncoderRecipe", "RECIPE_FILE", "model_sha256", "recipe_beside", "write_recipe"]

RECIPE_FILE = "encoder.json"
"""The file beside a folder of vectors (``embed``'s ``--out``) that holds the recipe that made them."""

# Fields that change the vectors. ``model`` is a name or path the user typed; two spellings of one
# model (``minilm`` and its folder) are the same model when their sha256 agree, so the name is
# compared only when either side lacks a digest.
_VECTOR_FIELDS = ("backend", "max_seq_length", "query_prompt", "document_prompt", "normalize")


@dataclass(frozen=True)
class EncoderRecipe:
    """What made a set of vectors besides the texts.

    Args:
        model: the alias (``minilm``), a local folder, or a hub id in the local cache.
        model_sha256: the sha256 over the model folder's files ("" when unknown, e.g. a hand-written recipe).
        backend: ``torch``, ``onnx`` (fp32) or ``onnx-int8``.
        max_seq_length: the token cap in effect (``None``: the model's own).
        query_prompt: text prepended to every query (``None``: not recorded, e.g. a folder of
            documents alone, which says nothing about how its queries are to be encoded).
        document_prompt: text prepended to every document (``None``: not recorded).
        normalize: unit rows (cosine); False keeps the raw dot product.
    """

    model: str
    model_sha256: str = ""
    backend: str = "torch"
    max_seq_length: int | None = None
    query_prompt: str | None = ""
    document_prompt: str | None = ""
    normalize: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise EmbedtuneError(f"an encoder recipe needs a model name or folder; got {self.model!r}.")
        if self.backend not in BACKENDS:
            raise EmbedtuneError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}.")
        if self.max_seq_length is not None and (isinstance(self.max_seq_length, bool) or not isinstance(self.max_seq_length, int)
                                                or self.max_seq_length < 1):
            raise EmbedtuneError(f"max_seq_length must be a positive integer or null; got {self.max_seq_length!r}.")

    @property
    def precision(self) -> str:
        """``fp32`` or ``int8``: the arithmetic of the backend."""
        return backend_precision(self.backend)

    # -- building and describing ---------------------------------------------------------------
    @classmethod
    def of(cls, encoder: SentenceEncoder) -> EncoderRecipe:
        """The recipe of a live encoder (reads the model's digest; loads no weights)."""
        return cls(model=encoder.model_name, model_sha256=encoder.fingerprint, backend=encoder.backend,
                   max_seq_length=encoder.max_seq_length, query_prompt=encoder.query_prompt,
                   document_prompt=encoder.document_prompt, normalize=encoder.normalize)

    def encoder(self, **runtime: Any) -> SentenceEncoder:
        """A :class:`SentenceEncoder` with exactly this recipe; ``runtime`` takes the settings that do not
        change the vectors (``batch_size``, ``device``, ``show_progress``)."""
        changing = set(runtime) & {f.name for f in fields(self)}
        if changing:
            raise TypeError(f"{sorted(changing)} are part of the recipe; build another EncoderRecipe instead.")
        runtime.setdefault("show_progress", False)
        return SentenceEncoder(self.model, backend=self.backend, max_seq_length=self.max_seq_length,
                               query_prompt=self.query_prompt or "", document_prompt=self.document_prompt or "",
                               normalize=self.normalize, **runtime)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as JSON-ready data, with the backend's precision for readers of the file."""
        return {**asdict(self), "precision": self.precision}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "the recipe") -> EncoderRecipe:
        """Read :meth:`to_dict`'s data, or an older model description (``name``, ``fingerprint``; no
        ``backend`` means torch). ``source`` names the file in errors."""
        if not isinstance(data, Mapping):
            raise EmbedtuneError(f"{source}: the encoder recipe must be a JSON object; got {type(data).__name__}. "
                                 "Fix: write the vectors again with embedtune, which records it.")
        model = data.get("model", data.get("name"))
        if not model:
            raise EmbedtuneError(f"{source}: the encoder recipe names no model (field 'model'). Fix: write the vectors again "
                                 "with embedtune, or pass --model.")
        try:
            return cls(model=str(model), model_sha256=str(data.get("model_sha256", data.get("fingerprint", "")) or ""),
                       backend=str(data.get("backend", "torch")), max_seq_length=data.get("max_seq_length"),
                       query_prompt=_prompt(data, "query_prompt"), document_prompt=_prompt(data, "document_prompt"),
                       normalize=bool(data.get("normalize", True)))
        except EmbedtuneError as error:
            raise EmbedtuneError(f"{source}: {error}") from None

    # -- where two recipes meet ----------------------------------------------------------------
    def differences(self, other: EncoderRecipe) -> list[str]:
        """``field: this != other`` for each field that changes the vectors.

        A side whose ``max_seq_length`` is None (the model's own) matches any: a recipe written by
        hand often leaves it out, and the model's default is the same model file on both sides.
        So does a prompt that one side did not record (None).
        """
        out: list[str] = []
        if self.model_sha256 and other.model_sha256:
            if self.model_sha256 != other.model_sha256:
                out.append(f"model: {self.model} (sha256 {self.model_sha256[:12]}) != {other.model} (sha256 {other.model_sha256[:12]})")
        elif self.model != other.model:
            out.append(f"model: {self.model} != {other.model}")
        for name in _VECTOR_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in ("max_seq_length", "query_prompt", "document_prompt") and (mine is None or theirs is None):
                continue
            if mine != theirs:
                out.append(f"{name}: {mine!r} != {theirs!r}")
        return out

    def check_same(self, other: EncoderRecipe, *, here: str, there: str) -> None:
        """Raise :class:`EmbedtuneError` when ``other`` would make other vectors than this recipe.

        ``here`` and ``there`` name the two sides for the message (a file, a flag).
        """
        diff = self.differences(other)
        if diff:
            raise EmbedtuneError(f"{here} and {there} were encoded differently ({'; '.join(diff)}): their vectors do not "
                                 f"belong together and the hits would be wrong. Fix: use the recipe {here} records "
                                 f"(model {self.model}, --backend {self.backend}"
                                 + (f", --query-prompt {self.query_prompt!r}" if self.query_prompt else "")
                                 + "), or encode again with the one you want.")


def _prompt(data: Mapping[str, Any], field: str) -> str | None:
    """A prompt field: its text, "" when absent (older descriptions had none), None when recorded as unknown."""
    value = data.get(field, "")
    return None if value is None else str(value)


def model_sha256(model: str) -> str:
    """The sha256 over a model's files, by alias or folder; "" for a model that cannot be found here
    (another model than any recorded one, as far as a comparison goes)."""
    try:
        return fingerprint_model_dir(resolve_model_path(model))
    except Exception:  # noqa: BLE001 - an unknown model is simply another model
        return ""


def write_recipe(folder: str | os.PathLike, recipe: EncoderRecipe) -> Path:
    """Write ``recipe`` as ``folder/encoder.json`` (with its digest), beside the vectors it made."""
    return write_json_with_digest(Path(folder) / RECIPE_FILE, {"format": "embedtune-encoder-recipe", **recipe.to_dict()})


def recipe_beside(vectors: str | os.PathLike) -> EncoderRecipe | None:
    """The recipe recorded beside a vectors file: ``encoder.json`` (written by ``embed``), or the
    ``run.json`` of an ``embed-corpus`` shard folder (the folder itself may be given). ``None``
    when neither is there (own vectors)."""
    folder = Path(vectors) if Path(vectors).is_dir() else Path(vectors).parent
    path = folder / RECIPE_FILE
    fix = "Fix: encode the vectors again with `embedtune embed`, or delete the file if the vectors are your own."
    if path.is_file():
        data, _ = read_json_verified(path, fix)
        return EncoderRecipe.from_dict(data, str(path))
    run = folder / "run.json"
    if run.is_file():
        try:
            record = json.loads(run.read_text(encoding="utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None  # the shard reader reports a damaged run record itself, with its own fix
        if not isinstance(record, dict) or "model" not in record or not isinstance(record.get("encoder_options", {}), dict):
            return None
        options = record.get("encoder_options", {})
        # A folder of one kind records that kind's prompt only; the other stays unknown (None).
        prompt_field, other = (("query_prompt", "document_prompt") if record.get("kind") == "query"
                               else ("document_prompt", "query_prompt"))
        return EncoderRecipe.from_dict({"model": record["model"], "backend": options.get("backend", "torch"),
                                        "max_seq_length": options.get("max_seq_length"), "normalize": options.get("normalize", True),
                                        prompt_field: options.get(prompt_field, options.get("prompt", "")), other: None}, str(run))
    return None


def recipe_for_vectors(vectors: str | os.PathLike, model: str | None = None, backend: str | None = None) -> EncoderRecipe | None:
    """The recipe of a vectors file: the one recorded beside it, checked against a ``--model`` and
    ``--backend`` the user gave, or else built from them. ``None``: own vectors and no model given.

    Raises:
        EmbedtuneError: the flags name another model or backend than the one that made the vectors.
    """
    recorded = recipe_beside(vectors)
    if recorded is None:
        return EncoderRecipe(model=model, backend=backend or "torch") if model else None
    if model and model != recorded.model:
        given = model_sha256(model)
        if not given or given != recorded.model_sha256:
            raise EmbedtuneError(f"{vectors} was encoded by {recorded.model}, but --model is {model}: queries encoded by another "
                                 f"model than the documents give wrong hits. Fix: pass --model {recorded.model}, or leave --model out.")
    if backend and backend != recorded.backend:
        raise EmbedtuneError(f"{vectors} was encoded with --backend {recorded.backend}, but --backend is {backend}: the two "
                             f"backends give other vectors. Fix: pass --backend {recorded.backend}, or leave --backend out.")
    return recorded
