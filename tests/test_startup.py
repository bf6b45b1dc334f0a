"""Commands that need no model start without the model stack: torch, transformers and
sentence-transformers stay unimported in ``--help``, ``--version``, ``compress apply`` on a PCA,
``index build``, ``search --query-vectors``, a label-free ``compress plan`` on given vectors and
``cache``. Each runs in a fresh interpreter, which then reports what it imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedtune.compress import available_methods, describe_method, get_compressor_class, make_compressor
from embedtune.compress.catalog import BUILTIN_METHODS

HEAVY = ("torch", "transformers", "sentence_transformers")
SRC = Path(__file__).resolve().parents[1] / "src"

# Runs each argv through the CLI's main() in one interpreter, then prints the exit codes and which of the watched
# modules (argv[2]) it imported.
PROBE = """
import contextlib, io, json, sys
from embedtune.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    codes.append([code, err.getvalue()[-400:]])
print(json.dumps({"codes": codes, "heavy": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))
"""


def run_cli(argvs: list[list[str]], cwd: Path, env_extra: dict[str, str] | None = None, watch: tuple[str, ...] = HEAVY) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), **(env_extra or {})}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs), json.dumps(watch)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def all_help_argvs() -> list[list[str]]:
    """``--help`` of the program and of every command and sub-command the parser has."""
    from embedtune.cli import build_parser

    argvs = [["--help"], ["--version"]]

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    argvs.append([*prefix, name, "--help"])
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return argvs


def test_help_and_version_import_no_model_stack(tmp_path):
    argvs = all_help_argvs()
    assert ["compress", "fit", "--help"] in argvs and ["search", "--help"] in argvs and len(argvs) > 20
    report = run_cli(argvs, tmp_path)
    assert [code for code, _ in report["codes"]] == [0] * len(argvs)
    assert report["heavy"] == []


@pytest.fixture
def own_vectors(tmp_path):
    rng = np.random.default_rng(7)
    docs = rng.standard_normal((240, 24)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(len(docs))))
    np.save(tmp_path / "queries.npy", rng.standard_normal((6, 24)).astype(np.float32))
    (tmp_path / "qids.txt").write_text("".join(f"q{i}\n" for i in range(6)))
    make_compressor("pca", dim=8).fit_unsupervised(docs).save(tmp_path / "pca")
    return tmp_path


def test_commands_without_a_model_import_no_model_stack(own_vectors):
    cache = own_vectors / "cache"
    argvs = [
        ["compress", "apply", "--adapter", "pca", "--input", "docs.npy", "--out", "docs8.npy"],
        ["index", "build", "--embeddings", "docs.npy", "--ids", "ids.txt", "--out", "flat"],
        ["index", "build", "--embeddings", "docs.npy", "--ids", "ids.txt", "--adapter", "pca", "--kind", "sq8", "--out", "pca-sq8"],
        ["search", "--index", "flat", "--query-vectors", "queries.npy", "--query-ids", "qids.txt", "--out", "run-flat"],
        ["search", "--index", "pca-sq8", "--query-vectors", "queries.npy", "--query-ids", "qids.txt", "--json"],
        ["compress", "plan", "--label-free", "agreement", "--doc-embeddings", "docs.npy", "--doc-ids", "ids.txt",
         "--methods", "pca", "truncate", "--dims", "8", "--peers", "", "--codecs", "none", "--precisions", "float32", "int8",
         "--budget-bytes", "32", "--work", "work", "--out", "plan"],
        ["cache", "info"],
        ["cache", "prune", "--older-than", "0", "--dry-run"],
    ]
    report = run_cli(argvs, own_vectors, {"EMBEDTUNE_CACHE": str(cache)})
    assert [code for code, _ in report["codes"]] == [0] * len(argvs), report["codes"]
    assert report["heavy"] == []
    assert (own_vectors / "run-flat" / "run.trec").is_file() and (own_vectors / "plan" / "plan.json").is_file()


# What a flat index's build and search leave unimported: every codec, and the triplet miner under the compressors'
# presets. Start-up is most of a small build's time (benchmarks/scale.py times `index build` against FAISS directly).
CODEC_STACK = ("embedtune.index.codecs", "embedtune.compress.presets", "embedtune.data.triplets")


def test_a_flat_index_is_built_and_searched_without_the_codecs(own_vectors):
    flat = [
        ["index", "build", "--embeddings", "docs.npy", "--ids", "ids.txt", "--out", "flat"],
        ["search", "--index", "flat", "--query-vectors", "queries.npy", "--query-ids", "qids.txt", "--out", "run-flat"],
    ]
    report = run_cli(flat, own_vectors, watch=CODEC_STACK)
    assert [code for code, _ in report["codes"]] == [0, 0], report["codes"]
    assert report["heavy"] == []
    # The probe sees them when they are imported: an sq8 index needs its codec.
    sq8 = [["index", "build", "--embeddings", "docs.npy", "--ids", "ids.txt", "--kind", "sq8", "--out", "sq8"]]
    report = run_cli(sq8, own_vectors, watch=CODEC_STACK)
    assert report["codes"][0][0] == 0 and "embedtune.index.codecs" in report["heavy"]


def test_every_method_agrees_with_its_catalogue_entry():
    # The help lists methods from the catalogue without importing them; each class must say the same.
    assert [entry.method for entry in BUILTIN_METHODS] == available_methods()[: len(BUILTIN_METHODS)]
    for entry in BUILTIN_METHODS:
        cls = get_compressor_class(entry.method)
        assert cls.__module__ == entry.module
        assert describe_method(entry.method) == entry


def test_threads_are_set_when_torch_and_faiss_are_imported_later(tmp_path):
    code = ("import sys; from embedtune.runtime import set_threads; set_threads(1); set_threads(3); "
            "assert 'torch' not in sys.modules and 'faiss' not in sys.modules; import faiss, torch; "
            "from threadpoolctl import threadpool_info; "
            "print(torch.get_num_threads(), faiss.omp_get_max_threads(), "
            "sorted({p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'}))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "3 3 [3]"


def test_weights_saved_from_numpy_are_the_bytes_torch_saves(tmp_path):
    # A PCA saves and loads its weights through numpy alone; the file must not depend on the path taken.
    import torch

    from embedtune.io import load_weights, save_weights

    arrays = {"mean": np.arange(5, dtype=np.float32), "components": np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)}
    save_weights(tmp_path / "numpy.safetensors", arrays, {"kind": "test"})
    save_weights(tmp_path / "torch.safetensors", {name: torch.from_numpy(value) for name, value in arrays.items()}, {"kind": "test"})
    assert (tmp_path / "numpy.safetensors").read_bytes() == (tmp_path / "torch.safetensors").read_bytes()
    loaded = load_weights(tmp_path / "numpy.safetensors", as_numpy=True)
    assert all(isinstance(loaded[name], np.ndarray) and np.array_equal(loaded[name], arrays[name]) for name in arrays)


def test_the_option_names_configs_read_without_torch_are_the_implemented_ones():
    from embedtune.compress import choices
    from embedtune.compress.losses.self_limiting_triplet import TRIPLET_KINDS
    from embedtune.compress.quantization_aware import QUANTIZATION_AWARE
    from embedtune.compress.residual_mlp import ACTIVATIONS

    assert sorted(ACTIVATIONS) == sorted(choices.ACTIVATION_NAMES)
    assert TRIPLET_KINDS == choices.TRIPLET_KINDS and QUANTIZATION_AWARE == choices.QUANTIZATION_AWARE


def test_each_module_adds_the_commands_the_cli_says():
    """``COMMAND_MODULES`` (what a command's own parser registers) names exactly what each module adds."""
    import importlib

    from embedtune.cli import COMMAND_MODULES

    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    for module, named in COMMAND_MODULES.items():
        before = set(commands.choices)
        importlib.import_module(f"embedtune.cli.{module}").register(commands)
        assert sorted(set(commands.choices) - before) == sorted(named), module


def _help_of(parser: argparse.ArgumentParser, path: list[str]) -> str:
    for word in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser.format_help()


@pytest.mark.parametrize("argv", [["--threads", "1", "-q", "compress", "plan", "--help"], ["index", "build", "--help"],
                                  ["search", "--help"], ["compress", "fit", "--help"], ["compress", "apply", "--help"],
                                  ["cache", "--help"]])
def test_a_commands_own_parser_is_the_full_parsers(argv):
    """The parser built for one command reads its flags exactly as the parser of every command does."""
    from embedtune.cli import _modules_for, build_parser

    path = [word for word in argv[argv.index(next(w for w in argv if not w.startswith("-") and not w.isdigit())):] if word != "--help"]
    assert len(_modules_for(argv)) < len(_modules_for(None))
    assert _help_of(build_parser(argv), path) == _help_of(build_parser(), path)


def test_an_unknown_command_gets_every_command_in_its_usage():
    from embedtune.cli import _modules_for

    for argv in ([], ["--help"], ["nosuch"], ["--threads", "2"], ["-q"]):
        assert len(_modules_for(argv)) == len(_modules_for(None))
