"""Imports read top-down: an AST walk over ``src/embedtune`` that fails on any import climbing a layer.

The layers, lowest first (a module may import its own layer and the layers below it)::

    0 foundation  io, errors, outputs, runtime, evaluate/ (exact search, kernels, metrics, scoring of given vectors)
    1 data        data/
    2 encoders    encoders/
    3 methods     compress/, finetune/
    4 index       index/ (the codecs, the plan folder's format, the deployed index: it applies a fitted compressor)
    5 workflows   workflows/ (and pipeline.py, experiment.py until they move there)
    6 surfaces    bench/, cli/

Three rules, each failure printed as ``file:line: rule: detail``:

* ``climb``: an import (module level or inside a function) of a higher layer.
* ``private``: ``from embedtune.<other package>... import _name``; make the helper public instead.
* ``function-body``: an import of an embedtune module inside a function, unless the pair is in
  :data:`FUNCTION_BODY_ALLOWED`, whose entries must say why (a heavy optional dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "embedtune"

# First component under ``embedtune`` -> layer. A new top-level module or package must be added here.
LAYERS: dict[str, int] = {
    "": 0,  # embedtune/__init__.py (the version)
    "io": 0,
    "locks": 0,
    "errors": 0,
    "array_facts": 0,
    "constraints": 0,
    "outputs": 0,
    "result_files": 0,
    "runtime": 0,
    "evaluate": 0,
    "data": 1,
    "encoders": 2,
    "compress": 3,
    "finetune": 3,
    # index/ below workflows/: the plan's scoring (workflows/plan.py) and the deployed index share its codecs
    # and the plan folder's format; above compress/: building an index applies a fitted compressor.
    "index": 4,
    "workflows": 5,
    "pipeline": 5,
    "experiment": 5,
    "bench": 6,
    "cli": 6,
    "__main__": 6,
}
LAYER_NAMES = {0: "foundation", 1: "data", 2: "encoders", 3: "compress/finetune", 4: "index", 5: "workflows", 6: "bench/cli"}

# (importing module, imported module or a package above it) -> why the import waits until the function runs.
# Only heavy optional dependencies belong here: importing them at module top would slow down
# `embedtune --help` and `import embedtune.<package>` for everyone, or fail without the extra installed.
FUNCTION_BODY_ALLOWED: dict[tuple[str, str], str] = {
    # The VL stack (Qwen-VL code on torch and transformers): only the VL commands need it.
    ("embedtune.workflows.mmeb", "embedtune.encoders.vision_language"): "the VL stack",
    ("embedtune.finetune.backbones.vl", "embedtune.encoders.vision_language"): "the VL stack",
    ("embedtune.finetune.backbones.vl", "embedtune.encoders.tiny_vl"): "the VL stack",
    # sentence-transformers / transformers' Trainer: several seconds to import.
    ("embedtune.cli.finetune", "embedtune.finetune.recipe"): "sentence-transformers and transformers (PACE training)",
    ("embedtune.finetune.backbones.text", "embedtune.finetune.trainer"): "transformers' Trainer, only when a stage trains",
    ("embedtune.finetune.schema", "embedtune.finetune.losses.cached_focal_embedding"): "sentence-transformers (GradCache), only to word an error",
    ("embedtune.compress.st_export", "embedtune.compress.st_module"): "sentence-transformers, only when exporting",
    ("embedtune.compress.csr", "embedtune.compress.csr_module"): "sentence-transformers' SparseAutoEncoder, only when a CSR fits or loads",
    ("embedtune.encoders.vision_language", "embedtune.encoders.st_vl"): "sentence-transformers, only when saving in its layout "
                                                                        "(st_vl also builds on this module)",
    ("embedtune.cli.pipeline", "embedtune.workflows.pipeline"): "sentence-transformers and transformers (PACE training)",
    ("embedtune.cli.bench", "embedtune.bench.efficiency"): "faiss (a fifth of a second), only for `benchmark index`",
    # The experiment stack and the result tables (a tenth of a second with numpy's warm imports): commands on vectors
    # alone (`index build`, `search --query-vectors`, `compress apply`) never read an experiment or print a table.
    ("embedtune.cli.common", "embedtune.workflows.experiment"): "the experiment stack, only for commands that load one",
    ("embedtune.cli.common", "embedtune.result_files"): "the table formatter and numpy under it, only for commands that print a table",
    ("embedtune.cli.common", "embedtune.compress.ray_apply"): "the Ray layer, only for commands run with --ray-actors",
    ("embedtune.cli.compress.apply", "embedtune.compress.ray_apply"): "the Ray layer, only with --ray-actors",
    # torch (about a second to import): commands that need no model (`index build`, `compress apply` on a PCA,
    # a label-free plan of PCA and truncation, every --help) must not load it (tests/test_startup.py).
    ("embedtune.compress.st_export", "embedtune.compress.residual_mlp"): "torch, only when exporting a residual MLP",
    ("embedtune.workflows.fit", "embedtune.compress.dive"): "torch (DIVE's module), only to warn when DIVE's static-corpus preset is chosen",
    ("embedtune.workflows.train_compressor", "embedtune.compress.dive"): "torch (DIVE's module), only to warn when DIVE's "
                                                                          "static-corpus preset is chosen",
    ("embedtune.workflows.plan", "embedtune.compress.csr"): "torch (CSR's module), only when CSR peers are swept",
    # Every codec (a third of a flat `index build`'s start-up, which is most of a small build's time): a flat
    # index is built and searched with FAISS alone (benchmarks/scale.py times it against FAISS directly).
    ("embedtune.index.store", "embedtune.index.codecs"): "every codec, only for an index that is not flat",
    ("embedtune.index.store", "embedtune.index.ann"): "every codec (under approximate search), only for a factory index",
    ("embedtune.index.store", "embedtune.index.refine"): "every codec (under refinement), only when a plan refines",
    ("embedtune.cli.index", "embedtune.index.planned"): "every codec, only for `index build --plan`",
    ("embedtune.cli.index", "embedtune.index.deploy_bundle"): "every codec and the stores' recipes, only for `index deploy`",
    # The triplet miner under the presets: applying a fitted compressor never asks for a preset.
    ("embedtune.compress.base", "embedtune.compress.presets"): "the triplet miner, only when a preset is asked for",
}


@dataclass(frozen=True)
class ImportSite:
    """One ``import``/``from ... import`` of an embedtune module."""

    path: Path
    line: int
    source: str  # importing module, e.g. "embedtune.cli.index"
    target: str  # imported module, e.g. "embedtune.evaluate.search"
    names: tuple[str, ...]  # names taken by ``from ... import``; empty for ``import x``
    in_function: bool

    def where(self) -> str:
        return f"{self.path.relative_to(PACKAGE_ROOT.parents[1])}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """``embedtune.cli.index`` -> ``cli``; ``embedtune.io`` -> ``io``; ``embedtune`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    relative = PACKAGE_ROOT.parent.joinpath(*dotted.split("."))
    return relative.with_suffix(".py").is_file() or (relative / "__init__.py").is_file()


def import_sites(path: Path) -> list[ImportSite]:
    """Every import of an embedtune module in ``path``, with whether it sits inside a function."""
    source = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    sites: list[ImportSite] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "embedtune":
                        sites.append(ImportSite(path, child.lineno, source, alias.name, (), inside))
            elif isinstance(child, ast.ImportFrom):
                target = _absolute(child, source, path.name == "__init__.py")
                if target.split(".")[0] == "embedtune":
                    names = tuple(alias.name for alias in child.names)
                    # `from embedtune import workflows` imports the module embedtune.workflows.
                    modules = [name for name in names if _is_module(f"{target}.{name}")]
                    for name in modules:
                        sites.append(ImportSite(path, child.lineno, source, f"{target}.{name}", (), inside))
                    if len(modules) < len(names):
                        sites.append(ImportSite(path, child.lineno, source, target, tuple(n for n in names if n not in modules), inside))
            visit(child, inside)

    visit(tree, False)
    return sites


def all_sites() -> list[ImportSite]:
    return [site for path in sorted(PACKAGE_ROOT.rglob("*.py")) for site in import_sites(path)]


def _allowed_pair(site: ImportSite) -> tuple[str, str] | None:
    """The FUNCTION_BODY_ALLOWED key covering ``site`` (the target or a package above it), if any."""
    for source, target in FUNCTION_BODY_ALLOWED:
        if site.source == source and (site.target == target or site.target.startswith(target + ".")):
            return source, target
    return None


def layering_violations(sites: list[ImportSite]) -> list[str]:
    """``file:line: rule: detail`` for each broken rule."""
    problems = []
    for site in sites:
        source_package, target_package = package_of(site.source), package_of(site.target)
        for package, module in ((source_package, site.source), (target_package, site.target)):
            if package not in LAYERS:
                problems.append(f"{site.where()}: unmapped: {module} is in no layer; add {package!r} to LAYERS in tests/test_layering.py")
        if source_package not in LAYERS or target_package not in LAYERS:
            continue
        source_layer, target_layer = LAYERS[source_package], LAYERS[target_package]
        if target_layer > source_layer:
            problems.append(
                f"{site.where()}: climb: {site.source} ({LAYER_NAMES[source_layer]}) imports {site.target} "
                f"({LAYER_NAMES[target_layer]}); move the code down, or the caller up"
            )
        if target_package != source_package:
            for name in site.names:
                if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):  # __version__ is public
                    problems.append(f"{site.where()}: private: {site.source} imports {name} from {site.target}; make it public there")
        if site.in_function and _allowed_pair(site) is None:
            problems.append(
                f"{site.where()}: function-body: {site.source} imports {site.target} inside a function; move it to the "
                f"module top, or (heavy optional dependency only) add the pair with a reason to FUNCTION_BODY_ALLOWED"
            )
    return problems


def test_imports_read_top_down():
    problems = layering_violations(all_sites())
    assert not problems, "imports that break the layering (see tests/test_layering.py):\n" + "\n".join(problems)


def test_every_allowed_function_body_import_exists_and_says_why():
    used = {_allowed_pair(site) for site in all_sites() if site.in_function}
    stale = [pair for pair in FUNCTION_BODY_ALLOWED if pair not in used]
    assert not stale, f"FUNCTION_BODY_ALLOWED lists imports that no longer exist; remove them: {stale}"
    assert all(reason.strip() for reason in FUNCTION_BODY_ALLOWED.values())


def test_the_walk_sees_each_rule(tmp_path, monkeypatch):
    """The checker itself: a climbing, a private and a function-body import are each reported."""
    root = tmp_path / "embedtune"
    (root / "data").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "data" / "__init__.py").write_text("")
    (root / "data" / "bad.py").write_text(
        "from embedtune.cli import main\n"
        "from embedtune.evaluate.search import _hidden\n"
        "def f():\n    from embedtune.io import atomic_write\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_ROOT", root)
    problems = layering_violations(import_sites(root / "data" / "bad.py"))
    rules = sorted(problem.split(": ")[1] for problem in problems)
    assert rules == ["climb", "function-body", "private"], problems
    assert all(problem.startswith("src/embedtune/data/bad.py:") or "bad.py:" in problem for problem in problems)


# What `embedtune --help` may not import: each costs from a tenth of a second to several seconds.
HEAVY_FOR_HELP = ("transformers", "sentence_transformers", "faiss", "pytrec_eval", "matplotlib", "ray", "deepspeed", "accelerate")


def test_cli_help_does_not_import_heavy_dependencies():
    code = ("import sys, embedtune.cli as cli; cli.build_parser(); "
            f"print(sorted(m for m in {HEAVY_FOR_HELP!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", (f"building the CLI parser (embedtune --help) imports {out}; import them inside the handler that needs "
                         "them (python -X importtime -c 'import embedtune.cli as c; c.build_parser()' shows which module pulls them)")


def test_importing_data_does_not_import_encoders():
    code = "import sys, embedtune.data, embedtune.data.mmeb; print(sorted(m for m in sys.modules if m.startswith('embedtune.encoders')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"importing embedtune.data pulled in {out}"
