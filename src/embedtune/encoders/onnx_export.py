"""Export a sentence-transformers model's transformer to ONNX once, and keep the graph in the user cache.

Only the transformer (module 0) is exported: token ids in, token embeddings out. Tokenisation,
pooling, the model's other modules and normalisation stay in sentence-transformers
(:mod:`embedtune.encoders.onnx_backend`), so they follow the model's own configuration.

Each graph is a cache entry under ``<cache root>/onnx/<key[:2]>/<key>/`` holding ``model.onnx``
and ``meta.json`` (with its own digest and the graph's sha256). The key covers the model folder's
fingerprint (the same file hash the embedding cache keys vectors by), the precision and the
versions of the exporter, the optimiser and the quantiser. An entry is built in a temporary
folder beside it and renamed into place only when complete, so a failed or interrupted export
leaves nothing that a later run could mistake for a graph. One process at a time builds an entry
(the embedding cache's ``flock``), so Ray actors starting together export once.

The fp32 graph is checked against the model's own forward pass on probe texts before it is
kept: ONNX Runtime's transformer fusions (attention, LayerNorm, GELU; about 1.5x faster on a
CPU) are used only when the fused graph matches, else the plain export is kept. The int8 graph
is ``onnxruntime.quantization.quantize_dynamic`` of the fp32 one (int8 weights, per output
channel; activations quantised at run time).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embedtune.encoders.cache import EmbeddingCache, cache_key
from embedtune.encoders.paths import cache_root
from embedtune.errors import EmbedtuneError
from embedtune.io import IntegrityError, current_umask, read_json_verified, sha256_file, write_json_with_digest
from embedtune.locks import touch

logger = logging.getLogger(__name__)

__all__ = ["ONNX_INSTALL_HINT", "OnnxExportError", "OnnxGraph", "Precision", "exported_graph", "graph_key_parts", "onnx_cache_root",
           "require_onnxruntime", "load_sentence_transformer"]

Precision = Literal["fp32", "int8"]
ONNX_INSTALL_HINT = 'pip install "embedtune[onnx]" (onnxruntime and onnx)'
# Bumped when the graph's inputs, outputs or build steps change, so older entries are not reused.
GRAPH_FORMAT = 1
OPSET = 17
# The inputs a text transformer's forward may take from sentence-transformers' preprocessing.
_GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Features sentence-transformers' preprocessing adds for its own bookkeeping, not for the model.
_BOOKKEEPING = {"modality", "prompt_length", "task"}
# Two texts of different lengths, so that the check covers padding and the attention mask.
PROBE_TEXTS = ("ONNX check.", "A longer probe text, so that one row of the batch is padded and the attention mask matters here.")
# transformers model_type -> onnxruntime.transformers optimizer model_type (fusions for that family).
_FUSION_FAMILIES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert", "mpnet": "bert", "electra": "bert"}
_ENTRY_FILES = ("model.onnx", "meta.json")
#: The int8 graph must keep every probe text's embedding this close (cosine) to the fp32 graph's. MiniLM's int8
#: graph keeps about 0.98-0.99 on real sentences; a broken quantisation scores near 0.
MIN_INT8_COSINE = 0.95
#: int8 recipes, tried in order until one passes the probe check. The first is ONNX Runtime's usual
#: dynamic quantisation (MiniLM keeps cosine 0.98-0.99 with it). all-mpnet-base-v2 lost the model with
#: it on this project's x86 CPU (cosine about 0, likely int16 saturation of u8 x s8 products on large
#: activations); 7-bit weights (reduce_range) with the FFN output projections kept in fp32 gave it
#: 0.978 on the probe texts (benchmarks/RESULTS.md, "int8 recipes for mpnet").
INT8_RECIPES: tuple[dict[str, Any], ...] = (
    {"name": "per-channel", "reduce_range": False, "down_projections_fp32": False},
    {"name": "per-channel, 7-bit weights, FFN output projections in fp32", "reduce_range": True, "down_projections_fp32": True},
)


class OnnxExportError(EmbedtuneError):
    """A model cannot run on the ONNX backend (its architecture does not export, or the graph disagrees)."""


def require_onnxruntime() -> Any:
    """``onnxruntime``, or an :class:`EmbedtuneError` saying how to install the extra."""
    try:
        import onnxruntime
    except ImportError:
        raise EmbedtuneError(f"--backend onnx and onnx-int8 need onnxruntime: {ONNX_INSTALL_HINT}; or use --backend torch.") from None
    return onnxruntime


def onnx_cache_root() -> Path:
    return cache_root() / "onnx"


def load_sentence_transformer(model_path: str, weights: bool = True, **model_kwargs: Any) -> Any:
    """The model folder as a :class:`SentenceTransformer` on the CPU; ``weights=False`` leaves the transformer's on the meta device.

    Without weights it still tokenises, pools and normalises exactly as the model does, at a
    fraction of the memory (the ONNX graph holds the weights).
    """
    from sentence_transformers import SentenceTransformer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not weights:
        # transformers >= 5.25 kernelizes every model it loads by default, and its kernel mapping refuses the
        # meta device; a weightless copy has nothing to run anyway.
        model_kwargs = {**model_kwargs, "device_map": "meta", "use_kernels": False}
        return SentenceTransformer(str(model_path), local_files_only=True, model_kwargs=model_kwargs)
    return SentenceTransformer(str(model_path), device="cpu", local_files_only=True, model_kwargs=model_kwargs or None)


def graph_key_parts(fingerprint: str, precision: Precision) -> dict[str, Any]:
    """What an exported graph depends on: the model's files, the precision and the tool versions."""
    import torch

    onnxruntime = require_onnxruntime()
    return {"format": GRAPH_FORMAT, "model_sha256": fingerprint, "precision": precision, "opset": OPSET,
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__}


class OnnxGraph:
    """A complete cache entry: ``path`` (``model.onnx``) and ``meta`` (inputs, output, checks, versions)."""

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        self.folder, self.meta = folder, meta

    @property
    def path(self) -> Path:
        return self.folder / "model.onnx"

    @property
    def input_names(self) -> list[str]:
        return list(self.meta["input_names"])


def _load_entry(folder: Path, key: str) -> OnnxGraph | None:
    """The entry at ``folder`` after its checks, or None (missing; a bad one is removed)."""
    if not (folder / "meta.json").is_file():
        return None
    try:
        meta, _ = read_json_verified(folder / "meta.json", "The graph is exported again.", require_digest=True)
        if meta.get("key") != key:
            raise IntegrityError("meta.json key does not match its folder")
        if sha256_file(folder / "model.onnx") != meta.get("sha256"):
            raise IntegrityError("model.onnx checksum mismatch")
    except (OSError, ValueError, KeyError) as error:
        logger.warning("ONNX graph cache entry %s is not usable (%s); exporting it again", folder, error)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return OnnxGraph(folder, meta)


def exported_graph(model_path: str, fingerprint: str, precision: Precision, model_name: str | None = None,
                   root: str | Path | None = None) -> OnnxGraph:
    """The cached ONNX graph of ``model_path`` at ``precision``, exported (and checked) on a miss.

    Raises:
        OnnxExportError: the architecture does not export, or its graph does not match the model.
        EmbedtuneError: onnxruntime or onnx is not installed.
    """
    if precision not in ("fp32", "int8"):
        raise ValueError(f"precision must be 'fp32' or 'int8'; got {precision!r}.")
    root = Path(root) if root is not None else onnx_cache_root()
    parts = graph_key_parts(fingerprint, precision)
    key = cache_key(parts)
    store = EmbeddingCache(root, use_bundled=False)  # only for its entry layout and its lock
    folder = store.entry(key)
    graph = _load_entry(folder, key)
    if graph is not None and precision == "int8" and "check" not in graph.meta:
        # Built before int8 graphs were checked against their fp32 source: build it again, with the check.
        shutil.rmtree(folder, ignore_errors=True)
        graph = None
    if graph is not None:
        touch(folder)  # its last use, for `embedtune cache prune --older-than`
        return graph
    source = None
    if precision == "int8":  # quantised from the checked fp32 graph, which is cached too
        source = exported_graph(model_path, fingerprint, "fp32", model_name, root)
    with store.lock(key):
        graph = _load_entry(folder, key)  # another process may have built it meanwhile
        if graph is not None:
            return graph
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.partial-", dir=folder.parent))
        os.chmod(scratch, 0o777 & ~current_umask())  # mkdtemp makes it 0700; the entry gets the usual mode
        try:
            start = time.perf_counter()
            if source is None:
                meta = build_fp32_graph(model_path, scratch, model_name or str(model_path))
            else:
                meta = build_int8_graph(source, scratch, model_path, model_name)
            meta.update({"key": key, "parts": parts, "model": model_name or str(model_path), "sha256": sha256_file(scratch / "model.onnx"),
                         "export_seconds": round(time.perf_counter() - start, 2)})
            for stray in set(os.listdir(scratch)) - set(_ENTRY_FILES):
                (scratch / stray).unlink()
            write_json_with_digest(scratch / "meta.json", meta)
            if folder.exists():  # a leftover without a valid meta.json (removed by _load_entry, or a foreign folder)
                shutil.rmtree(folder)
            os.replace(scratch, folder)
            logger.info("exported %s to ONNX (%s) in %.1fs: %s", model_name or model_path, precision, meta["export_seconds"], folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    graph = _load_entry(folder, key)
    if graph is None:  # pragma: no cover - just written and checked
        raise OnnxExportError(f"the ONNX graph of {model_name or model_path} was written to {folder} but does not load back.")
    return graph


def _token_embeddings_module(model: Any, model_name: str) -> Any:
    """Module 0 of ``model`` when it is a text transformer that returns token embeddings, else a clear error."""
    first = model[0]
    if type(first).__name__ != "Transformer" or not hasattr(first, "model") or getattr(first, "module_output_name", "token_embeddings") != "token_embeddings":
        raise OnnxExportError(f"model {model_name}: its first module is {type(first).__name__}, not a text Transformer that returns token "
                              "embeddings, so the ONNX backend cannot export it. Use --backend torch.")
    return first


def build_fp32_graph(model_path: str, out: Path, model_name: str) -> dict[str, Any]:
    """Export module 0 of the model at ``model_path`` to ``out/model.onnx`` and check it; returns the entry's meta.

    Attention is exported in its eager form: it traces to plain MatMul/Softmax, which ONNX
    Runtime's fusions recognise (the SDPA form exports too, unfused and slower).
    """
    import torch

    onnxruntime = require_onnxruntime()
    try:
        import onnx  # noqa: F401  (the optimiser and the quantiser need it)
    except ImportError:
        raise EmbedtuneError(f"--backend onnx needs the onnx package: {ONNX_INSTALL_HINT}.") from None
    try:
        model = load_sentence_transformer(model_path, attn_implementation="eager")
    except (ValueError, TypeError):  # an architecture without an eager attention: its default one
        model = load_sentence_transformer(model_path)
    transformer = _token_embeddings_module(model, model_name)
    features = model.preprocess(list(PROBE_TEXTS))
    extra = sorted(k for k in features if k not in _GRAPH_INPUTS and k not in _BOOKKEEPING)
    if extra:
        raise OnnxExportError(f"model {model_name}: its preprocessing gives {extra}, inputs the ONNX backend does not export "
                              "(it handles text transformers taking input_ids, attention_mask and token_type_ids). Use --backend torch.")
    names = [k for k in _GRAPH_INPUTS if k in features]

    class TokenEmbeddings(torch.nn.Module):
        """Positional inputs for the tracer; the model's own forward (module 0 of the s-t model)."""

        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.transformer(dict(zip(names, tensors)))["token_embeddings"]

    wrapper = TokenEmbeddings().eval()
    inputs = tuple(features[k] for k in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "token_embeddings"]}
    raw = out / "raw.onnx"
    try:
        with torch.inference_mode():
            reference = wrapper(*inputs).float().numpy()
        # The tracer warns about every shape-dependent Python branch of the modelling code; what
        # matters is whether the graph computes the same thing, which is checked below on padded input.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, inputs, str(raw), input_names=names, output_names=["token_embeddings"], dynamic_axes=axes,
                              opset_version=OPSET, dynamo=False)
    except Exception as error:  # any exporter failure is the architecture's: say so, with the way out
        raise OnnxExportError(f"model {model_name} does not export to ONNX ({type(error).__name__}: {str(error).splitlines()[0][:300]}). "
                              "Use --backend torch.") from error
    feeds = {k: features[k].numpy() for k in names}
    scale = max(1.0, float(np.abs(reference).max()))
    tolerance = 1e-4 * scale  # fp32 reordering; a wrong graph is off by orders more
    raw_diff = _max_abs_diff(onnxruntime, raw, feeds, reference)
    if not raw_diff <= tolerance:
        raise OnnxExportError(f"model {model_name}: its ONNX graph gives token embeddings up to {raw_diff:.3g} away from the model's own "
                              f"(tolerance {tolerance:.3g}), so the export is not used. Use --backend torch.")
    config = transformer.model.config
    family = _FUSION_FAMILIES.get(getattr(config, "model_type", ""))
    fused, fused_diff = False, None
    if family is not None:
        try:
            from onnxruntime.transformers import optimizer

            optimized = optimizer.optimize_model(str(raw), model_type=family, num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
                                                 hidden_size=int(getattr(config, "hidden_size", 0) or 0))
            optimized.save_model_to_file(str(out / "fused.onnx"))
            fused_diff = _max_abs_diff(onnxruntime, out / "fused.onnx", feeds, reference)
            fused = fused_diff <= tolerance
            if not fused:
                logger.info("ONNX fusions for %s change its output by %.3g; keeping the unfused graph", model_name, fused_diff)
        except Exception as error:  # the fusions are an optimisation: without them the plain graph serves
            logger.info("ONNX fusions for %s failed (%s); keeping the unfused graph", model_name, error)
    os.replace(out / "fused.onnx" if fused else raw, out / "model.onnx")
    return {"input_names": names, "output_name": "token_embeddings", "precision": "fp32", "fused": fused,
            "check": {"probe_texts": list(PROBE_TEXTS), "max_abs_diff_token_embeddings": float(fused_diff if fused else raw_diff),
                      "tolerance": tolerance}}


def build_int8_graph(source: OnnxGraph, out: Path, model_path: str, model_name: str | None = None) -> dict[str, Any]:
    """Dynamic int8 quantisation of the fp32 graph ``source`` into ``out/model.onnx``, checked against ``source``.

    The check embeds the probe texts (tokenised by the model at ``model_path``) with both graphs (masked mean of the token
    embeddings) and keeps the graph of the first of :data:`INT8_RECIPES` whose smallest cosine is at least
    :data:`MIN_INT8_COSINE`; when none is, it refuses: on some models and CPUs dynamic int8 loses the model
    entirely (all-mpnet-base-v2 on this project's x86 VM gave cosines near 0 with the usual recipe), and
    nothing downstream would notice. Every recipe tried and its cosine are recorded in the entry's meta.
    """
    require_onnxruntime()
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The fused ops (Attention, SkipLayerNormalization) are in the com.microsoft domain, where ONNX
    # shape inference cannot type their outputs: DefaultTensorType says they are float.
    # The quantiser logs a line per tensor (and a pre-processing hint) on the root logger: hidden while it runs.
    tried = []
    for recipe in INT8_RECIPES:
        options: dict[str, Any] = {"weight_type": QuantType.QInt8, "per_channel": True, "reduce_range": recipe["reduce_range"],
                                   "extra_options": {"DefaultTensorType": onnx.TensorProto.FLOAT}}
        if recipe["down_projections_fp32"]:
            options["nodes_to_exclude"] = down_projection_matmuls(onnx.load(str(source.path), load_external_data=False))
        saved = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(str(source.path), str(out / "model.onnx"), **options)
        finally:
            logging.disable(saved)
        cosine = _int8_probe_cosine(source, out / "model.onnx", model_path)
        tried.append({"recipe": recipe["name"], "min_cosine_with_fp32": cosine, "fp32_nodes": len(options.get("nodes_to_exclude", []))})
        if cosine >= MIN_INT8_COSINE:
            break
    else:
        found = "; ".join(f"{t['recipe']}: {t['min_cosine_with_fp32']:.3f}" for t in tried)
        raise OnnxExportError(f"model {model_name or model_path}: its int8 graphs give embeddings far from the fp32 graph's on the probe "
                              f"texts (smallest cosine per recipe: {found}; at least {MIN_INT8_COSINE} expected), so no int8 graph is "
                              "used. Use --backend onnx (fp32) or --backend torch.")
    meta = {"input_names": source.input_names, "output_name": source.meta["output_name"], "precision": "int8",
            "fused": source.meta.get("fused", False), "quantized_from": source.meta["sha256"],
            "quantization": {"method": "quantize_dynamic", "weight_type": "QInt8", "per_channel": True, "recipe": recipe["name"],
                             "reduce_range": recipe["reduce_range"], "fp32_nodes": tried[-1]["fp32_nodes"]}}
    meta["check"] = {"probe_texts": list(PROBE_TEXTS), "min_cosine_with_fp32": cosine, "threshold": MIN_INT8_COSINE, "recipes_tried": tried}
    return meta


def down_projection_matmuls(model: Any) -> list[str]:
    """Names of the MatMul nodes whose constant weight maps a wider input to a narrower output (the FFN output projections)."""
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in shapes:
            dims = shapes[node.input[1]]
            if len(dims) == 2 and dims[0] > dims[1]:
                names.append(node.name)
    return names


def _int8_probe_cosine(source: OnnxGraph, int8_path: Path, model_path: str) -> float:
    """The smallest cosine, over the probe texts, between the masked-mean token embeddings of the two graphs."""
    onnxruntime = require_onnxruntime()
    features = load_sentence_transformer(model_path, weights=False).preprocess(list(PROBE_TEXTS))
    feeds = {name: features[name].numpy() for name in source.input_names}
    mask = feeds["attention_mask"][..., None].astype(np.float32) if "attention_mask" in feeds else 1.0
    pooled = []
    for path in (source.path, int8_path):
        session = onnxruntime.InferenceSession(str(path), session_options(onnxruntime, 1), providers=["CPUExecutionProvider"])
        tokens = session.run(None, feeds)[0].astype(np.float32)
        vectors = (tokens * mask).sum(1) / np.maximum(np.asarray(mask).sum(1), 1.0)
        pooled.append(vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12))
    return float((pooled[0] * pooled[1]).sum(1).min())


def session_options(onnxruntime: Any, threads: int) -> Any:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, int(threads))
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def _max_abs_diff(onnxruntime: Any, path: Path, feeds: dict[str, np.ndarray], reference: np.ndarray) -> float:
    session = onnxruntime.InferenceSession(str(path), session_options(onnxruntime, 1), providers=["CPUExecutionProvider"])
    output = session.run(None, feeds)[0]
    if output.shape != reference.shape:
        return float("inf")
    return float(np.abs(output.astype(np.float32) - reference).max())
