"""One reproduction per "Data lost" and "Wrong results" bullet of the reliability review, run against this checkout.

    python benchmarks/reliability_reproductions.py --work /tmp/reliability

Each case runs the command the review ran (small synthetic vectors, a random 1-layer BERT where text
is encoded) and prints what happens now: the exit status and the first error line, or the number
that was wrong before next to the right one. Exits 1 if any case does not refuse or give the right
number.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fault_injection"))

import faults  # noqa: E402  (tests/fault_injection/faults.py: the tiny model and toy vectors)

from embedtune.cli import main as embedtune  # noqa: E402
from embedtune.compress import load_compressor  # noqa: E402
from embedtune.evaluate.search import unit_rows  # noqa: E402
from embedtune.io import read_json_verified, sha256_file, write_json_with_digest  # noqa: E402

RESULTS: list[tuple[str, bool, str]] = []


def run(*argv: str) -> tuple[int, str]:
    """``embedtune argv`` in this process: (exit status, first line of stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = embedtune([str(a) for a in argv])
        except SystemExit as exit_:  # argparse
            code = int(exit_.code or 0)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("embedtune: error:")]
    return code, (lines[0] if lines else "")


def case(bullet: str, ok: bool, shown: str) -> None:
    RESULTS.append((bullet, ok, shown))
    print(f"[{'ok' if ok else 'NOT OK'}] {bullet}\n      {shown}")


def refused(bullet: str, code: int, line: str, needle: str, intact: bool = True) -> None:
    case(bullet, code == 2 and needle in line and intact, f"exit {code}: {line[:400]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/reliability", help="scratch folder (emptied first)")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = faults.make_tiny_model(work / "model")
    toy = faults._toy_vectors(work / "toy", seed=0)
    vectors = ["--doc-embeddings", toy["docs"], "--doc-ids", toy["doc_ids"], "--query-embeddings", toy["queries"], "--query-ids", toy["query_ids"]]
    rng = np.random.default_rng(0)
    docs32 = (rng.normal(size=(50, 32)) * rng.uniform(0.2, 5, size=(50, 1))).astype(np.float32)
    np.save(work / "docs32.npy", docs32)
    (work / "docs32.txt").write_text("".join(f"d{i}\n" for i in range(50)))
    build32 = ["index", "build", "--embeddings", work / "docs32.npy", "--ids", work / "docs32.txt"]

    print("## Data lost")
    adapter = work / "A"
    assert run("compress", "fit", "--method", "pca", "--dim", "8", "--doc-embeddings", work / "docs32.npy", "--doc-ids", work / "docs32.txt",
               "--out", adapter)[0] == 0
    code, line = run(*build32, "--adapter", adapter, "--out", adapter, "--overwrite")
    refused("index build --adapter A --out A --overwrite", code, line, "lies inside the input", (adapter / "model.safetensors").is_file())
    code, line = run("compress", "export", "--adapter", adapter, "--model", model, "--out", adapter, "--overwrite")
    refused("compress export --adapter A --out A --overwrite", code, line, "lies inside the input", not (adapter / "modules.json").exists())
    assert run(*build32, "--adapter", adapter, "--model", model, "--out", work / "I")[0] == 0
    code, line = run("search", "--index", work / "I", "--out", work / "I", "--overwrite", "document number 3")
    refused("search --index I --out I --overwrite", code, line, "lies inside the input", (work / "I" / "index.faiss").is_file())

    out = work / "failed"
    (work / "partial.txt").write_text("".join(f"d{i}\n" for i in range(1, 60)) + "other\n")
    evaluate = ["evaluate", "--data", toy["data"], "--doc-embeddings", toy["docs"], "--query-embeddings", toy["queries"],
                "--query-ids", toy["query_ids"], "--out", out]
    first = run(*evaluate, "--doc-ids", work / "partial.txt")[0]
    (out / "notes.md").write_text("mine")
    second = run(*evaluate, "--doc-ids", toy["doc_ids"], "--overwrite")[0]
    case("a file added to --out after a failed run survives the next --overwrite", first == 2 and second == 0 and (out / "notes.md").is_file(),
         f"failed run: exit {first}; rerun with --overwrite: exit {second}; notes.md kept: {(out / 'notes.md').is_file()}")

    train = work / "train"
    beir40 = work / "toy40"
    (beir40 / "qrels").mkdir(parents=True)
    (beir40 / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document number {i} about topic {i % 5}"}) + "\n" for i in range(40)))
    (beir40 / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"}) + "\n" for i in range(20)))
    (beir40 / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    command = ["compress", "train", "--method", "pca", "--dim", "4", "--compare", "", "--model", model, "--data", beir40, "--out", train]
    assert run(*command)[0] == 0
    (train / "pca" / "notes.md").write_text("mine")
    code = run(*command, "--overwrite")[0]
    case("OUT/pca/notes.md survives `compress train --overwrite`", code == 0 and (train / "pca" / "notes.md").is_file(),
         f"exit {code}; OUT/pca holds {sorted(p.name for p in (train / 'pca').iterdir())}")

    print("\n## Wrong results, exit 0")
    code, line = run("evaluate", "--data", toy["data"], *vectors[:1], toy["docs"], "--doc-ids", work / "partial.txt", *vectors[4:])
    refused("evaluate: doc vectors covering part of the judged documents", code, line, "no vector for document 'd0'")
    (work / "spaced.txt").write_text("".join(f"d{i}{' ' if i == 3 else ''}\n" for i in range(60)))
    code, line = run("evaluate", "--data", toy["data"], "--doc-embeddings", toy["docs"], "--doc-ids", work / "spaced.txt", *vectors[4:])
    refused("evaluate: ids with trailing spaces", code, line, "differ only by surrounding whitespace")

    from embedtune.compress import make_compressor
    from embedtune.compress.base import TrainingData

    refit = make_compressor("pca", dim=8).fit(TrainingData([str(i) for i in range(50)], docs32[::-1] ** 2, [str(i) for i in range(50)], docs32[::-1] ** 2, {}))
    refit.save(adapter)  # refitted in place after `index build`
    code, line = run("search", "--index", work / "I", "document number 3")
    refused("search with an adapter refitted after index build", code, line, "refitted or edited after the index was built")

    from embedtune.workflows.experiment import load_experiment
    from embedtune.workflows.plan import run_plan

    options = dict(budget_bytes=32, methods=["pca"], dims=[8], precisions=["float32"], peers=[], rounds=1)
    other = faults._toy_vectors(work / "toy-other", seed=0)
    np.save(other["docs"], np.load(toy["docs"]) + np.random.default_rng(5).normal(size=(60, 24)).astype(np.float32))
    exp = lambda t: load_experiment(t["data"], doc_embeddings=t["docs"], doc_ids=t["doc_ids"], query_embeddings=t["queries"],  # noqa: E731
                                    query_ids=t["query_ids"])
    run_plan(exp(toy), work / "plan", **options)
    rerun = run_plan(exp(other), work / "plan", **options)["chosen"]["ndcg@10"]
    fresh = run_plan(exp(other), work / "plan-fresh", **options)["chosen"]["ndcg@10"]
    case("compress plan rerun into its --out with other vectors", rerun == fresh,
         f"validation nDCG@10 of the rerun {rerun:.4f}, of a fresh plan {fresh:.4f} (the rerun refitted)")

    run_plan(exp(toy), work / "plan8", budget_bytes=8, methods=["pca"], dims=[8], precisions=["int8"], peers=[], rounds=1)
    plan_json = work / "plan8" / "plan.json"
    original = plan_json.read_text()
    plan, _ = read_json_verified(plan_json, "")
    write_json_with_digest(plan_json, {**plan, "index_kind": "flat"})
    code, line = run("index", "build", "--plan", work / "plan8", "--embeddings", toy["docs"], "--ids", toy["doc_ids"], "--out", work / "I8")
    refused("index build --plan: an edited index kind (digest recomputed)", code, line, "field 'index_kind' is 'flat'")
    plan_json.write_text(original)
    from embedtune.index.codecs import Calibration

    calibration = Calibration.load(work / "plan8" / "calibration.safetensors")
    Calibration(calibration.vmin * 2, calibration.vmax * 2).save(work / "plan8" / "calibration.safetensors")
    code, line = run("index", "build", "--plan", work / "plan8", "--embeddings", toy["docs"], "--ids", toy["doc_ids"], "--out", work / "I8")
    refused("index build --plan: edited int8 ranges", code, line, "calibration.safetensors: sha256 mismatch")

    peers = dict(budget_bytes=1, methods=["truncate"], dims=[8], precisions=["binary"], peers=["pq-fs"], rounds=1, work=work / "peer-sweep")
    first_peers = {r["setting"]: r["ndcg@10"] for r in run_plan(exp(toy), work / "plan-peers", **peers)["sweep"] if "faiss:" in r["setting"]}
    cached = sorted((work / "peer-sweep").rglob("*.faiss"))[0]
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    again = {r["setting"]: r["ndcg@10"] for r in run_plan(exp(toy), work / "plan-peers", **peers)["sweep"] if "faiss:" in r["setting"]}
    case("a damaged cached FAISS file in a plan's sweep folder", again == first_peers, f"peer nDCG@10 after the damage {again} = before {first_peers}")

    fitted = work / "cos"
    run("compress", "fit", "--method", "pca", "--dim", "8", "--doc-embeddings", toy["docs"], "--doc-ids", toy["doc_ids"], "--out", fitted)
    compressor = load_compressor(fitted)
    raw = np.load(toy["docs"])
    scored = compressor.transform(unit_rows(raw))
    run("compress", "apply", "--adapter", fitted, "--input", toy["docs"], "--out", work / "applied.npy")
    applied = float(np.abs(np.load(work / "applied.npy") - scored).max())
    run("index", "build", "--adapter", fitted, "--embeddings", toy["docs"], "--ids", toy["doc_ids"], "--out", work / "Icos")
    from embedtune.index import load_index

    indexed = float(np.abs(load_index(work / "Icos").faiss_index.reconstruct_n(0, 60) - scored).max())
    before = float(np.abs(compressor.transform_validated(raw) - scored).max())
    case("compress apply / index build --adapter feed a cosine-fitted PCA unit rows", applied < 1e-5 and indexed < 1e-5,
         f"max |deployed - scored|: apply {applied:.1e}, index build {indexed:.1e} (raw rows, as before: {before:.3f})")

    (work / "pairs.tsv").write_text("".join(f"q{i}\td{i}\n" for i in range(40)))
    (work / "val.tsv").write_text("q0\td0\nq1\td999\n")
    code, line = run("compress", "fit", "--method", "dive", "--dim", "8", "--epochs", "1", "--pairs", work / "pairs.tsv", "--val-split",
                     work / "val.tsv", *vectors, "--out", work / "val-fit")
    refused("--val-split whose relevant documents lack vectors", code, line, "no vector for document 'd999'")

    code, line = run("search", "--index", work / "I", "--top-k", "0", "q")
    case("search --top-k 0", code == 2, f"exit {code} (argparse: --top-k: must be an integer >= 1)")

    import faiss

    index_dir = work / "Idim"
    assert run(*build32, "--out", index_dir, "--model", model)[0] == 0
    swapped = faiss.IndexFlatIP(16)
    swapped.add(rng.normal(size=(50, 16)).astype(np.float32))
    faiss.write_index(swapped, str(index_dir / "index.faiss"))
    manifest, _ = read_json_verified(index_dir / "manifest.json", "")
    manifest["sha256"]["index.faiss"] = sha256_file(index_dir / "index.faiss")
    write_json_with_digest(index_dir / "manifest.json", manifest)
    code, line = run("search", "--index", index_dir, "document number 3")
    refused("an index.faiss whose dimension disagrees with its manifest (digests recomputed)", code, line, "holds 16-d vectors but field 'dim' is 32")

    outputs_and_reads(work, model, toy, build32)
    bad = [bullet for bullet, ok, _ in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(bad)} of {len(RESULTS)} cases refuse or give the right number" + (f"; NOT OK: {bad}" if bad else ""))
    sys.exit(1 if bad else 0)


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def outputs_and_reads(work: Path, model: Path, toy: dict, build32: list) -> None:
    """The second review: writes through links, writers that skipped --out's rules, reads left unchecked."""
    import os
    import time

    print("\n## Data lost (second review)")
    beir40 = work / "toy40"
    train, archive = work / "train2", work / "archive"
    command = ["compress", "train", "--method", "pca", "--dim", "4", "--compare", "", "--model", model, "--data", beir40, "--out", train]
    assert run(*command)[0] == 0
    shutil.move(str(train / "pca"), str(archive))
    (train / "pca").symlink_to(archive, target_is_directory=True)
    before = _digests(archive)
    code, line = run(*command, "--overwrite")
    refused("compress train --overwrite with OUT/pca linked to an archive", code, line, "link", _digests(archive) == before)

    fitted, outside = work / "fit-link", work / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("the user's")
    fit = ["compress", "fit", "--method", "pca", "--dim", "8", "--doc-embeddings", work / "docs32.npy", "--doc-ids", work / "docs32.txt",
           "--out", fitted]
    assert run(*fit)[0] == 0
    (fitted / "via").symlink_to(outside, target_is_directory=True)
    marker = json.loads((fitted / ".embedtune-output.json").read_text())
    marker["files"] = [*marker["files"], "via/victim.txt", str(outside / "victim.txt"), "../outside/victim.txt"]
    (fitted / ".embedtune-output.json").write_text(json.dumps(marker))
    code, line = run(*fit, "--overwrite")
    case("a marker naming files through a link, by an absolute path or with .. (compress fit --overwrite)",
         (outside / "victim.txt").is_file(), f"exit {code}: {line[:300] or 'fitted again'}; the file outside --out kept: {(outside / 'victim.txt').is_file()}")

    index = work / "I-embed"
    assert run(*build32, "--out", index)[0] == 0
    manifest = sha256_file(index / "manifest.json")
    code, line = run("embed-corpus", "--data", beir40 / "corpus.jsonl", "--model", model, "--out", index)
    refused("embed-corpus --out an index folder", code, line, "is not empty", sha256_file(index / "manifest.json") == manifest)

    cache = work / "cache"
    mine = cache / "models" / "my-own-model"
    mine.mkdir(parents=True)
    (mine / "weights.bin").write_bytes(b"mine")
    old = time.time() - 90 * 86400
    os.utime(mine / "weights.bin", (old, old))
    os.utime(mine, (old, old))
    previous = os.environ.get("EMBEDTUNE_CACHE")
    os.environ["EMBEDTUNE_CACHE"] = str(cache)
    try:
        code, _ = run("cache", "prune", "--older-than", "30")
    finally:
        if previous is None:
            os.environ.pop("EMBEDTUNE_CACHE")
        else:
            os.environ["EMBEDTUNE_CACHE"] = previous
    case("cache prune --older-than 30 with a user's own folder under models/", code == 0 and (mine / "weights.bin").is_file(),
         f"exit {code}; the user's folder kept: {(mine / 'weights.bin').is_file()}")

    print("\n## Wrong results, exit 0 (second review)")
    bad = np.load(work / "docs32.npy")
    bad[7, 3] = np.inf
    bad[11, 0] = np.nan
    np.save(work / "bad.npy", bad)
    code, line = run("index", "build", "--embeddings", work / "bad.npy", "--ids", work / "docs32.txt", "--out", work / "I-bad")
    refused("index build without --adapter on vectors holding inf and NaN", code, line, "row 7")

    from embedtune.encoders.ray_encode import read_shards

    shards, foreign = work / "shards", work / "shards-other"
    other = work / "other-corpus.jsonl"
    other.write_text("".join(json.dumps({"_id": f"x{i}", "text": f"document number {i} about topic {i % 5}"}) + "\n" for i in range(40)))
    assert run("embed-corpus", "--data", beir40 / "corpus.jsonl", "--model", model, "--shard-size", "20", "--out", shards)[0] == 0
    assert run("embed-corpus", "--data", other, "--model", model, "--shard-size", "20", "--out", foreign)[0] == 0
    for name in ("shard-00001.npy", "shard-00001.ids.txt", "shard-00001.json"):
        shutil.copy(foreign / name, shards / name)
    try:
        ids, _ = read_shards(shards)
        case("read_shards with a shard copied in from a run over another corpus", False, f"returned {sum(i.startswith('x') for i in ids)} foreign ids")
    except Exception as error:  # noqa: BLE001 - the refusal is the expected outcome
        case("read_shards with a shard copied in from a run over another corpus", "ids" in str(error) or "digest" in str(error),
             f"{type(error).__name__}: {str(error)[:300]}")

    from embedtune.io import IntegrityError

    from embedtune.workflows.experiment import load_experiment
    from embedtune.workflows.plan import run_plan

    st_model = Path(model) / "st" if (Path(model) / "st").is_dir() else Path(model)
    plan8 = work / "plan8-export"  # an int8 plan of the model's own vectors, so it can be exported with the model
    run_plan(load_experiment(beir40, str(st_model), split_seed=0), plan8, budget_bytes=8, methods=["pca"], dims=[8], precisions=["int8"],
             peers=[], rounds=1)
    exported = work / "exported"
    code, line = run("compress", "export", "--plan", plan8, "--model", st_model, "--out", exported)
    assert code == 0, line
    calibration = exported / "embedtune_precision" / "calibration.safetensors"
    if calibration.is_file():
        data = bytearray(calibration.read_bytes())
        data[-3] ^= 0x01
        calibration.write_bytes(bytes(data))
        from embedtune.index.codecs.deployed import DeployedCodec

        try:  # how the deployed int8 codes are made from the exported model's float output
            DeployedCodec.load(exported)
            case("an exported model with one byte of calibration.safetensors flipped", False, "DeployedCodec.load read the damaged ranges")
        except IntegrityError as error:
            case("an exported model with one byte of calibration.safetensors flipped", "calibration.safetensors" in str(error),
                 f"IntegrityError: {str(error)[:300]}")
    else:
        case("an exported model with one byte of calibration.safetensors flipped", False, f"no {calibration} was written")


if __name__ == "__main__":
    main()
