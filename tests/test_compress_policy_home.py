"""`compress` is one module per subcommand, and the policy its handlers apply lives in the library.

- the PCA-variant pairing: :func:`embedtune.workflows.train_compressor.with_both_pca_variants`;
- the similarity (the flag, else the model's own, else cosine) and the encoder options that go with it:
  :func:`embedtune.workflows.experiment.encoder_settings`, the one caller of ``resolve_similarity``;
- ``search_texts``: :mod:`embedtune.index.query`.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from embedtune.cli import build_parser
from embedtune.workflows.experiment import encoder_settings
from embedtune.workflows.train_compressor import PCA_VARIANTS, with_both_pca_variants

SRC = Path(__file__).resolve().parents[1] / "src" / "embedtune"


def _subcommands(parser):
    return next(action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction")


def test_each_compress_subcommand_has_its_own_module():
    compress = _subcommands(build_parser()).choices["compress"]
    handlers = {name: sub.get_default("handler") for name, sub in _subcommands(compress).choices.items()}
    assert list(handlers) == ["train", "fit", "apply", "export", "plan"]  # the order --help lists them in
    for name in ("train", "fit", "apply", "export"):
        assert handlers[name].__module__ == f"embedtune.cli.compress.{name}", name
    assert not (SRC / "cli" / "compress.py").exists()


def test_the_old_imports_still_work():
    from embedtune.cli.compress import method_help, preset_help, register, run_apply, run_export, run_fit, run_train

    assert callable(register) and "dive" in method_help() and preset_help()
    assert [f.__name__ for f in (run_train, run_fit, run_apply, run_export)] == ["run_train", "run_fit", "run_apply", "run_export"]


def test_with_both_pca_variants_pairs_them_for_a_supervised_method():
    assert with_both_pca_variants("dive", ["frozen", "pca"]) == ["frozen", "pca", "pca-uncentred"]
    assert with_both_pca_variants("dive", ["pca-uncentred"]) == ["pca-uncentred", "pca"]
    assert with_both_pca_variants("dive", ["frozen", *PCA_VARIANTS]) == ["frozen", *PCA_VARIANTS]  # nothing twice
    assert with_both_pca_variants("dive", ["frozen", "truncate"]) == ["frozen", "truncate"]  # no PCA given: none added
    assert with_both_pca_variants("pca", ["pca-uncentred"]) == ["pca-uncentred"]  # unsupervised: as given
    with pytest.raises(ValueError, match="unknown compression method"):
        with_both_pca_variants("no-such-method", ["pca"])


def test_compress_train_records_the_paired_compare_list():
    args = build_parser().parse_args(["compress", "train", "--compare", "pca"])
    assert args.compare == ["pca"]  # the pairing is the handler's call into the library, not the parser's
    assert with_both_pca_variants(args.method, args.compare) == ["pca", "pca-uncentred"]


@pytest.fixture
def dot_model(tmp_path, tiny_bert_dir):
    model = tmp_path / "stage2"
    shutil.copytree(tiny_bert_dir, model)
    config_path = model / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.write_text(json.dumps({**config, "similarity_fn_name": "dot"}))
    return model


def test_encoder_settings_resolve_the_similarity_and_normalize_with_it(dot_model, tiny_bert_dir):
    choice, options = encoder_settings(None, dot_model, batch_size=8, max_seq_length=32, query_prompt="q: ", document_prompt="d: ")
    assert (choice.name, choice.source) == ("dot", "model")
    assert options == {"batch_size": 8, "max_seq_length": 32, "query_prompt": "q: ", "document_prompt": "d: ", "normalize": False}
    choice, options = encoder_settings(None, dot_model, precomputed=True)
    assert (choice.name, choice.source, options["normalize"]) == ("cosine", "default", True)
    with pytest.warns(UserWarning, match="ranking by cosine as asked"):
        choice, options = encoder_settings("cosine", dot_model)
    assert (choice.name, choice.source, options["normalize"]) == ("cosine", "flag", True)


def _calls(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


def test_the_similarity_is_resolved_in_one_place():
    """Every command resolves its similarity through encoder_settings; nothing else calls resolve_similarity."""
    callers = sorted(str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
                     if path.name != "similarity.py" and _calls(path, "resolve_similarity"))
    assert callers == ["workflows/experiment.py"], callers
    assert _calls(SRC / "cli" / "common.py", "encoder_settings")  # evaluate, compress train, plan (experiment_from_args)
    assert _calls(SRC / "cli" / "compress" / "fit.py", "encoder_options_from_args")  # compress fit, without an experiment


def test_no_compress_policy_is_left_in_the_cli():
    cli = [path for path in (SRC / "cli").rglob("*.py")]
    defined = {node.name for path in cli for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.FunctionDef)}
    assert not defined & {"with_both_pca_variants", "search_texts", "resolve_similarity", "encoder_settings"}
