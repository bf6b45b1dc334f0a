"""``index deploy`` writes a bundle whose store configurations serve the plan's top-10 in the real engines.

On a slice of the bundled SciFact MiniLM vectors (400 documents, 50 queries; nothing downloaded), a
PCA-64 plan at each precision is written, bundled, loaded into embedded Qdrant and Milvus Lite
by the bundle's configuration and searched; the top-10 are compared with the plan's own FAISS
index. pgvector's round trip runs a local PostgreSQL with the extension: the ``pgserver`` wheel's (the ``deploy`` extra
bundles PostgreSQL 16 with pgvector 0.6.2: the float32 ``vector`` round trip), or a system one; it skips, saying why, without.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from embedtune.compress import make_compressor
from embedtune.errors import EmbedtuneError
from embedtune.index.codecs import PRECISIONS, Precision, QuantizedIndex, binary_codes
from embedtune.index.deploy_bundle import write_deploy_bundle
from embedtune.index.deployment import deployment_recipe
from embedtune.index.plan_format import load_plan, write_plan
from embedtune.index.store_configs import STORE_SETTINGS, STORES, milvus_config, pgvector_sql, precision_kind, qdrant_config

N_DOCS, N_QUERIES, K, DIM = 400, 50, 10, 64
EXACT = ["float32", "binary", "binary-asym", "binary-rescore"]
BUNDLE_FILES = {"deploy.json", "faiss_factory.txt", "lancedb.json", "qdrant.json", "pgvector.sql", "milvus.json", "README.md"}


@pytest.fixture(scope="module")
def scifact_slice():
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"][:N_DOCS], dtype=np.float32)
    queries = np.ascontiguousarray(bundled["query"][:N_QUERIES], dtype=np.float32)
    return docs, queries, make_compressor("pca", dim=DIM).fit_unsupervised(docs)


def _bundle(tmp_path: Path, scifact_slice, precision: str) -> tuple[Path, dict, np.ndarray, np.ndarray, np.ndarray]:
    """Plan + bundle (no model) for ``precision``; returns the bundle, deploy.json, the compressed docs and queries and the plan's top-10."""
    docs, queries, compressor = scifact_slice
    plan = tmp_path / "plan"
    write_plan(plan, compressor, Precision(precision), docs, {"chosen": {"setting": f"pca-{DIM}/{precision}"},
                                                               "deployment": deployment_recipe(Precision(precision), DIM)})
    deploy = write_deploy_bundle(plan, tmp_path / "bundle", include_model=False)
    _, _, planned, calibration = load_plan(plan)
    x, xq = compressor.transform(docs), compressor.transform(queries)
    _, I_plan = QuantizedIndex.build(x, planned, calibration=calibration).search(xq, K)
    return tmp_path / "bundle", deploy, x, xq, I_plan


def _overlap(I: np.ndarray, I_plan: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(I, I_plan)]))


def test_the_bundle_holds_every_store_and_writes_nothing_outside_out(tmp_path, scifact_slice):
    before = set(tmp_path.iterdir())
    bundle, deploy, *_ = _bundle(tmp_path, scifact_slice, "binary-rescore")
    assert set(tmp_path.iterdir()) - before == {tmp_path / "plan", bundle}
    assert BUNDLE_FILES <= {p.name for p in bundle.iterdir()} and not (bundle / "model").exists()
    assert json.loads((bundle / "deploy.json").read_text()) == json.loads(json.dumps(deploy))
    assert (bundle / "faiss_factory.txt").read_text().strip() == Precision("binary-rescore").factory
    assert json.loads((bundle / "qdrant.json").read_text()) == qdrant_config(Precision("binary-rescore"), DIM)
    assert set(deploy["stores"]) == {*STORES, "lancedb"}
    b = deploy["bytes"]
    assert b["bytes_per_vector"] == Precision("binary-rescore").ram_bytes(DIM) == DIM // 8
    assert b["disk_bytes_per_vector"] == DIM // 8 + 4 * DIM and b["vectors_per_gb"] == 10**9 // (DIM // 8)
    assert b["share_of_float32"] == pytest.approx((DIM // 8) / (4 * 384))
    readme = (bundle / "README.md").read_text()
    for store in ("Qdrant", "pgvector", "Milvus", "LanceDB", "FAISS", "vectors per GB"):
        assert store in readme
    with pytest.raises(EmbedtuneError, match="not empty"):  # a second run into the same --out is refused
        write_deploy_bundle(tmp_path / "plan", bundle, include_model=False)


def test_every_precision_maps_to_each_store_with_a_note_where_the_store_differs():
    for name in PRECISIONS + ("faiss:PQ16", "faiss:IVF64,PQ32x4fs", "faiss:OPQ16,PQ16", "faiss:SQ4"):
        precision = Precision(name)
        row = STORE_SETTINGS[precision_kind(precision)]
        assert set(row) == set(STORES)
        qdrant, milvus, sql = qdrant_config(precision, DIM), milvus_config(precision, DIM), pgvector_sql(precision, DIM)
        json.dumps([qdrant, milvus])
        assert qdrant["vectors_config"] == {"size": DIM, "distance": "Dot", **{k: v for k, v in qdrant["vectors_config"].items()
                                                                                 if k not in ("size", "distance")}}
        assert "CREATE EXTENSION IF NOT EXISTS vector;" in sql
        quantization = qdrant["quantization_config"] or {}
        if name in ("float32", "float16"):
            assert quantization == {} and row["qdrant"][1] in ("", "Qdrant may compute the dot product in float16")
        elif name == "int8":
            assert quantization["scalar"]["type"] == "int8" and "own" in row["qdrant"][1]
            assert "halfvec" in sql and "halfvec_ip_ops" in sql
        elif name.startswith("binary"):
            assert quantization["binary"]["encoding"] == "one_bit"
            assert milvus["fields"][-1 if name != "binary-rescore" else -2]["type"] == "BINARY_VECTOR"
            assert f"bit({DIM})" in sql and "bit_hamming_ops" in sql
        elif "PQ" in name:
            assert "product" in quantization and "own" in row["qdrant"][1] and milvus["index_params"][0]["index_type"] == "IVF_PQ"
        if precision_kind(precision) in ("float32", "float16", "int8", "four-bit", "product", "other", "rabitq"):
            assert "_ip_ops" in sql or "bit_hamming_ops" in sql
        for store, (setting, note) in row.items():
            assert setting
            if precision_kind(precision) not in ("float32",):
                assert note or store == "pgvector" or precision.name == "binary-rescore" and store == "qdrant", (name, store)


def test_index_deploy_cli_writes_the_bundle(tmp_path, scifact_slice):
    from embedtune.cli import main

    docs, _, compressor = scifact_slice
    write_plan(tmp_path / "plan", compressor, Precision("int8"), docs, {"chosen": {"setting": "pca-64/int8"}})
    assert main(["index", "deploy", "--plan", str(tmp_path / "plan"), "--out", str(tmp_path / "bundle"), "--no-model"]) == 0
    assert BUNDLE_FILES <= {p.name for p in (tmp_path / "bundle").iterdir()}
    assert json.loads((tmp_path / "bundle" / "deploy.json").read_text())["stores"]["qdrant"]["note"]


@pytest.mark.parametrize("precision", EXACT + ["int8"])
def test_qdrant_embedded_finds_the_plans_top10(tmp_path, scifact_slice, precision):
    pytest.importorskip("qdrant_client", reason="qdrant-client is not installed (pip install 'embedtune[deploy]')")
    from embedtune.index.store_roundtrip import search_bundle_store

    bundle, _, x, xq, I_plan = _bundle(tmp_path, scifact_slice, precision)
    _, I = search_bundle_store("qdrant", bundle, Precision(precision), x, xq, tmp_path, K)
    _check(precision, I, I_plan)


@pytest.mark.parametrize("precision", EXACT + ["int8"])
def test_milvus_lite_finds_the_plans_top10(tmp_path, scifact_slice, precision):
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'embedtune[deploy]')")
    pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'embedtune[deploy]')")
    from embedtune.index.store_roundtrip import search_bundle_store

    bundle, _, x, xq, I_plan = _bundle(tmp_path, scifact_slice, precision)
    _, I = search_bundle_store("milvus-lite", bundle, Precision(precision), x, xq, tmp_path, K)
    _check(precision, I, I_plan)


def _check(precision: str, I: np.ndarray, I_plan: np.ndarray) -> None:
    if precision in EXACT:  # the same rows in the same order: ties at every cut broken by row, as the plan's index does
        np.testing.assert_array_equal(I, I_plan)
    else:  # embedded engines search the float vectors exactly; the plan's int8 index differs from that only near ties
        assert _overlap(I, I_plan) >= 0.9, _overlap(I, I_plan)


def _postgres_bins() -> list[Path]:
    """PostgreSQL server folders here, those that may carry pgvector first: the ``pgserver`` wheel's bundled PostgreSQL
    (PyPI, with pgvector built in; in the ``deploy`` extra), then ``pg_config``'s, then Debian's."""
    found = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        found.append(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin")
    configured = shutil.which("pg_config")
    if configured:
        found.append(Path(subprocess.run([configured, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()))
    found += [path.parent for path in sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)]
    return [path for path in found if (path / "initdb").is_file() and (path / "pg_config").is_file()]


def _pgvector_version(control: Path) -> tuple[int, ...]:
    """The ``default_version`` a pgvector ``vector.control`` file installs, e.g. ``(0, 6, 2)``."""
    for line in control.read_text().splitlines():
        if line.strip().startswith("default_version"):
            return tuple(int(part) for part in line.split("=", 1)[1].strip().strip("'\"").split("."))
    return ()


def _postgres_bin(needs: tuple[int, ...] = (0, 5)) -> Path:
    """The first PostgreSQL server folder whose pgvector is at least ``needs`` (``bit`` and ``halfvec`` came in 0.7,
    HNSW in 0.5); a clear skip where there is none."""
    bins = _postgres_bins()
    if not bins:
        pytest.skip("no PostgreSQL server binaries (initdb) on this machine; pip install 'embedtune[deploy]' brings pgserver's")
    older = []
    for bin_dir in bins:
        share = subprocess.run([bin_dir / "pg_config", "--sharedir"], capture_output=True, text=True).stdout.strip()
        control = Path(share) / "extension" / "vector.control"
        if control.is_file():
            if _pgvector_version(control) >= needs:
                return bin_dir
            older.append(f"{'.'.join(map(str, _pgvector_version(control)))} in {bin_dir}")
    if older:
        pytest.skip(f"this round trip needs pgvector >= {'.'.join(map(str, needs))}; here: {', '.join(older)} "
                    "(pgserver 0.1.4, the newest on PyPI, bundles 0.6.2; install postgresql-NN-pgvector for a newer one)")
    pytest.skip(f"pgvector is not installed in any PostgreSQL here ({', '.join(map(str, bins))}), so CREATE EXTENSION vector "
                "cannot run; pip install 'embedtune[deploy]' (pgserver bundles it) or install postgresql-NN-pgvector")


@pytest.mark.parametrize("precision", ["float32", "binary"])
def test_pgvector_finds_the_plans_top10(tmp_path, scifact_slice, precision):
    bin_dir = _postgres_bin(needs=(0, 7) if precision == "binary" else (0, 5))  # bit(d) came in pgvector 0.7
    user = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if user:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and PostgreSQL refuses root: no `postgres` user here to run the server as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root, and PostgreSQL refuses root: no `runuser` here to run the server as `postgres`")
    # PostgreSQL refuses to run as root: as root, the server runs as `postgres`, in a folder of its own that user can
    # reach (pytest's tmp_path sits under a folder only root may enter); removed at the end.
    data = Path(tempfile.mkdtemp(prefix="embedtune-pg-")) if user else tmp_path / "pg"
    data.mkdir(exist_ok=True)
    if user:
        shutil.chown(data, "postgres")
    init = subprocess.run([*user, bin_dir / "initdb", "-D", data / "data", "-A", "trust", "-U", "postgres"], capture_output=True, text=True)
    if init.returncode and not Path("/dev/null").is_char_device():
        pytest.skip("/dev/null is not the null device on this machine (a regular file, so only root may write it), and "
                    "initdb's shell redirects to it as the postgres user fail; restore it with: mknod -m 666 /dev/null c 1 3")
    if init.returncode:
        pytest.skip(f"initdb could not create a PostgreSQL cluster here: {init.stderr.strip().splitlines()[-1:]}")
    socket = str(data)
    # -l: the server writes to a log file, not to the pipe this test reads (which would never close while it runs).
    started = subprocess.run([*user, bin_dir / "pg_ctl", "-D", data / "data", "-l", data / "server.log",
                              "-o", f"-k {socket} -c listen_addresses=''", "-w", "start"], capture_output=True, text=True, timeout=120)
    if started.returncode:
        pytest.skip(f"PostgreSQL did not start here: {started.stderr.strip().splitlines()[-1:]}")
    try:
        bundle, _, x, xq, I_plan = _bundle(tmp_path, scifact_slice, precision)
        sql = (bundle / "pgvector.sql").read_text()
        schema = "\n".join(line for line in sql.splitlines() if not line.startswith(("SELECT", "  ORDER")))
        binary = precision == "binary"
        literal = (lambda v: "".join(map(str, np.unpackbits(binary_codes(v[None]))[:DIM]))) if binary else \
            (lambda v: "[" + ",".join(f"{a:.9g}" for a in v) + "]")
        rows = "".join(f"{i}\t{i}\t{literal(v)}\n" for i, v in enumerate(x))
        query = next(line for line in sql.splitlines() if line.startswith("SELECT"))
        script = schema + "\nCOPY items FROM STDIN;\n" + rows + "\\.\n" + "".join(
            query.replace(":query", f"'{literal(q)}'") + "\n" for q in xq)
        out = subprocess.run([*user, bin_dir / "psql", "-h", socket, "-U", "postgres", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1"],
                             input=script, capture_output=True, text=True, check=True).stdout
        found = [int(line.split("\t")[0]) for line in out.splitlines() if line.count("\t") == 1]
        I = np.array(found[-len(xq) * K:]).reshape(len(xq), K)
        assert _overlap(I, I_plan) >= 0.9, _overlap(I, I_plan)  # an HNSW index is approximate: measured, not exact
    finally:
        subprocess.run([*user, bin_dir / "pg_ctl", "-D", data / "data", "-m", "immediate", "stop"], capture_output=True)
        if user:
            shutil.rmtree(data, ignore_errors=True)


def test_qdrant_json_is_valid_for_qdrants_own_models_at_every_precision():
    models = pytest.importorskip("qdrant_client.models", reason="qdrant-client is not installed (pip install 'embedtune[deploy]')")
    from pydantic import TypeAdapter

    for name in PRECISIONS + ("faiss:PQ16", "faiss:OPQ16,PQ16", "faiss:SQ4"):
        config = qdrant_config(Precision(name), DIM)
        models.VectorParams(**config["vectors_config"])
        models.SearchParams(**config["search_params"])
        if config["quantization_config"] is not None:
            parsed = TypeAdapter(models.QuantizationConfig).validate_python(config["quantization_config"])
            assert type(parsed).__name__.lower().startswith(next(iter(config["quantization_config"])))


@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_the_bundle_readme_snippets_load_each_store(tmp_path, scifact_slice, precision, monkeypatch):
    """The README's Qdrant and Milvus blocks run as written against the embedded engines (Qdrant pointed at a folder)."""
    import re

    bundle, _, x, xq, _ = _bundle(tmp_path, scifact_slice, precision)
    sections = (bundle / "README.md").read_text().split("\n## ")
    blocks = {section.splitlines()[0]: code for section in sections for code in re.findall(r"```python\n(.*?)```", section, re.S)}
    monkeypatch.chdir(bundle)
    if importlib.util.find_spec("qdrant_client"):
        code = blocks["Qdrant"].replace('QdrantClient(url="http://localhost:6333")', 'QdrantClient(path="qdrant-folder")')
        scope = {"vectors": x, "query_vector": xq[0]}
        exec(compile(code, "README.md: Qdrant", "exec"), scope)
        assert len(scope["hits"]) == 10
        scope["client"].close()
    if importlib.util.find_spec("milvus_lite") and importlib.util.find_spec("pymilvus"):
        scope = {}
        exec(compile(blocks["Milvus"], "README.md: Milvus", "exec"), scope)
        assert scope["client"].has_collection("vectors")
        scope["client"].close()


def test_hamming_ties_past_the_first_fetch_are_cut_by_row_as_the_plan_does(tmp_path, scifact_slice):
    """8 sign bits over 400 documents: dozens of rows share the 10th distance, more than a first fetch of 2k holds."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'embedtune[deploy]')")
    from embedtune.index.store_roundtrip import load_milvus_lite, search_milvus_lite, stored_vectors

    docs, queries, _ = scifact_slice
    compressor = make_compressor("pca", dim=8).fit_unsupervised(docs)
    x, xq = compressor.transform(docs), compressor.transform(queries)
    precision = Precision("binary")
    D_plan, I_plan = QuantizedIndex.build(x, precision).search(xq, K)
    tied = [(D_plan[q] == D_plan[q, -1]).sum() for q in range(len(xq))]
    assert max(tied) > 1
    config = milvus_config(precision, 8)
    client = load_milvus_lite(config, stored_vectors(precision, x), tmp_path / "milvus.db")
    try:
        D, I = search_milvus_lite(client, config, precision, xq, K)
    finally:
        client.close()
    np.testing.assert_array_equal(D, D_plan)
    np.testing.assert_array_equal(I, I_plan)


def test_the_bundle_carries_the_plans_model_with_its_compressor_and_precision(tmp_path, tiny_bert_dir):
    """A plan that names its model gets ``model/``: the s-t folder ``compress export --plan`` writes, giving the vectors the stores take."""
    from sentence_transformers import SentenceTransformer

    from embedtune.index.codecs import DeployedCodec

    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    texts = [f"document number {i} about topic" for i in range(40)]
    rng = np.random.default_rng(0)
    docs = base.encode(texts)
    docs = (docs + 0.5 * np.std(docs) * rng.standard_normal(docs.shape)).astype(np.float32)
    compressor = make_compressor("pca", dim=16).fit_unsupervised(docs)
    write_plan(tmp_path / "plan", compressor, Precision("int8"), docs, {"chosen": {"setting": "pca-16/int8"}, "model": str(tiny_bert_dir)})
    deploy = write_deploy_bundle(tmp_path / "plan", tmp_path / "bundle")
    assert deploy["model"] == str(tiny_bert_dir) and deploy["files"]["model"] == "model"
    model = SentenceTransformer(str(tmp_path / "bundle" / "model"), device="cpu")
    vectors = model.encode(texts[:3])
    np.testing.assert_allclose(vectors, compressor.transform(base.encode(texts[:3])), atol=1e-5)
    assert vectors.shape[1] == json.loads((tmp_path / "bundle" / "qdrant.json").read_text())["vectors_config"]["size"]
    assert DeployedCodec.load(tmp_path / "bundle" / "model").precision.name == "int8"
    assert "## The model" in (tmp_path / "bundle" / "README.md").read_text()
