"""The compressor contract shared by DIVE and every baseline.

A compressor is built from a validated config dataclass and follows scikit-learn's estimator
shape: ``fit(train, val=None, log_path=None) -> self``, ``transform(X) -> (n, k)`` float32 rows
with unit L2 norm, ``save(dir)`` and ``load(dir)``. The benchmark treats every registered method
the same way.

Everything the CLI, the workflows and the protocol grid need to know about a method is a class
trait here (``supervised``, ``supports_unsupervised``, ``seed_dependent``, ``wide_output_settings``, ``help``,
``lr_candidates``, ``presets``, ``default_preset``) or a hook (``fit_details``, ``export_layers``), so a new
method is one new module (a built-in one also gets its line in :mod:`embedtune.compress.catalog`, which
``--help`` reads without importing the module).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from embedtune import __version__
from embedtune.constraints import Constraint, Interval, validate_constraints
from embedtune.array_facts import known, remember
from embedtune.errors import check_finite
from embedtune.evaluate.search import unit_rows
from embedtune.io import (
    IntegrityError,
    check_version_stamp,
    config_from_dict,
    load_weights,
    older_than_installed,
    read_json_verified,
    save_weights,
    sha256_file,
    sha256_json,
    verify_sha256,
    write_json_with_digest,
)

if TYPE_CHECKING:
    import torch

    from embedtune.compress.export_layers import ExportLayer
    # Imported where a preset is asked for: presets import the triplet miner, which applying a fitted compressor never needs.
    from embedtune.compress.presets import Preset

logger = logging.getLogger(__name__)

__all__ = ["PseudoQueries", "TrainingData", "Compressor", "CompressorConfig", "as_float32_rows", "l2_normalize", "check_output_dim"]

CONFIG_NAME = "config.json"
_OUTPUT_FIX = ("the input rows are finite, so the compressor's weights hold NaN or infinity (a damaged file or a diverged fit); "
               "re-fit it or restore the adapter folder from a good copy")
WEIGHTS_NAME = "model.safetensors"
#: What a compressor does to its input rows before its map, recorded at fit time and applied by every
#: deployed path (``transform``, ``compress apply``, ``index build``, ``search``, the export):
#: ``"unit"`` scales each row to unit L2 norm (it was fitted, and scored, on unit rows: cosine similarity).
INPUT_NORMALIZATIONS = (None, "unit")
# Rows whose L2 norms are all within this of 1 (or 0) count as unit rows: unit_rows keeps such rows bit for bit.
_UNIT_TOLERANCE = 1e-4


def as_float32_rows(X: Any, name: str = "the input vectors", dim: int | None = None,
                    expected: str = "the compressor was fitted on {dim}-d vectors: give it vectors of the model it was fitted on") -> np.ndarray:
    """Return ``X`` as a C-contiguous float32 matrix, checking its shape.

    ``name`` says what the rows are in messages (never a variable name); ``expected`` what ``dim`` is.
    """
    array = np.ascontiguousarray(np.asarray(X, dtype=np.float32))
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (n, d); got shape {array.shape}.")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{name} are {array.shape[1]}-d ({array.shape[1]} columns) but {expected.format(dim=dim)}.")
    check_finite(array, name, "input", fix="drop or repair the rows holding NaN or infinity before compressing them")
    return array


def l2_normalize(X: np.ndarray, eps: float = 1e-12, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``X`` scaled to unit L2 norm (float32); ``out`` (C-contiguous float32, X's shape) receives them, no new array."""
    norms = np.maximum(np.linalg.norm(X, axis=1, keepdims=True), eps)
    if out is not None and X.dtype == np.float32:
        return np.divide(X, norms, out=out)
    result = np.ascontiguousarray(X / norms, dtype=np.float32)
    if out is not None:
        out[...] = result
        return out
    return result


@dataclass
class PseudoQueries:
    """Training-only pseudo-queries (one per document, from its own text) and their triplets.

    They are never held out for selection and never scored where there are real queries: there,
    selection and every reported figure read real queries only (see :mod:`embedtune.data.pseudo_queries`).
    Without labels, DIVE's unsupervised mode can select on the pseudo-queries of documents it
    holds out and never trains on (``selection_signal='pseudo-queries'``); they need no triplets.

    Attributes:
        ids: the pseudo-query ids, rows of ``embeddings``.
        embeddings: ndarray of shape (n, d), float32, encoded as queries.
        triplets: ndarray of shape (m, 3), int64: ``(pseudo-query row, positive doc row, negative doc row)``,
            doc rows into the :class:`TrainingData`'s ``doc_embeddings``.
        source: how the texts were made (``title`` or ``first-sentence``).
    """

    ids: list[str]
    embeddings: np.ndarray
    triplets: np.ndarray
    source: str = "title"

    def __post_init__(self) -> None:
        self.embeddings = as_float32_rows(self.embeddings, "the pseudo-query vectors")
        self.triplets = np.asarray(self.triplets, dtype=np.int64).reshape(-1, 3)
        if len(self.ids) != len(self.embeddings):
            raise ValueError(f"{len(self.ids)} pseudo-query ids for {len(self.embeddings)} pseudo-query vectors.")
        if len(self.triplets) and (self.triplets[:, 0].max() >= len(self.ids) or self.triplets.min() < 0):
            raise ValueError("pseudo-query triplets index a pseudo-query row that does not exist.")


@dataclass
class TrainingData:
    """Embeddings and labels a compressor may learn from.

    Unsupervised methods read ``doc_embeddings`` only. Supervised methods read ``triplets``,
    whose rows are ``(query row, positive doc row, negative doc row)`` indices into
    ``query_embeddings`` and ``doc_embeddings``; every method receives the same triplets.

    Attributes:
        query_ids: ids of the rows of ``query_embeddings``.
        query_embeddings: ndarray of shape (n_queries, d), float32.
        doc_ids: ids of the rows of ``doc_embeddings``.
        doc_embeddings: ndarray of shape (n_docs, d), float32 (the whole corpus).
        qrels: ``{query_id: {doc_id: relevance}}`` for these queries.
        triplets: ndarray of shape (n_triplets, 3), int64, or None.
        pseudo_queries: training-only :class:`PseudoQueries`, or None; methods that do not use
            them ignore them, and selection never holds them out.
    """

    query_ids: list[str]
    query_embeddings: np.ndarray
    doc_ids: list[str]
    doc_embeddings: np.ndarray
    qrels: dict[str, dict[str, int]]
    triplets: np.ndarray | None = None
    pseudo_queries: PseudoQueries | None = None

    def __post_init__(self) -> None:
        self.query_embeddings = as_float32_rows(self.query_embeddings, "the query vectors")
        self.doc_embeddings = as_float32_rows(self.doc_embeddings, "the document vectors", self.query_embeddings.shape[1],
                                              expected="the query vectors are {dim}-d: give both from the same model")
        if len(self.query_ids) != len(self.query_embeddings):
            raise ValueError(f"{len(self.query_ids)} query ids for {len(self.query_embeddings)} query embeddings.")
        if len(self.doc_ids) != len(self.doc_embeddings):
            raise ValueError(f"{len(self.doc_ids)} doc ids for {len(self.doc_embeddings)} doc embeddings.")
        if self.triplets is not None:
            triplets = np.asarray(self.triplets, dtype=np.int64)
            if triplets.ndim != 2 or triplets.shape[1] != 3:
                raise ValueError(f"triplets must have shape (n, 3); got {triplets.shape}.")
            if len(triplets) and (
                triplets[:, 0].max() >= len(self.query_ids) or triplets[:, 1:].max() >= len(self.doc_ids) or triplets.min() < 0
            ):
                raise ValueError("triplets index a query or document row that does not exist.")
            self.triplets = triplets
        pseudo = self.pseudo_queries
        if pseudo is not None:
            if pseudo.embeddings.shape[1] != self.doc_embeddings.shape[1]:
                raise ValueError(f"the pseudo-query vectors are {pseudo.embeddings.shape[1]}-d but the document vectors are "
                                 f"{self.doc_embeddings.shape[1]}-d: encode both with the same model.")
            if len(pseudo.triplets) and pseudo.triplets[:, 1:].max() >= len(self.doc_ids):
                raise ValueError("pseudo-query triplets index a document row that does not exist.")

    @classmethod
    def corpus_only(cls, doc_embeddings: Any, doc_ids: list[str] | None = None) -> "TrainingData":
        """Training data with documents only: no queries, no labels (what unsupervised fitting reads).

        ``doc_ids`` defaults to the row numbers as strings.
        """
        docs = as_float32_rows(doc_embeddings, "the document vectors")
        ids = [str(i) for i in range(len(docs))] if doc_ids is None else list(doc_ids)
        return cls([], np.zeros((0, docs.shape[1]), dtype=np.float32), ids, docs, {}, None)

    @property
    def dim(self) -> int:
        return int(self.query_embeddings.shape[1])

    @property
    def has_queries(self) -> bool:
        """Whether any query rows are present (False for :meth:`corpus_only` data)."""
        return len(self.query_ids) > 0

    def require_triplets(self, method: str) -> np.ndarray:
        if self.triplets is None or len(self.triplets) == 0:
            raise ValueError(
                f"{method} is supervised and needs training triplets; build them with "
                "embedtune.data.triplets.mine_triplets(...) and pass TrainingData(triplets=...)."
            )
        return self.triplets


@dataclass
class CompressorConfig:
    """Base for compressor configs. Subclasses add fields with ``metadata={"help": ...}``."""

    dim: int = dataclasses.field(default=128, metadata={"help": "Output dimension k."})
    seed: int = dataclasses.field(default=2027, metadata={"help": "Random seed for init and data order."})

    #: What each field accepts, declared once (:mod:`embedtune.constraints`); a subclass adds its own fields'.
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {"dim": [Interval(int, 1, None)], "seed": [Interval(int, None, None)]}

    def __post_init__(self) -> None:
        validate_constraints(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "CompressorConfig":
        """Unknown keys (saved by another embedtune version) are dropped with a warning."""
        return config_from_dict(cls, values)


C = TypeVar("C", bound="Compressor")


class Compressor(abc.ABC):
    """Abstract estimator: ``fit``, ``transform``, ``save`` and ``load``.

    Subclasses set ``method`` (the registry name) and ``config_class``, implement ``_fit``,
    ``_transform``, ``_state_dict`` and ``_load_state_dict``, and declare their traits below.
    Learned state ends in ``_``.

    Attributes:
        history_ : list of dict, one diagnostics row per training epoch (empty for methods that
            do not train by epochs).
    """

    method: ClassVar[str]
    config_class: ClassVar[type[CompressorConfig]]
    #: Learns from the shared training triplets (they are mined only when some method needs them).
    supervised: ClassVar[bool] = False
    #: Can fit on corpus vectors alone, no queries or labels: ``fit_unsupervised(corpus)``. For a
    #: method that is supervised by default this is its own unsupervised setting (see
    #: :meth:`unsupervised_config`).
    supports_unsupervised: ClassVar[bool] = False
    #: The preset to fit with when there are no labels (None: the one the caller would use anyway).
    unsupervised_preset: ClassVar[str | None] = None
    #: The preset to fit with when there are no labels but the documents' text and their model are at hand, so that
    #: pseudo-queries can be made from the text (None: :attr:`unsupervised_preset` either way). ``compress fit`` falls
    #: back on :attr:`unsupervised_preset`, with a note, where the text gives none.
    unsupervised_text_preset: ClassVar[str | None] = None
    #: The fitted map depends on the seed; False means one run stands for every seed (std 0).
    seed_dependent: ClassVar[bool] = True
    #: Config settings a fit needs, beyond its preset, when the output is wider than half the input
    #: (``2k > d``), e.g. DIVE's heads: ``k``-d heads need ``k * H <= d``, so at ``k > d/2`` one head
    #: fits, and the view loss, which compares two heads, is off. Empty: nothing changes. Read by
    #: ``compress plan``'s sweep; the registry checks that every key is a field of ``config_class``.
    wide_output_settings: ClassVar[Mapping[str, Any]] = {}
    #: A NaN or infinity anywhere in an input row makes that output row non-finite (every output
    #: coordinate is computed from every input coordinate, e.g. a dense matmul). Block transforms
    #: then check only the (much narrower) output and look at the input only when it fails;
    #: ``tests/test_compressor_contract.py`` checks the claim for every method that makes it.
    non_finite_input_reaches_output: ClassVar[bool] = False
    #: One line for ``compress train --help``.
    help: ClassVar[str] = ""
    #: Learning rates of the protocol's validation-only audit (empty: not audited).
    lr_candidates: ClassVar[tuple[float, ...]] = ()
    #: Named recipes for ``--preset`` (see :mod:`embedtune.compress.presets`).
    presets: ClassVar[Mapping[str, Preset]] = {}
    #: The preset used when none is named (None: the config defaults).
    default_preset: ClassVar[str | None] = None

    def __init__(self, config: CompressorConfig | None = None) -> None:
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}; got {type(self.config).__name__}.")
        self.input_dim_: int | None = None
        self.input_normalization_: str | None = None
        self.history_: list[dict[str, Any]] = []

    @classmethod
    def get_preset(cls, name: str | None) -> Preset:
        """The preset ``name`` (None: :attr:`default_preset`, else the config defaults)."""
        from embedtune.compress.presets import Preset

        name = cls.default_preset if name is None else name
        if name is None:
            return Preset("defaults")
        if name not in cls.presets:
            known = ", ".join(sorted(cls.presets)) or "none"
            raise ValueError(f"unknown preset {name!r}: {cls.method} has no preset by that name; its presets: {known}.")
        return cls.presets[name]

    # -- public API -------------------------------------------------------------------------
    def fit(self: C, train: TrainingData, val: TrainingData | None = None, log_path: str | Path | None = None) -> C:
        """Learn the map from ``train`` and return ``self``.

        Args:
            train: embeddings (and triplets, for supervised methods).
            val: held-out queries that methods with epoch selection may score after each epoch.
            log_path: a JSONL file that methods which log per-epoch diagnostics append to;
                methods without such a log ignore it.
        """
        self.input_dim_ = train.dim
        # Fitted on unit rows (cosine: the experiment normalised them), so every deployed path must feed unit rows too.
        self.input_normalization_ = "unit" if _all_unit_rows(train) else None
        try:
            self._fit(train, val)
        except BaseException:
            # A failed fit must not leave an estimator that looks fitted.
            self.input_dim_ = None
            raise
        return self

    def fit_unsupervised(self: C, corpus: Any, log_path: str | Path | None = None) -> C:
        """Learn the map from corpus vectors alone (no queries, no labels) and return ``self``.

        Methods that are supervised by default switch to their unsupervised setting first
        (``self.config`` becomes :meth:`unsupervised_config` of it, so ``save`` records it).

        Args:
            corpus: (n_docs, d) document vectors, or a :class:`TrainingData` (only its
                ``doc_embeddings``, ``doc_ids`` and ``pseudo_queries`` are read: pseudo-queries
                carry no labels, and DIVE can select on them, ``selection_signal='pseudo-queries'``).
            log_path: as in :meth:`fit`.

        Raises:
            ValueError: the method has no unsupervised setting (``supports_unsupervised`` is False).
        """
        if not self.supports_unsupervised:
            raise ValueError(
                f"{self.method} cannot be fitted without labels; it needs training triplets. "
                "Give queries with relevance labels, or pick a method that supports unsupervised fitting: "
                "embedtune.compress.unsupervised_methods()."
            )
        train = corpus if isinstance(corpus, TrainingData) else TrainingData.corpus_only(corpus)
        corpus_only = TrainingData.corpus_only(train.doc_embeddings, train.doc_ids)
        if train.pseudo_queries is not None:  # checked against the documents as a TrainingData's are
            corpus_only = dataclasses.replace(corpus_only, pseudo_queries=train.pseudo_queries)
        train = corpus_only
        self.config = self.unsupervised_config(self.config)
        return self.fit(train, log_path=log_path)

    @classmethod
    def unsupervised_config(cls, config: CompressorConfig) -> CompressorConfig:
        """``config`` set for corpus-only fitting (identity for methods that never read labels)."""
        return config

    @property
    def is_unsupervised(self) -> bool:
        """Whether this estimator, as configured, fits without labels (methods that never read labels: True)."""
        return not self.supervised

    def transform(self, X: Any) -> np.ndarray:
        self._check_fitted()
        X = as_float32_rows(X, "the input vectors", self.input_dim_)
        return self.transform_validated(self.normalize_input(X))

    def normalize_input(self, X: np.ndarray) -> np.ndarray:
        """``X`` as this compressor was fitted on it: unit rows when ``input_normalization_`` is ``"unit"``.

        Rows already unit are kept bit for bit (:func:`embedtune.evaluate.search.unit_rows`), so scoring
        on normalised vectors and deploying on raw ones give the same output.
        """
        if self.input_normalization_ != "unit":
            return X
        return unit_rows(X)

    def state_sha256(self) -> str:
        """sha256 of what the fitted map is (method, input dim and normalisation, config, every weight): equal fits, equal digests."""
        import hashlib

        self._check_fitted()
        digest = hashlib.sha256(sha256_json({"method": self.method, "input_dim": self.input_dim_, "config": self.config.to_dict(),
                                             "input_normalization": self.input_normalization_}).encode())
        for name, value in sorted(self._state_dict().items()):
            array = np.ascontiguousarray(value)
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def transform_bytes(self) -> int:
        """Bytes of the weights the fitted map is served with, held once beside the index like a codec's tables.

        The float32 weights, biases and residual projections of :meth:`export_layers` (what an exported model holds); a
        compressor without export layers counts the arrays it saves. A map that only selects or normalises (truncation,
        frozen) overrides this with 0. ``compress plan`` adds it to a setting's tables when it counts them
        (``--count-tables``), so a PCA or DIVE map in front of a codec weighs as a codec's own rotation does.
        """
        self._check_fitted()
        layers = self.export_layers()
        if layers is None:
            return int(sum(np.asarray(value).nbytes for value in self._state_dict().values()))
        return int(sum(4 * np.size(array) for layer in layers for array in
                       (getattr(layer, "weight", None), getattr(layer, "bias", None), getattr(layer, "residual", None))
                       if array is not None))

    def transform_validated(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`transform` of rows the caller has already validated, optionally into ``out``.

        ``X`` must be a C-contiguous float32 ``(n, input_dim_)`` array of finite values (what
        :func:`as_float32_rows` returns); streaming applies check each block once and call this
        per tile, so the input is not scanned twice and no output array is allocated per tile.
        """
        result = self._transform(X)
        # Finite input, non-finite output: the weights themselves are damaged or diverged.
        check_finite(result, f"{type(self).__name__}.transform", "output", fix=_OUTPUT_FIX)
        return l2_normalize(result, out=out)

    def torch_module(self) -> "torch.nn.Module":
        """The fitted transform as a torch module (for export); methods that can, override this."""
        raise NotImplementedError(f"{type(self).__name__} has no torch_module() yet, so it cannot be exported as a torch module.")

    def export_layers(self) -> "list[ExportLayer] | None":
        """The fitted :meth:`transform` as plain ``Dense``/``Normalize`` layers, or None when it has none.

        :func:`embedtune.compress.st_export.export_sentence_transformer` writes them as
        sentence-transformers' built-in modules, so the exported model loads without
        ``trust_remote_code`` (see :mod:`embedtune.compress.export_layers`).
        """
        return None

    def sentence_transformer_modules(self, input_is_normalized: bool) -> "list[torch.nn.Module] | None":
        """Custom sentence-transformers modules for the fitted transform, or None (the default).

        Export tries this first, then :meth:`export_layers`, then wraps :meth:`torch_module`
        (which needs ``trust_remote_code``). ``input_is_normalized``: the base model already
        ends with ``Normalize``.
        """
        return None

    def fit_details(self) -> dict[str, Any]:
        """Fitted facts a run record should keep beside its metrics (e.g. DIVE's resolved heads)."""
        return {}

    def fit_rows(self, n_docs: int, dim: int) -> np.ndarray | None:
        """The corpus rows an unsupervised fit on ``n_docs`` × ``dim`` documents reads (ascending), or None for every row.

        A method that fits on a sample (PCA) names it here, so a caller holding a large corpus on
        disk can read those rows alone: a fit on exactly them gives the same transform (the rule
        applied to the sample keeps every row of it).
        """
        return None

    def fit_transform(self, train: TrainingData, X: Any) -> np.ndarray:
        return self.fit(train).transform(X)

    @property
    def output_dim(self) -> int:
        return self.config.dim

    def save(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` and ``config.json`` to ``directory``.

        ``config.json`` records the sha256 of the weights file (``weights_sha256``) and of its own
        content, so :meth:`load` detects a damaged file before using it. Equal fits give
        byte-identical files.
        """
        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {key: np.ascontiguousarray(value) for key, value in self._state_dict().items()}
        weights = save_weights(directory / WEIGHTS_NAME, state, metadata={"method": self.method, "embedtune_version": __version__})
        write_json_with_digest(
            directory / CONFIG_NAME,
            {
                "method": self.method,
                "embedtune_version": __version__,
                "input_dim": self.input_dim_,
                "input_normalization": self.input_normalization_,
                "config": self.config.to_dict(),
                "weights_sha256": sha256_file(weights),
            },
        )
        return directory

    @classmethod
    def load(cls: type[C], directory: str | Path) -> C:
        """Load a compressor saved by :meth:`save`, after checking its files' digests.

        A damaged ``config.json`` or ``model.safetensors`` raises an error naming the file and
        both digests; a folder saved before digests were recorded loads with a note.
        """
        directory = Path(directory)
        meta, verified = _read_meta(directory)
        check_version_stamp(meta.get("embedtune_version"), str(directory / CONFIG_NAME))
        if cls is not Compressor and meta["method"] != cls.method:
            raise ValueError(
                f"{directory / CONFIG_NAME}: field 'method' is {meta['method']!r} but {cls.__name__} loads "
                f"{cls.method!r}. Use embedtune.compress.load_compressor(dir) to load any method."
            )
        if isinstance(meta.get("weights_sha256"), str):
            verify_sha256(directory / WEIGHTS_NAME, meta["weights_sha256"], REFIT_HINT)
        elif verified:  # a verified config always names its weights' digest
            raise IntegrityError(f"{directory / CONFIG_NAME}: field 'weights_sha256' is missing or damaged. {REFIT_HINT}")
        elif older_than_installed(meta.get("embedtune_version")):
            logger.info("%s: saved without integrity digests (by embedtune %s), so its files are loaded unchecked; "
                        "save it again to add them", directory, meta.get("embedtune_version"))
        else:  # this version always writes both: removed digests are damage, not age
            raise IntegrityError(f"{directory / CONFIG_NAME}: fields 'weights_sha256' and {'content_sha256'!r} are missing, which "
                                 f"embedtune {meta.get('embedtune_version', '(no version stamp)')} always writes; the file was "
                                 f"edited or damaged. {REFIT_HINT}")
        where = directory / CONFIG_NAME
        normalization = meta.get("input_normalization")
        if normalization not in INPUT_NORMALIZATIONS:
            raise IntegrityError(f"{where}: field 'input_normalization' is {normalization!r}; expected one of "
                             f"{list(INPUT_NORMALIZATIONS)}. {REFIT_HINT}")
        if not isinstance(meta["config"], dict):
            raise IntegrityError(f"{where}: field 'config' must be a JSON object; got {type(meta['config']).__name__}. {REFIT_HINT}")
        input_dim = meta["input_dim"]
        if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
            raise IntegrityError(f"{where}: field 'input_dim' must be a positive integer; got {input_dim!r}. {REFIT_HINT}")
        try:
            config = cls.config_class.from_dict(meta["config"])
        except (TypeError, ValueError) as error:
            # A value the config refuses in a file whose digest holds: edited by hand, or from another version.
            raise IntegrityError(f"{where}: field 'config' does not make a {cls.config_class.__name__} ({error}). {REFIT_HINT}") from error
        estimator = cls(config)
        estimator.input_dim_ = input_dim
        estimator.input_normalization_ = normalization
        tensors = load_weights(directory / WEIGHTS_NAME, as_numpy=True)  # numpy: loading a PCA does not import torch
        try:
            estimator._load_state_dict(dict(tensors))
        except (KeyError, ValueError, RuntimeError) as error:
            raise IntegrityError(
                f"{directory / WEIGHTS_NAME}: weights do not match a {cls.method} compressor ({error}). "
                "The file is corrupted or from another method; re-create it with `save(dir)`."
            ) from error
        return estimator

    # -- subclass hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def _fit(self, train: TrainingData, val: TrainingData | None) -> None: ...

    @abc.abstractmethod
    def _transform(self, X: np.ndarray) -> np.ndarray:
        """Map validated float32 (n, d) input to (n, k); normalisation happens afterwards."""

    @abc.abstractmethod
    def _state_dict(self) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...

    def _check_fitted(self) -> None:
        if self.input_dim_ is None:
            raise RuntimeError(f"This {type(self).__name__} is not fitted yet; call fit(train) first.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


def _all_unit_rows(train: TrainingData) -> bool:
    """Whether every document and query row of ``train`` has unit L2 norm (zero rows allowed: normalising keeps them zero)."""
    for rows in (train.doc_embeddings, train.query_embeddings):
        if known(rows, "unit") or known(rows, "unit or zero"):  # a read-only corpus checked before (array_facts)
            continue
        for start in range(0, len(rows), 65536):
            block = rows[start : start + 65536]
            norms = np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64))
            if np.any((np.abs(norms - 1.0) > _UNIT_TOLERANCE) & (norms > 0)):
                return False
        remember(rows, "unit or zero")
    return len(train.doc_embeddings) + len(train.query_embeddings) > 0


REFIT_HINT = "Re-create it: re-train the adapter (`embedtune compress train`) or re-export it, or restore it from a copy."


def _read_meta(directory: Path) -> tuple[dict[str, Any], bool]:
    """``(config.json of a saved compressor, whether it carried a content digest)``."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no compressor config here. Pass a folder written by `save(dir)`.")
    meta, verified = read_json_verified(path, REFIT_HINT)
    for field in ("method", "config", "input_dim"):
        if field not in meta:
            raise ValueError(f"{path}: missing field {field!r}; this is not an embedtune compressor config.")
    return meta, verified


def read_compressor_meta(directory: Path) -> dict[str, Any]:
    """The ``config.json`` of a saved compressor, its content digest checked (when it has one)."""
    return _read_meta(directory)[0]


def check_output_dim(method: str, dim: int, input_dim: int, strict: bool = False) -> None:
    """Raise if the output dimension ``dim`` cannot be cut from ``input_dim``-d input."""
    if dim > input_dim or (strict and dim == input_dim):
        relation = "smaller than" if strict else "at most"
        raise ValueError(f"{method}: dim={dim} must be {relation} the input dimension {input_dim}.")
