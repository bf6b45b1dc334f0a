"""Issue 29, item 5 (first part): every `embedtune` command in the README's shell blocks is one the CLI accepts.

The commands are read from README.md in order (continuation lines joined, comments dropped, a
trailing `...` placeholder removed) and parsed by the real argument parser, so a renamed or
removed flag in a how-to fails here. tests/test_readme_in_order.py runs them in order on a slice
of the data.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from embedtune.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("embedtune "):
                commands.append(re.sub(r"\s+\.\.\.$", "", line))
    return commands


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
