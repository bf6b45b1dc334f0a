"""One results file per run: every command writes ``results.json``; the older names of earlier runs still read.

Earlier releases wrote ``report.json`` (``compress train``, ``diagnose``), ``pipeline_result.json``
(``pipeline``) and ``result.json`` (``finetune pace``) beside or instead of ``results.json``.
These tests pin the one writer's layout and that a folder of an earlier run still loads, with a
deprecation note.
"""

from __future__ import annotations

import json
import logging

import pytest

from embedtune.result_files import (
    LEGACY_SCHEMA,
    RESULTS_NAME,
    SCHEMA,
    find_results,
    read_results,
    results_details,
    write_results,
)


def _write(folder, name, document):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(document), encoding="utf-8")
    return folder / name


def test_write_results_holds_task_and_details(tmp_path):
    path = write_results(tmp_path / "run", task="compress train", command=None, config={"dim": 8}, data={}, model={},
                         metrics={"ndcg_at_10": 0.5}, details={"results": {"dive": {}}})
    assert path.name == RESULTS_NAME
    document = read_results(tmp_path / "run")
    assert document["schema"] == SCHEMA and document["task"] == "compress train" and document["details"] == {"results": {"dive": {}}}
    assert (tmp_path / "run" / "results.md").is_file()


@pytest.mark.parametrize(("name", "content", "task"), [
    ("report.json", {"dataset": "scifact", "results": {"dive": {}}, "comparisons": {}}, "compress train"),
    ("report.json", {"coupling_r": 0.1, "normalize_stripped": True}, "diagnose"),
    ("pipeline_result.json", {"model_dir": "m", "rows": [{"model": "finetuned"}], "comparisons": []}, "pipeline"),
    ("result.json", {"model_dir": "m", "similarity": "dot", "config": {"preset": "pace"}}, "finetune pace"),
])
def test_an_earlier_runs_file_reads_with_a_deprecation_note(tmp_path, caplog, name, content, task):
    _write(tmp_path / "old", name, content)
    with caplog.at_level(logging.WARNING, logger="embedtune.result_files"), pytest.warns(DeprecationWarning, match=name):
        document = read_results(tmp_path / "old")
    assert document["schema"] == LEGACY_SCHEMA and document["task"] == task and document["legacy_file"] == name
    assert document["details"] == content
    assert f"embedtune now writes {RESULTS_NAME}" in caplog.text and name in caplog.text
    with pytest.warns(DeprecationWarning):
        assert results_details(tmp_path / "old") == content


def test_an_earlier_release_wrote_both_files_and_the_details_come_from_the_old_one(tmp_path):
    old = tmp_path / "old"
    write_results(old, task="compress train", command=["embedtune"], config={}, data={}, model={}, metrics={})
    document = json.loads((old / RESULTS_NAME).read_text())
    _write(old, RESULTS_NAME, {key: value for key, value in document.items() if key != "details"})
    _write(old, "report.json", {"results": {"pca": {}}})
    with pytest.warns(DeprecationWarning):
        merged = read_results(old)
    assert merged["schema"] == SCHEMA and merged["details"] == {"results": {"pca": {}}} and merged["legacy_file"] == "report.json"


def test_a_folder_without_results_names_what_it_looked_for(tmp_path):
    assert find_results(tmp_path) is None and results_details(tmp_path) is None
    with pytest.raises(FileNotFoundError, match=r"no results.json \(nor an older report.json, pipeline_result.json, result.json\)"):
        read_results(tmp_path)
    _write(tmp_path / "bad", RESULTS_NAME, {"schema": SCHEMA})
    with pytest.raises(ValueError, match=r"results.json: not an embedtune results file \(missing \['embedtune_version'"):
        read_results(tmp_path / "bad")


def test_pipeline_resumes_a_fine_tuning_of_an_earlier_release(tmp_path):
    from embedtune.finetune.config import preset_config
    from embedtune.workflows.pipeline import _finished_finetune

    config = preset_config("pace", output_dir=str(tmp_path / "finetune"))
    (tmp_path / "model").mkdir()
    record = {"model_dir": str(tmp_path / "model"), "similarity": "dot", "config": config.to_dict()}
    _write(tmp_path / "finetune", "result.json", json.loads(json.dumps(record)))
    with pytest.warns(DeprecationWarning, match="result.json"):
        saved = _finished_finetune(tmp_path / "finetune", config)
    assert saved is not None and saved["similarity"] == "dot"
