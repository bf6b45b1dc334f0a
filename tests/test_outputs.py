"""Nothing is overwritten unasked: ``--out`` rules, the marker, ``--overwrite`` and inputs.

One test per defect: ``compress export --overwrite`` deleted the whole tree (the adapter too),
``compress export`` into a non-empty folder ended in a traceback, ``compress apply`` with the
output equal to the input overwrote it, ``compress train --out EXISTING`` left another run's
adapters beside the new report, ``embed``/``split``/``index build`` overwrote their targets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import write_beir
from embedtune.cli import main
from embedtune.compress import DIVECompressor, DIVEConfig, load_compressor, make_compressor
from embedtune.compress.base import TrainingData
from embedtune import outputs
from embedtune.io import atomic_write_bytes
from embedtune.outputs import MARKER_NAME, OutputExistsError, finish_output_dir, prepare_output_dir, prepare_output_file, read_marker


def _adapter(folder: Path, d: int = 32, method: str = "pca") -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, d)).astype(np.float32)
    ids = [f"x{i}" for i in range(len(X))]
    if method == "dive":  # exportable; untrained (epochs=0) is enough here
        compressor = DIVECompressor(DIVEConfig(dim=4, heads=2, epochs=0, device="cpu", progress=False))
        compressor.fit(TrainingData(ids, X, ids, X, {}, np.array([[0, 0, 1]])))
    else:
        compressor = make_compressor(method, dim=4).fit(TrainingData(ids, X, ids, X, {}))
    compressor.save(folder)
    return folder


# -- the helper -------------------------------------------------------------------------------
def test_a_new_or_empty_folder_is_used_and_marked(tmp_path):
    out = prepare_output_dir(tmp_path / "new", command="embed")
    (out / "a.npy").write_bytes(b"x")
    finish_output_dir(out, "embed")
    marker = read_marker(out)
    assert marker["command"] == "embed" and marker["complete"] and marker["written"] == ["a.npy"] and marker["files"] == ["a.npy"]


def test_a_non_empty_folder_is_refused_without_overwrite(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(OutputExistsError, match=r"is not empty \(it holds files embedtune did not write: mine\.txt\).*--overwrite"):
        prepare_output_dir(tmp_path, command="embed")
    with pytest.raises(OutputExistsError, match=f"no {MARKER_NAME}"):
        prepare_output_dir(tmp_path, overwrite=True, command="embed")
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_overwrite_removes_only_what_embedtune_wrote(tmp_path):
    out = tmp_path / "out"
    prepare_output_dir(out, command="compress train")
    (out / "dive").mkdir()
    (out / "dive" / "config.json").write_text("{}")
    (out / "report.json").write_text("{}")
    finish_output_dir(out, "compress train")
    (out / "notes.md").write_text("the user's")
    prepare_output_dir(out, overwrite=True, command="compress train")
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "notes.md"]
    # An unfinished (killed) run owns what it recorded, nothing else (not "all that was not there before").
    atomic_write_bytes(out / "pca" / "config.json", b"{}")
    (out / "later.md").write_text("added by the user after the kill")
    outputs._open.clear()  # the process died: nothing finished the marker
    prepare_output_dir(out, overwrite=True, command="compress train")
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "later.md", "notes.md"]


def test_overwrite_never_removes_an_input(tmp_path):
    out = prepare_output_dir(tmp_path / "out", command="compress train")
    adapter = _adapter(out / "dive")
    finish_output_dir(out, "compress train")
    with pytest.raises(OutputExistsError, match=r"would remove .*dive.*, which lies inside the input .*dive; copy"):
        prepare_output_dir(out, overwrite=True, inputs=[adapter], command="compress export")
    assert (adapter / "model.safetensors").is_file()


def test_a_command_resumes_its_own_folder_only(tmp_path):
    out = prepare_output_dir(tmp_path / "run", command="finetune pace", resume=True)
    (out / "stage1").mkdir()
    assert prepare_output_dir(out, command="finetune pace", resume=True) == out  # killed and restarted
    assert (out / "stage1").is_dir()
    with pytest.raises(OutputExistsError, match="an earlier `embedtune finetune pace` run"):
        prepare_output_dir(out, command="pipeline", resume=True)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "pace_config.json").write_text("{}")  # written before markers existed
    assert prepare_output_dir(legacy, command="finetune pace", resume=True, legacy_names=["pace_config.json"]) == legacy


def test_an_output_file_equal_to_an_input_is_refused(tmp_path):
    source = tmp_path / "a.npy"
    source.write_bytes(b"x")
    with pytest.raises(OutputExistsError, match="is the input file"):
        prepare_output_file(tmp_path / "." / "a.npy", overwrite=True, inputs=[source])
    with pytest.raises(OutputExistsError, match="already exists.*--overwrite"):
        prepare_output_file(source, inputs=[tmp_path / "b.npy"])
    assert prepare_output_file(source, overwrite=True, inputs=[tmp_path / "b.npy"]) == source


# -- the commands -----------------------------------------------------------------------------
def test_compress_apply_refuses_to_write_over_its_input(tmp_path, capsys):
    adapter = _adapter(tmp_path / "adapter")
    vectors = np.random.default_rng(1).normal(size=(10, 32)).astype(np.float32)
    np.save(tmp_path / "a.npy", vectors)
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "a.npy"), "--out", str(tmp_path / "a.npy")]) == 2
    assert "is the input file" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), vectors)
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "a.npy"), "--out", str(tmp_path / "b.npy")]) == 0
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "a.npy"), "--out", str(tmp_path / "b.npy")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "a.npy"), "--out", str(tmp_path / "b.npy"),
                 "--overwrite"]) == 0


def test_compress_export_into_a_non_empty_folder_is_one_error_line(tmp_path, tiny_bert_dir, capsys):
    adapter = _adapter(tmp_path / "adapter", method="dive")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("x")
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(occupied)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("embedtune: error:") and "is not empty" in err and "Traceback" not in err
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(occupied), "--overwrite"]) == 2
    assert (occupied / "keep.txt").read_text() == "x"


def test_compress_export_overwrite_keeps_the_adapter_it_reads_and_foreign_files(tmp_path, tiny_bert_dir, capsys):
    out = tmp_path / "model"
    adapter = _adapter(tmp_path / "adapter", method="dive")
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    inner = out / "embedtune_compressor"  # the adapter copy inside the exported folder
    capsys.readouterr()
    assert main(["compress", "export", "--adapter", str(inner), "--model", str(tiny_bert_dir), "--out", str(out), "--overwrite"]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert load_compressor(inner).output_dim == 4 and (out / "notes.txt").read_text() == "mine"
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "modules.json").is_file()


def test_compress_train_into_an_existing_run_is_refused_and_overwrite_clears_it(toy40, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["compress", "train", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "4", "--compare", "", "--out", str(out)]
    assert main([*base, "--method", "pca"]) == 0
    assert main([*base, "--method", "truncate"]) == 2
    assert "an earlier `embedtune compress train` run" in capsys.readouterr().err
    assert main([*base, "--method", "truncate", "--overwrite", "--json"]) == 0
    assert not (out / "pca").exists(), "another run's adapter was left beside the new report"
    assert (out / "truncate" / "config.json").is_file()
    assert set(json.loads((out / "results.json").read_text())["details"]["results"]) == {"truncate"}


def test_split_and_embed_do_not_overwrite_silently(toy40, tiny_bert_dir, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    assert main(["split", "--data", str(toy40), "--out", str(manifest)]) == 0
    assert main(["split", "--data", str(toy40), "--out", str(manifest), "--split-seed", "1"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["split", "--data", str(toy40), "--out", str(manifest), "--split-seed", "1", "--overwrite"]) == 0

    emb = tmp_path / "emb"
    emb.mkdir()
    (emb / "doc_embeddings.npy").write_bytes(b"someone else's")
    assert main(["embed", "--data", str(toy40), "--model", str(tiny_bert_dir), "--out", str(emb)]) == 2
    assert (emb / "doc_embeddings.npy").read_bytes() == b"someone else's"
    fresh = tmp_path / "fresh"
    assert main(["embed", "--data", str(toy40), "--model", str(tiny_bert_dir), "--out", str(fresh)]) == 0
    assert main(["embed", "--data", str(toy40), "--model", str(tiny_bert_dir), "--out", str(fresh)]) == 2
    assert main(["embed", "--data", str(toy40), "--model", str(tiny_bert_dir), "--out", str(fresh), "--overwrite"]) == 0


def test_index_build_refuses_a_non_empty_out(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(10)))
    command = ["index", "build", "--embeddings", str(tmp_path / "x.npy"), "--ids", str(tmp_path / "ids.txt"), "--out", str(tmp_path / "index")]
    assert main(command) == 0
    assert main(command) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main([*command, "--overwrite"]) == 0
    # Files that appeared after the build are not embedtune's: --overwrite keeps them, even as the input.
    (tmp_path / "index" / "vectors").mkdir()
    np.save(tmp_path / "index" / "vectors" / "x.npy", np.load(tmp_path / "x.npy"))
    command[3] = str(tmp_path / "index" / "vectors" / "x.npy")
    assert main([*command, "--overwrite"]) == 0
    assert (tmp_path / "index" / "vectors" / "x.npy").is_file() and (tmp_path / "index" / "index.faiss").is_file()


# -- ownership is exact -------------------------------------------------------------------------
def _owned_adapter(folder: Path) -> Path:
    """An adapter in a folder an earlier embedtune command wrote (as `compress fit --out A` leaves it)."""
    prepare_output_dir(folder, command="compress fit")
    _adapter(folder)
    finish_output_dir(folder, "compress fit")
    return folder


def test_overwrite_refuses_when_out_is_the_inputs_own_folder(tmp_path):
    adapter = _owned_adapter(tmp_path / "A")
    with pytest.raises(OutputExistsError, match=r"lies inside the input .*A \(--out is the input's own folder"):
        prepare_output_dir(adapter, overwrite=True, inputs=[adapter], command="index build")
    with pytest.raises(OutputExistsError, match="lies inside the input"):  # an input folder above --out
        prepare_output_dir(adapter, overwrite=True, inputs=[tmp_path], command="index build")
    assert load_compressor(adapter).output_dim == 4


def test_index_build_export_and_search_into_their_own_input_are_refused(tmp_path, tiny_bert_dir, capsys):
    adapter = _owned_adapter(tmp_path / "A")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(12, 32)).astype(np.float32))
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(12)))
    build = ["index", "build", "--embeddings", str(tmp_path / "x.npy"), "--ids", str(tmp_path / "ids.txt")]
    assert main([*build, "--adapter", str(adapter), "--out", str(adapter), "--overwrite"]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert load_compressor(adapter).output_dim == 4

    dive = _owned_adapter(tmp_path / "D")
    _adapter(dive, method="dive")
    assert main(["compress", "export", "--adapter", str(dive), "--model", str(tiny_bert_dir), "--out", str(dive), "--overwrite"]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert load_compressor(dive).method == "dive" and not (dive / "modules.json").exists()

    index = tmp_path / "I"
    assert main([*build, "--out", str(index)]) == 0
    assert main(["search", "--index", str(index), "--model", str(tiny_bert_dir), "--out", str(index), "--overwrite", "q"]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert (index / "index.faiss").is_file() and (index / "manifest.json").is_file()


def test_a_file_added_after_a_failed_run_survives_the_next_overwrite(tmp_path, capsys):
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(6)]
    data = write_beir(tmp_path / "beir", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(6)])
    rng = np.random.default_rng(0)
    np.save(tmp_path / "docs.npy", rng.normal(size=(12, 8)).astype(np.float32))
    np.save(tmp_path / "queries.npy", rng.normal(size=(6, 8)).astype(np.float32))
    (tmp_path / "queries.txt").write_text("".join(f"q{i}\n" for i in range(6)))
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(1, 12)) + "other\n")  # no vector for the judged d0
    out = tmp_path / "run"
    command = ["evaluate", "--data", str(data), "--doc-embeddings", str(tmp_path / "docs.npy"), "--doc-ids", str(tmp_path / "docs.txt"),
               "--query-embeddings", str(tmp_path / "queries.npy"), "--query-ids", str(tmp_path / "queries.txt"), "--out", str(out)]
    assert main(command) == 2  # fails after --out was prepared
    marker = read_marker(out)
    assert marker["failed"] and not marker["complete"] and marker["files"] == []
    (out / "notes.md").write_text("the user's, added after the failure")
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(12)))
    assert main([*command, "--overwrite"]) == 0
    assert (out / "notes.md").read_text() == "the user's, added after the failure"
    assert "notes.md" not in read_marker(out)["files"] and (out / "results.json").is_file()
    assert main([*command, "--overwrite"]) == 0
    assert (out / "notes.md").read_text() == "the user's, added after the failure"


def test_a_failed_index_build_leaves_out_untouched(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(10)))
    out = tmp_path / "index"
    command = ["index", "build", "--embeddings", str(tmp_path / "x.npy"), "--ids", str(tmp_path / "ids.txt"), "--out", str(out)]
    assert main(command) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for kind, message in (("IVF64,Flat", "FAISS could not train the --kind 'IVF64,Flat' index on 10 vectors"),
                          ("PQ3", "--kind 'PQ3': FAISS cannot make this index for 4-d vectors")):
        assert main([*command, "--overwrite", "--kind", kind]) == 2
        err = capsys.readouterr().err
        assert message in err and "unexpected" not in err and "Fix:" in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # --overwrite removed nothing


def test_a_users_file_inside_an_owned_subfolder_survives_overwrite(tmp_path):
    out = prepare_output_dir(tmp_path / "out", command="compress train")
    _adapter(out / "pca")
    finish_output_dir(out, "compress train")
    assert read_marker(out)["files"] == ["pca/config.json", "pca/model.safetensors"]
    (out / "pca" / "notes.md").write_text("the user's")
    prepare_output_dir(out, overwrite=True, command="compress train")
    assert sorted(p.name for p in (out / "pca").iterdir()) == ["notes.md"]
    assert (out / "pca" / "notes.md").read_text() == "the user's"
    # An owned folder left empty by the removal goes too.
    _adapter(out / "dive")
    finish_output_dir(out, "compress train")
    prepare_output_dir(out, overwrite=True, command="compress train")
    assert not (out / "dive").exists() and (out / "pca" / "notes.md").is_file()


def test_a_marker_never_reaches_outside_its_folder(tmp_path):
    out = prepare_output_dir(tmp_path / "out", command="embed")
    finish_output_dir(out, "embed")
    (tmp_path / "precious.txt").write_text("x")
    marker = json.loads((out / MARKER_NAME).read_text())
    marker["files"] = ["../precious.txt", str(tmp_path / "precious.txt")]
    (out / MARKER_NAME).write_text(json.dumps(marker))
    (out / "junk").write_text("y")  # something there, so --overwrite has work to do
    prepare_output_dir(out, overwrite=True, command="embed")
    assert (tmp_path / "precious.txt").read_text() == "x"


# -- links and markers: nothing removed or written outside --out --------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_subfolder_moved_away_and_linked_back(tmp_path):
    out = prepare_output_dir(tmp_path / "out", command="compress train")
    _adapter(out / "pca")
    finish_output_dir(out, "compress train")
    archive = tmp_path / "archive"
    archive.mkdir()
    (out / "pca").rename(archive / "pca")
    (out / "pca").symlink_to(archive / "pca", target_is_directory=True)
    before = _tree(archive)
    with pytest.raises(OutputExistsError, match=r"pca is a symbolic link to .*archive/pca, outside --out.*Remove the link"):
        prepare_output_dir(out, overwrite=True, command="compress train")
    assert _tree(archive) == before and (out / "pca").is_symlink()
    with pytest.raises(OutputExistsError, match="symbolic link"):  # the refusal comes before any removal, check_only too
        prepare_output_dir(out, overwrite=True, command="compress train", check_only=True)
    (out / "pca").unlink()  # the fix the message names: the archive is kept
    prepare_output_dir(out, overwrite=True, command="compress train")
    assert _tree(archive) == before


def test_a_marker_naming_a_path_through_a_link_or_the_folder_itself_removes_nothing_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep")
    out = prepare_output_dir(tmp_path / "out", command="compress fit")
    finish_output_dir(out, "compress fit")
    (out / "notes.md").write_text("the user's")
    marker = json.loads((out / MARKER_NAME).read_text())
    marker["files"] = ["link/secret.txt"]
    (out / MARKER_NAME).write_text(json.dumps(marker))
    (out / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutputExistsError, match="symbolic link"):
        prepare_output_dir(out, overwrite=True, command="compress fit")
    assert (outside / "secret.txt").read_text() == "keep"
    # A link to a folder inside --out is not refused, but nothing is removed through it.
    (out / "link").unlink()
    (out / "inner").mkdir()
    (out / "inner" / "secret.txt").write_text("the user's too")
    (out / "link").symlink_to(out / "inner", target_is_directory=True)
    prepare_output_dir(out, overwrite=True, command="compress fit")
    assert (out / "inner" / "secret.txt").read_text() == "the user's too"
    # A marker naming the folder itself, or a folder, never removes a tree.
    for listed in (".", "inner", "inner/"):
        marker = json.loads((out / MARKER_NAME).read_text())
        marker["files"] = [listed]
        (out / MARKER_NAME).write_text(json.dumps(marker))
        prepare_output_dir(out, overwrite=True, command="compress fit")
        assert (out / "notes.md").read_text() == "the user's" and (out / "inner" / "secret.txt").is_file()


def test_an_owned_file_replaced_by_a_link_is_removed_as_a_link(tmp_path):
    archive = tmp_path / "archive.npy"
    archive.write_bytes(b"archived vectors")
    out = prepare_output_dir(tmp_path / "out", command="embed")
    atomic_write_bytes(out / "doc_embeddings.npy", b"x")
    finish_output_dir(out, "embed")
    (out / "doc_embeddings.npy").unlink()
    (out / "doc_embeddings.npy").symlink_to(archive)
    prepare_output_dir(out, overwrite=True, command="embed")
    assert not (out / "doc_embeddings.npy").is_symlink() and archive.read_bytes() == b"archived vectors"


def test_resuming_refuses_a_link_that_leaves_the_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = prepare_output_dir(tmp_path / "out", command="compress plan")
    atomic_write_bytes(out / "plan.json", b"{}")
    finish_output_dir(out, "compress plan")
    (out / "sweep").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutputExistsError, match="sweep is a symbolic link"):
        prepare_output_dir(out, command="compress plan", resume=True)
    (out / "sweep").unlink()
    (out / "sweep").symlink_to(out / "plan.json")  # a link that stays inside is fine
    assert prepare_output_dir(out, command="compress plan", resume=True) == out


def test_embed_corpus_prepares_its_out_like_every_writer(tiny_bert_dir, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(10)))
    index = tmp_path / "index"
    assert main(["index", "build", "--embeddings", str(tmp_path / "x.npy"), "--ids", str(tmp_path / "ids.txt"), "--out", str(index)]) == 0
    before = _tree(index)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(7)))
    command = ["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--shard-size", "4"]
    capsys.readouterr()
    assert main([*command, "--out", str(index)]) == 2
    assert "an earlier `embedtune index build` run" in capsys.readouterr().err and _tree(index) == before
    # Its own folder is resumed without --overwrite (a finished one, and one cut short), and --overwrite re-encodes it.
    out = tmp_path / "vectors"
    assert main([*command, "--out", str(out)]) == 0
    assert read_marker(out)["command"] == "embed-corpus" and "shard-00001.npy" in read_marker(out)["files"]
    kept = (out / "shard-00000.npy").stat().st_mtime_ns
    (out / "shard-00001.json").unlink()
    assert main([*command, "--out", str(out)]) == 0
    assert (out / "shard-00000.npy").stat().st_mtime_ns == kept and (out / "shard-00001.json").is_file()
    assert main([*command, "--out", str(out), "--shard-size", "3"]) == 2  # other settings: refused by the shards' own record
    assert main([*command, "--out", str(out), "--shard-size", "3", "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["shard_size"] == 3 and (out / "shard-00002.json").is_file()
    # A shard folder written before output markers is its own too.
    (out / MARKER_NAME).unlink()
    assert main([*command, "--out", str(out), "--shard-size", "3"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text('{"user": "a file named run.json that is not a shard record"}')
    assert main([*command, "--out", str(other)]) == 2


def test_benchmark_index_never_replaces_an_existing_out_file_unasked(tmp_path, capsys):
    out = tmp_path / "result.json"
    out.write_text('{"the user": "an earlier result"}')
    command = ["benchmark", "index", "--data", "", "--synthetic", "200", "--synthetic-dim", "8", "--dims", "4", "--rounds", "1",
               "--singles", "1", "--batch", "16", "--json", "--out", str(out)]
    assert main(command) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == '{"the user": "an earlier result"}'
    assert main([*command, "--overwrite"]) == 0
    assert json.loads(out.read_text())["flat"]


def test_benchmark_dive_prepares_its_results_folder(toy40, tiny_bert_dir, tmp_path, capsys):
    config = tmp_path / "grid.toml"
    config.write_text(f'[protocol]\nmethods = ["frozen"]\nstudies = ["main"]\nfinal_seeds = [1]\nthreads = 1\n'
                      f'results_dir = "{(tmp_path / "grid").as_posix()}"\n\n[[datasets]]\nname = "toy"\npath = "{toy40.as_posix()}"\n\n'
                      f'[[backbones]]\nname = "tiny"\nmodel = "{tiny_bert_dir.as_posix()}"\ndims = [8]\n')
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text('{"the user": "another tool\'s results"}')
    assert main(["benchmark", "dive", "--config", str(config), "--no-report", "--out", str(mine)]) == 2
    assert "files embedtune did not write" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["results.json"]
    # Its own folder resumes without --overwrite; a folder from before markers (runs/, splits/) is its own too.
    assert main(["benchmark", "dive", "--config", str(config), "--no-report"]) == 0
    assert read_marker(tmp_path / "grid")["command"] == "benchmark dive" and read_marker(tmp_path / "grid")["complete"]
    assert main(["benchmark", "dive", "--config", str(config), "--no-report"]) == 0
    assert "1 runs finished" in capsys.readouterr().out
    (tmp_path / "grid" / MARKER_NAME).unlink()
    assert main(["benchmark", "dive", "--config", str(config), "--no-report"]) == 0


def test_writing_to_dev_null_or_a_pipe_writes_through_and_keeps_the_device(tmp_path):
    """`--out /dev/null` discards the output: the device is written through, never replaced by a file (as root, renaming a
    file over it would leave the machine without a null device)."""
    import stat
    import threading

    from embedtune.io import atomic_write_bytes, atomic_write_json

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe")
    reader.join(timeout=10)
    assert received == [b"through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name != "pipe"]  # no temporary file left beside it
    if not Path(os.devnull).is_char_device():
        pytest.skip(f"{os.devnull} is not a character device on this machine")
    atomic_write_json(os.devnull, {"discarded": True})
    assert Path(os.devnull).is_char_device()
