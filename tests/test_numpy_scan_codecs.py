"""Codecs no FAISS index type holds (the trellis code), served by embedtune's numpy scan.

A plan that chooses one saves its tables as ``codec.safetensors``; ``index build --plan`` writes the tables and the
codes as ``index.safetensors``; ``search`` and ``compress export`` serve the codes the plan scored. Every file is
checked by digest before it is read, and a file that disagrees with its manifest is refused.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from plan_checks import assert_served_as_scored, record_builds
from test_plan_codecs import QUICK, _experiment, toy  # noqa: F401  (toy: the unit-vector corpus fixture)
from embedtune.index import load_index
from embedtune.index.codecs import TABLES_FILE, DeployedCodec, Precision, QuantizedIndex, codec_family, read_rotated_index
from embedtune.index.codecs.trellis import TrellisTransformIndex
from embedtune.index.planned import build_planned_index
from embedtune.index.plan_export import plan_codec
from embedtune.io import IntegrityError, write_json_with_digest, xxh3_file
from embedtune.workflows.plan import run_plan


@pytest.fixture
def served(toy, tmp_path, monkeypatch):  # noqa: F811
    """A plan at 4 B a vector with `--codecs klt-tcq-sphere` on unit vectors, and the index it builds."""
    built = record_builds(monkeypatch)
    experiment = _experiment(toy)
    out = tmp_path / "plan"
    # On 60 documents the trellis code's tables outweigh the float32 vectors: allowed, as this is about serving it.
    plan = run_plan(experiment, out, budget_bytes=4, precisions=["float32", "float16", "int8"], work=tmp_path / "work",
                    allow_index_over_float32=True, **{**QUICK, "codecs": ("klt-tcq-sphere",)})
    return experiment, plan, out, built, toy[1]["doc"]


def test_a_plan_that_chooses_the_trellis_code_serves_it_as_scored(served, tmp_path):
    experiment, plan, out, built, (doc_vectors, doc_ids) = served
    assert plan["chosen"]["precision"] == "klt-tcq-sphere:4"
    assert (out / TABLES_FILE).is_file() and not (out / "codec.faiss").exists()
    assert "read_rotated_index" in plan["deployment"]["faiss"]["load"]
    assert_served_as_scored(experiment, plan, out, built, doc_vectors, doc_ids, tmp_path / "index")
    index = load_index(tmp_path / "index")
    assert index.manifest["files"]["index"] == "index.safetensors" and not (tmp_path / "index" / "index.faiss").exists()
    assert isinstance(index.faiss_index, TrellisTransformIndex) and index.faiss_index.radius > 0
    assert index.faiss_index.codes.shape == (len(experiment.embeddings.doc_ids), 4)


def test_the_exported_codec_encodes_as_the_plan_and_round_trips(served, tmp_path):
    _, _, out, _, _ = served
    codec = plan_codec(out)
    assert isinstance(codec.trained_index, TrellisTransformIndex)
    codec.save(tmp_path / "codec")
    again = DeployedCodec.load(tmp_path / "codec")
    x = np.random.default_rng(1).standard_normal((20, codec.dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert np.array_equal(again.encode(x), codec.encode(x))


def test_a_tampered_index_file_is_refused(served, tmp_path):
    _, _, out, _, (doc_vectors, doc_ids) = served
    folder = build_planned_index(doc_vectors, tmp_path / "index", out, ids=doc_ids)
    path = folder / "index.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="index.safetensors"):
        load_index(folder)


def test_an_index_file_swapped_for_another_codecs_is_refused_even_with_its_digest(served, tmp_path):
    """Digests say the files are those written; the tables must still be the codec the manifest names."""
    _, _, out, _, (doc_vectors, doc_ids) = served
    folder = build_planned_index(doc_vectors, tmp_path / "index", out, ids=doc_ids)
    index = read_rotated_index(folder / "index.safetensors")
    index.on_sphere(0.0).write_file(folder / "index.safetensors", with_codes=True)  # the plain decode: another codec's tables
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("content_sha256", None)
    manifest["xxh3_128"]["index.safetensors"] = xxh3_file(folder / "index.safetensors")
    write_json_with_digest(folder / "manifest.json", manifest)
    with pytest.raises(IntegrityError, match="decoded as they are, not 'klt-tcq-sphere:4'"):
        load_index(folder)


def test_a_plan_folder_whose_tables_are_another_codecs_is_refused(served, tmp_path):
    _, _, out, _, _ = served
    codec = codec_family("klt-tcq:4")
    with pytest.raises(ValueError, match="decoded as they are, not 'klt-tcq-sphere:4'|on the sphere, not 'klt-tcq:4'"):
        codec.read_trained(out)


def test_a_file_that_is_not_a_codec_is_refused_with_its_path(tmp_path):
    path = tmp_path / TABLES_FILE
    path.write_bytes(b"not safetensors")
    with pytest.raises(IntegrityError, match=str(path.name)):
        read_rotated_index(path)


def test_the_numpy_index_round_trips_with_its_codes(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32) * np.geomspace(1, 0.1, 16).astype(np.float32)
    index = QuantizedIndex.build(docs, Precision("klt-tcq:6")).backend
    index.write_file(tmp_path / "index.safetensors", with_codes=True)
    again = read_rotated_index(tmp_path / "index.safetensors")
    assert np.array_equal(again.codes, index.codes) and again.radius == 0
    assert np.array_equal(again.search(docs[:20], 5)[1], index.search(docs[:20], 5)[1])
    assert index.serialized_bytes() == index.fixed_bytes() + 300 * 6


def test_the_plan_command_says_what_serves_the_choice():
    from embedtune.cli.plan import _served_by

    assert "numpy scan" in _served_by({"faiss_factory": "klt-tcq-sphere:16"})
    assert "FAISS index fitted on the corpus" in _served_by({"faiss_factory": "klt-pq4:16"})
    assert _served_by({"faiss_factory": "SQ8"}) == "FAISS factory 'SQ8'"


def test_the_twelve_bit_family_keeps_its_register_and_refuses_another(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32) * np.geomspace(1, 0.1, 16).astype(np.float32)
    index = codec_family("klt-tcq12:4").train(docs)
    assert index.state_bits == 12 and codec_family("klt-tcq:4").train(docs).state_bits == 10
    codec_family("klt-tcq:4").train(docs).write(tmp_path)
    with pytest.raises(ValueError, match="10-bit register"):
        codec_family("klt-tcq12:4").read_trained(tmp_path)
