"""A deploy bundle of a plan: its model, its FAISS factory string and ready configurations for LanceDB, Qdrant, pgvector and Milvus.

``embedtune index deploy --plan PLAN --out BUNDLE`` (:func:`write_deploy_bundle`) writes::

    BUNDLE/
      deploy.json        everything below as data: the FAISS recipe, each store's configuration,
                         the precision → store settings table with notes, and the bytes table
      faiss_factory.txt  the index_factory string (a registered codec: load the plan's codec.faiss)
      lancedb.json       the LanceDB recipe (embedtune.index.lancedb_store loads and searches by it)
      qdrant.json        the Qdrant collection (create_collection body) and search parameters
      pgvector.sql       CREATE EXTENSION, the table, its inner-product index and the top-k query
      milvus.json        the Milvus schema, index and search parameters (and what Milvus Lite takes)
      README.md          how to load each, and the bytes table
      model/             the sentence-transformers model with the plan's compressor and precision
                         (``compress export --plan``), when the plan names its model or ``model`` is given

Every file is written atomically inside ``--out``; nothing is written elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedtune.encoders import resolve_model_path
from embedtune.index.codecs import Precision
from embedtune.index.deployment import faiss_recipe, lancedb_recipe
from embedtune.index.plan_export import export_plan
from embedtune.index.plan_format import load_plan
from embedtune.index.store_configs import STORE_SETTINGS, milvus_config, pgvector_sql, precision_kind, qdrant_config, store_settings
from embedtune.io import atomic_write_bytes, atomic_write_json
from embedtune.outputs import finish_output_dir, prepare_output_dir

__all__ = ["write_deploy_bundle", "bytes_table", "DEPLOY_FILE", "DEPLOY_COMMAND", "MODEL_SUBFOLDER"]

DEPLOY_FILE = "deploy.json"
DEPLOY_COMMAND = "index deploy"
MODEL_SUBFOLDER = "model"
_PRECOMPUTED = "precomputed"
_GB = 10**9


def bytes_table(plan: dict[str, Any], precision: Precision, dim: int, input_dim: int) -> dict[str, Any]:
    """Bytes per vector (and share of the model's float32 vectors), scores (and share of float32) and vectors per GB (10^9 bytes).

    Scores are the plan's own: the chosen setting and the float32 reference on the queries the plan
    chose on (``validation``), and the test scores (all and unseen queries) where the plan was
    written with ``--final``; a share of float32 only where the plan has both.
    """
    float32_bytes = 4 * input_dim
    ram, disk = precision.ram_bytes(dim), precision.disk_bytes(dim)
    table: dict[str, Any] = {"bytes_per_vector": ram, "disk_bytes_per_vector": disk, "float32_bytes_per_vector": float32_bytes,
                             "share_of_float32": ram / float32_bytes, "vectors_per_gb": _GB // ram, "float32_vectors_per_gb": _GB // float32_bytes,
                             "scores": []}
    chosen, reference = plan.get("chosen") or {}, plan.get("reference") or {}
    for metric in ("ndcg@10", "recall@10"):
        if metric in chosen:
            ref = reference.get(metric)
            table["scores"].append({"queries": f"{chosen.get('queries', 'val')} ({(plan.get('validation') or {}).get('rule', 'as chosen')})",
                                    "metric": metric, "score": chosen[metric], "float32": ref,
                                    "share_of_float32": chosen[metric] / ref if ref else None})
    test = plan.get("test") or {}
    for name, scores in [("test, all", test), *((f"test, {k}", v) for k, v in (test.get("subsets") or {}).items())]:
        if isinstance(scores, dict) and "ndcg@10" in scores:
            table["scores"].append({"queries": name, "metric": "ndcg@10", "score": scores["ndcg@10"], "float32": None, "share_of_float32": None})
    return table


def write_deploy_bundle(plan: str | Path, out: str | Path, model: str | Path | None = None, include_model: bool = True,
                        overwrite: bool = False, top_k: int = 10) -> dict[str, Any]:
    """Write the deploy bundle of ``plan`` into ``out`` (see the module docstring) and return ``deploy.json``'s content.

    Args:
        plan: a plan folder (``compress plan --out``), checked first.
        out: the bundle folder; it must not exist or be empty unless ``overwrite``.
        model: the base model to export with the compressor (a name or path); default: the model the
            plan was made with, when it names one (a plan made from precomputed vectors does not).
        include_model: ``False`` writes the store configurations alone.
        overwrite: replace what an earlier embedtune run wrote in ``out``.
        top_k: the ``limit`` the search settings are sized for.
    """
    plan = Path(plan)
    info, compressor, precision, _ = load_plan(plan)
    dim, input_dim = compressor.output_dim, compressor.input_dim_
    if model is None and include_model and info.get("model") not in (None, _PRECOMPUTED):
        model = info["model"]
    out = prepare_output_dir(out, overwrite, inputs=[plan, *([model] if model and Path(str(model)).exists() else [])],
                             command=DEPLOY_COMMAND)
    lancedb = dict((info.get("deployment") or {}).get("lancedb") or lancedb_recipe(precision, dim, top_k))
    faiss = faiss_recipe(precision)
    configs = {"lancedb": lancedb, "qdrant": qdrant_config(precision, dim, top_k), "milvus": milvus_config(precision, dim, top_k)}
    settings = store_settings(precision)
    settings["lancedb"] = {"setting": f"{lancedb['vector_type']}, {lancedb['distance']}, index {(lancedb.get('index') or {}).get('index_type', 'none')}",
                           "note": "" if lancedb.get("exact") else lancedb.get("note", "")}
    deploy = {
        "plan": str(plan), "setting": (info.get("chosen") or {}).get("setting"), "precision": precision.to_dict(), "dim": dim,
        "input_dim": input_dim, "kind": precision_kind(precision), "model": str(model) if model and include_model else None,
        "similarity": "inner product on the compressed vectors (the plan's compressor output)",
        "faiss": faiss, "stores": settings, "bytes": bytes_table(info, precision, dim, input_dim),
        # A +refine<N> plan: the stores below serve its codes; the rescoring with the original vectors is the client's.
        **({"refine": (info.get("deployment") or {}).get("refine") or info["refine"]} if info.get("refine") else {}),
        "settings_table": {kind: {store: {"setting": s, "note": n} for store, (s, n) in row.items()} for kind, row in STORE_SETTINGS.items()},
        "files": {"faiss": "faiss_factory.txt", "lancedb": "lancedb.json", "qdrant": "qdrant.json", "pgvector": "pgvector.sql",
                  "milvus": "milvus.json", "readme": "README.md", "deploy": DEPLOY_FILE, **({"model": MODEL_SUBFOLDER} if model and include_model else {})},
    }
    try:
        if model and include_model:
            export_plan(plan, resolve_model_path(model), out / MODEL_SUBFOLDER)
        atomic_write_bytes(out / "faiss_factory.txt", (faiss["factory"] + "\n").encode())
        for store, config in configs.items():
            atomic_write_json(out / f"{store}.json", config)
        atomic_write_bytes(out / "pgvector.sql", pgvector_sql(precision, dim, top_k=top_k).encode())
        atomic_write_bytes(out / "README.md", _readme(deploy, configs).encode())
        atomic_write_json(out / DEPLOY_FILE, deploy)
    except BaseException:
        finish_output_dir(out, DEPLOY_COMMAND, failed=True)
        raise
    finish_output_dir(out, DEPLOY_COMMAND)
    return deploy


def _refine_note(deploy: dict[str, Any]) -> str:
    """The README's line for a ``+refine<N>`` plan: the stores serve the codes, the client rescores with the original vectors."""
    refine = deploy.get("refine")
    if not refine:
        return ""
    return (f"\n\nThe plan rescores each query's top {refine['candidates']} with the model's original {deploy['input_dim']}-d float32 "
            "vectors (`embedtune index build --plan` keeps them as `original_vectors.npy`); none of the stores below does that "
            "itself: fetch the top candidates, then rescore them with the original vectors in the client.")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _number(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def _readme(deploy: dict[str, Any], configs: dict[str, Any]) -> str:
    b, dim = deploy["bytes"], deploy["dim"]
    name = deploy["precision"]["name"]
    rows = "\n".join(f"| {s['queries']} | {s['metric']} | {s['score']:.4f} | {_number(s['float32'])} | {_pct(s['share_of_float32'])} |"
                     for s in b["scores"])
    stores = "\n".join(f"| {store} | {v['setting']} | {v['note'] or 'same as the plan'} |" for store, v in deploy["stores"].items())
    model = (f"`{deploy['files']['model']}/` is the sentence-transformers model with the compressor; it outputs the {dim}-d vectors "
             "every store below takes:\n\n```python\nfrom sentence_transformers import SentenceTransformer\n"
             "from embedtune.index.codecs import DeployedCodec\n\nmodel = SentenceTransformer(\"model\")\n"
             "vectors = model.encode(texts)                       # float32, what every store below stores\n"
             "codes = DeployedCodec.load(\"model\").encode(vectors)  # the plan's own codes (FAISS)\n```\n"
             if deploy["model"] else
             "No model in this bundle (the plan was made from precomputed vectors, or `--no-model`): pass your vectors through the "
             "plan's compressor (`embedtune compress apply`) before loading them.\n")
    return f"""# Deploy bundle: {deploy['setting'] or name}

Precision `{name}` on {dim}-d vectors (the model outputs {deploy['input_dim']}-d). All stores score by inner product
on the compressed vectors. `deploy.json` holds everything below as data.{_refine_note(deploy)}

## Bytes

| | per vector | share of float32 | vectors per GB (10^9 B) |
|---|---|---|---|
| this plan (in RAM) | {b['bytes_per_vector']} B | {_pct(b['share_of_float32'])} | {b['vectors_per_gb']:,} |
| this plan (RAM + disk) | {b['disk_bytes_per_vector']} B | {_pct(b['disk_bytes_per_vector'] / b['float32_bytes_per_vector'])} | {10**9 // b['disk_bytes_per_vector']:,} |
| the model's float32 | {b['float32_bytes_per_vector']} B | 100.0 % | {b['float32_vectors_per_gb']:,} |

| queries | metric | score | float32 | share of float32 |
|---|---|---|---|---|
{rows or '| (the plan records no scores) | | | | |'}

## Each store's setting

| store | setting | where it differs from the plan |
|---|---|---|
| faiss | `{deploy['faiss']['factory']}` | the plan's own index |
{stores}

## The model

{model}
## FAISS

`faiss_factory.txt`: `faiss.index_factory({dim}, open("faiss_factory.txt").read().strip(), faiss.METRIC_INNER_PRODUCT)`,
train and add the vectors; or `embedtune index build --plan PLAN`, which also loads a registered codec's trained tables.

## LanceDB

`lancedb.json` is the recipe `embedtune.index.lancedb_store.load_plan_into_lancedb` and `search_lancedb` follow
(vector column `{configs['lancedb']['vector_type']}`, distance `{configs['lancedb']['distance']}`).

## Qdrant

```python
import json
from pydantic import TypeAdapter
from qdrant_client import QdrantClient, models
c = json.load(open("qdrant.json"))
quantization = c["quantization_config"] and TypeAdapter(models.QuantizationConfig).validate_python(c["quantization_config"])
client = QdrantClient(url="http://localhost:6333")   # or QdrantClient(path="qdrant-folder"), embedded
client.create_collection(c["collection_name"], vectors_config=models.VectorParams(**c["vectors_config"]),
                         quantization_config=quantization)
client.upload_collection(c["collection_name"], vectors=vectors, ids=list(range(len(vectors))))
hits = client.query_points(c["collection_name"], query=query_vector, limit=c["limit"],
                           search_params=models.SearchParams(**c["search_params"])).points
```

Embedded Qdrant (`path=`) searches the float vectors exactly and ignores `quantization_config`; the server applies it.

## pgvector

`psql -f pgvector.sql` creates the extension (pgvector installed in PostgreSQL), the table and its index; the last
statement is the top-{configs['qdrant']['limit']} query (`:query`: the compressed query vector).

## Milvus

```python
import json
from pymilvus import DataType, MilvusClient
c = json.load(open("milvus.json"))
client = MilvusClient("milvus.db")                    # Milvus Lite; a server: MilvusClient(uri="http://localhost:19530")
spec = c["lite"]                                      # the server: c itself (its fields and index_params)
schema = MilvusClient.create_schema(auto_id=False)
for f in spec["fields"]:
    schema.add_field(f["name"], getattr(DataType, f["type"]), **{{k: v for k, v in f.items() if k not in ("name", "type")}})
index = client.prepare_index_params()
for i in spec["index_params"]:
    index.add_index(**i)
client.create_collection(c["collection_name"], schema=schema, index_params=index)
```

Milvus Lite stores {configs['milvus']['lite']['stores']}.
"""
