"""Every `embedtune` command in the shell blocks of the README and the docs pages is one the CLI accepts.

The commands are read from README.md and then from the docs pages in :data:`PAGES` order (continuation
lines joined, comments dropped, a trailing `...` placeholder removed) and parsed by the real argument
parser, so a renamed or removed flag in a how-to fails here. tests/test_readme_in_order.py runs them
in that order on a slice of the data.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from embedtune.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The pages whose commands and Python routes are tested, in the order they run: the README's quick
#: path first, then the how-tos and references in docs/. A later page may use what an earlier one wrote
#: (docs/export.md exports the compressor docs/own-vectors.md fits; docs/deployment.md exports a plan of docs/planning.md).
PAGES = [README] + [ROOT / "docs" / f"{name}.md" for name in (
    "own-vectors", "no-labels", "export", "planning", "deployment", "deploy", "scale", "scale-and-ray", "onnx", "reproducing", "cli",
    "dive", "finetuning", "install")]


def page_blocks(language: str) -> list[tuple[Path, str]]:
    """Every ```language block of :data:`PAGES`, in order, with its page."""
    return [(page, block) for page in PAGES
            for block in re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)]


def readme_commands() -> list[str]:
    commands = []
    for _, block in page_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("embedtune "):
                commands.append(re.sub(r"\s+\.\.\.$", "", line))
    return commands


def test_every_page_with_commands_is_tested():
    """A docs page with an `embedtune` command in a shell block is in PAGES, so its commands run."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
        if any(re.search(r"^\s*embedtune ", block, re.M) for block in blocks):
            assert page in PAGES, f"{page.name} has embedtune commands but is not in PAGES"


def test_the_readme_has_its_how_to_commands():
    commands = readme_commands()
    assert len(commands) >= 30
    for name in ("compress fit", "compress apply", "compress export", "index build", "search", "embed-corpus", "compress plan",
                 "evaluate", "finetune pace", "pipeline"):
        assert any(command.startswith(f"embedtune {name} ") for command in commands), name


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_parses(command, capsys):
    parser = build_parser()
    try:
        args = parser.parse_args(shlex.split(command)[1:])
    except SystemExit as error:
        pytest.fail(f"the README's command does not parse ({error.code}): {command}\n{capsys.readouterr().err}")
    assert callable(args.handler)
