"""What a person sees: one bar per long job, log lines never inside a bar, no internals at the default
level, and one results layout from every command that scores something.

Each command runs in-process through ``embedtune.cli.main`` on a tiny random BERT and toy data, with
its terminal output captured. Bars are drawn from the first second on (``EMBEDTUNE_PROGRESS_DELAY=0``)
so that these tiny jobs draw them too; what the terminal shows is rebuilt from the captured bytes
(a carriage return moves back to the start of the line, as in a terminal).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from embedtune.cli import build_parser, main
from embedtune.workflows.results import REQUIRED_KEYS, SCHEMA, read_results

# A whole visible line that is one bar: "desc: 45%|███▌    | 9/20 [00:01<00:01, 5.1step/s, loss=0.8]".
BAR = re.compile(r"^[\w ,.()/+-]*: *\d+%\|[^|]*\| *\d+/\d+ \[[^\]]*\]$")
# Internals that belong to -v only: each was printed at the default level before.
INTERNALS = ("search kernel", "Normalize module", "cache hit", "cache miss", "embeddings:", "DIVE epoch 1/", "DIVE (select)",
             "step 1:", "LoRA r=", "mine_triplets", "temperature auto", "components of", "training tuples", "INFO ", "DEBUG ")


def visible_lines(text: str) -> list[str]:
    """The lines a terminal would show for ``text``: ``\\r`` returns to the line start and later text overwrites."""
    lines = []
    for raw in text.split("\n"):
        cells: list[str] = []
        column = 0
        for char in raw:
            if char == "\r":
                column = 0
                continue
            if column < len(cells):
                cells[column] = char
            else:
                cells.append(char)
            column += 1
        line = "".join(cells).rstrip()
        if line:
            lines.append(line)
    return lines


def run(argv: list[str], capsys) -> tuple[str, list[str]]:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    return captured.out, visible_lines(captured.err)


def check_screen(err_lines: list[str], expect_bar: str) -> None:
    bars = [line for line in err_lines if "%|" in line]
    assert any(line.startswith(expect_bar) for line in bars), f"no {expect_bar!r} bar in:\n" + "\n".join(err_lines)
    assert not any(line.startswith("Loading weights") for line in bars)  # dependencies' bars for sub-second loads
    for line in bars:
        assert BAR.match(line), f"a log line broke into a bar: {line!r}"
        assert "INFO" not in line and "WARNING" not in line and "warning:" not in line
    for line in err_lines:
        for internal in INTERNALS:
            assert internal not in line, f"internal detail at the default level: {line!r}"
        assert "site-packages" not in line and "warnings.warn(" not in line, f"a warning with its source path: {line!r}"


def check_results(out_dir, task: str, printed: str, retrieval: bool = True) -> dict:
    results = read_results(out_dir)
    assert set(REQUIRED_KEYS) <= set(results) and results["schema"] == SCHEMA and results["task"] == task
    assert results["command"][0] == "embedtune" and task.split()[0] in results["command"]
    assert results["table"] and results["table"] in printed  # the same table it printed
    assert (out_dir / "results.md").read_text(encoding="utf-8").count(results["table"].splitlines()[-1]) == 1
    assert isinstance(results["config"], dict) and results["config"]
    fingerprints = [v for d in ([results["data"]] if "fingerprints" in results["data"] else results["data"].values())
                    for v in (d.get("fingerprints") or {}).values()]
    assert fingerprints and all(re.fullmatch(r"[0-9a-f]{64}", v) for v in fingerprints)
    models = [results["model"]] if "fingerprint" in results["model"] else list(results["model"].values())
    assert models and all(re.fullmatch(r"[0-9a-f]{64}", m["fingerprint"]) for m in models)
    if retrieval:
        metrics = results["metrics"]
        assert {"ndcg_at_10", "recall_at_10", "main_score"} <= set(metrics) and metrics["main_score"] == metrics["ndcg_at_10"]
        assert not any("@" in name for name in metrics)
        assert all(row["metrics"] for row in results["rows"])
    return results


@pytest.fixture(autouse=True)
def immediate_bars(monkeypatch):
    monkeypatch.setenv("EMBEDTUNE_PROGRESS_DELAY", "0")


def test_evaluate_screen_and_results(toy40, tiny_bert_dir, tmp_path, capsys):
    out, err = run(["evaluate", "--model", str(tiny_bert_dir), "--data", str(toy40), "--out", str(tmp_path / "ev")], capsys)
    check_screen(err, "encoding toy40 documents")
    results = check_results(tmp_path / "ev", "evaluate", out)
    assert len(results["per_query"]) == results["metrics"]["n_queries"] == 20
    assert set(next(iter(results["per_query"].values()))) >= {"ndcg_at_10", "precision_at_1", "mrr_at_10"}
    mteb = json.loads((tmp_path / "ev" / "mteb" / "toy40.json").read_text())
    score = mteb["scores"]["test"][0]
    assert mteb["task_name"] == "toy40" and score["main_score"] == score["ndcg_at_10"] == results["metrics"]["ndcg_at_10"]
    assert score["hf_subset"] == "default"
    # -v shows the internals the default level hides (they moved to DEBUG, they were not deleted).
    assert main(["-v", "evaluate", "--model", str(tiny_bert_dir), "--data", str(toy40)]) == 0
    verbose = capsys.readouterr().err
    assert "DEBUG embedtune.encoders.dataset" in verbose and "cache hit" in verbose


def test_quiet_prints_the_result_and_nothing_else(toy40, tiny_bert_dir, tmp_path, capsys):
    out, err = run(["-q", "evaluate", "--model", str(tiny_bert_dir), "--data", str(toy40), "--out", str(tmp_path / "ev")], capsys)
    assert err == [] and out.startswith("dataset") and (tmp_path / "ev" / "results.json").is_file()


def test_compress_train_screen_results_and_plot(toy40, tiny_bert_dir, tmp_path, capsys):
    out_dir = tmp_path / "ct"
    out, err = run(["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                    "--epochs", "3", "--set", "batch_size=8", "--false-negative-margin", "none", "--compare", "frozen", "pca", "--out", str(out_dir)], capsys)
    check_screen(err, "DIVE epoch selection")
    assert any(line.startswith("DIVE refit") or line.startswith("DIVE: best epoch 0") for line in err)
    results = check_results(out_dir, "compress train", out)
    rows = {row["method"]: row for row in results["rows"]}
    # Honest labels: frozen is as wide as the model (32-d), and seed-free methods list no seeds.
    assert rows["frozen"]["dim"] == 32 and "seeds" not in rows["frozen"] and rows["dive"]["seeds"] == [2027]
    assert "std" not in rows["dive"] and "±" not in out  # one run: no spread
    assert results["metrics"] == rows["dive"]["metrics"] and results["per_query"] == rows["dive"]["per_query"]
    assert not (out_dir / "report.json").exists() and set(results["details"]["results"]) == set(rows)  # one file: results.json
    assert (out_dir / "dive" / "training.png").stat().st_size > 10_000 and not (out_dir / "pca" / "training.png").exists()


def test_log_lines_print_above_bars_never_inside(toy40, tiny_bert_dir, tmp_path, capsys):
    # With -v, DIVE logs every epoch while its bar is drawn: each line must land above the bar, whole.
    out, err = run(["-v", "compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                    "--epochs", "3", "--set", "batch_size=8", "--false-negative-margin", "none", "--compare", ""], capsys)
    epoch_lines = [line for line in err if "DIVE epoch 2/3" in line]
    assert epoch_lines and all(re.match(r"^\d\d:\d\d:\d\d DEBUG embedtune\.compress\.dive: DIVE epoch 2/3: rho=", line) for line in epoch_lines)
    bars = [line for line in err if "%|" in line]
    assert any(line.startswith("DIVE epoch selection") for line in bars)
    assert all(BAR.match(line) and "DEBUG" not in line and "INFO" not in line for line in bars), bars


def test_finetune_pace_screen_results_and_plot(toy40, tiny_bert_dir, tmp_path, capsys):
    out_dir = tmp_path / "pace"
    out, err = run(["finetune", "pace", "--model", str(tiny_bert_dir), "--data", str(toy40), "--train-split", "test",
                    "--stage1-steps", "2", "--stage2-steps", "1", "--stage2-init", "1", "--batch-size", "4", "--n-negatives", "2",
                    "--hard-pool", "5", "--save-steps", "1", "--lora-rank", "4", "--evaluate-split", "test", "--out", str(out_dir)], capsys)
    check_screen(err, "PACE stage1")
    assert any(BAR.match(line) and "loss=" in line and "lr=" in line for line in err if line.startswith("PACE stage1"))
    results = check_results(out_dir, "finetune pace", out)
    assert results["model"]["path"].endswith("model") and len(results["per_query"]) == 20
    assert json.loads((out_dir / "mteb" / "toy40.json").read_text())["scores"]["test"][0]["main_score"] == results["metrics"]["main_score"]
    assert (out_dir / "training.png").stat().st_size > 10_000


def test_benchmark_dive_screen_and_results(toy40, tiny_bert_dir, tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(f"""
[protocol]
final_seeds = [2027, 2028]
selection_seeds = [2027]
n_negatives = 2
threads = 1
methods = ["frozen", "dive"]
studies = ["main"]
results_dir = "{(tmp_path / 'grid').as_posix()}"

[[datasets]]
name = "toy"
path = "{toy40.as_posix()}"

[[backbones]]
name = "tiny"
model = "{tiny_bert_dir.as_posix()}"
dims = [8]

[method_overrides.dive]
epochs = 2
batch_size = 8
""")
    out, err = run(["benchmark", "dive", "--config", str(config), "--no-report"], capsys)
    check_screen(err, "protocol grid, phase 1")
    assert not any("protocol grid, phase 2" in line for line in err)  # nothing to do: no empty bar
    results = check_results(tmp_path / "grid", "benchmark dive", out)
    rows = {row["method"]: row for row in results["rows"]}
    assert rows["dive"]["n_runs"] == 2 and "std" in rows["dive"] and rows["frozen"]["n_runs"] == 1 and "std" not in rows["frozen"]
    frozen_line = next(line for line in results["table"].splitlines() if line.startswith("toy") and "frozen" in line)
    assert "±" not in frozen_line and "±" in next(line for line in results["table"].splitlines() if " dive " in line)


def _walk(parser):
    yield parser
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _walk(sub)


def test_every_option_states_its_default_at_most_once():
    for parser in _walk(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.help or action.help == "==SUPPRESS==":
                continue
            shown = formatter._expand_help(action)
            text = shown.lower()
            where = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}: {shown!r}"
            assert text.count("(default") <= 1 and not ("(preset:" in text and "(default:" in text), where
            assert not re.search(r"\(default: (None|False|\[\])?\)", shown), where  # Python reprs and empty values say nothing


def test_encoding_under_one_bar_gives_the_vectors_sentence_transformers_gives(tiny_bert_dir):
    # The encoder forms sentence-transformers' own length-sorted batches, one call each, so a cached
    # embedding from before the bar and a fresh one are the same bytes.
    from embedtune.encoders import SentenceEncoder

    texts = [f"document number {i} about topic {i % 5}" + " title" * (i % 7) for i in range(37)]
    encoder = SentenceEncoder(str(tiny_bert_dir), batch_size=8, show_progress=False)
    counted = []
    ours = encoder.encode(texts, "document", progress=counted.append)
    theirs = encoder.model.encode(texts, batch_size=8, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    assert np.array_equal(ours, theirs) and counted == [8, 8, 8, 8, 5]
