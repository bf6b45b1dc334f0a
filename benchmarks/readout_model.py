"""A copy of a sentence-transformers model folder that reads its embedding out another way.

PACE's premise needs a readout that was not trained for similarity. MiniLM was trained with mean
pooling; the same weights read at the last token (``[SEP]``) or at ``[CLS]`` give such a readout.
The copy changes only ``1_Pooling/config.json`` (the legacy keys every sentence-transformers 6.x
reads); weights, tokenizer and the ``Normalize`` module are the model's own (files are hard-linked
where the file system allows, so a copy costs no disk)::

    python benchmarks/readout_model.py --pooling lasttoken --out runs/minilm-lasttoken   # MiniLM by default
    python benchmarks/pace_convergence.py --model runs/minilm-lasttoken frozen pace
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

POOLINGS = ("mean", "lasttoken", "cls", "max")
_KEYS = {"mean": "pooling_mode_mean_tokens", "lasttoken": "pooling_mode_lasttoken", "cls": "pooling_mode_cls_token",
         "max": "pooling_mode_max_tokens"}
LEGACY_KEYS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
               "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def pooling_folder(model_dir: Path) -> Path:
    """The Pooling module's folder, read from ``modules.json``."""
    modules = json.loads((model_dir / "modules.json").read_text())
    for module in modules:
        if module["type"].rsplit(".", 1)[-1] == "Pooling":
            return model_dir / module["path"]
    raise ValueError(f"{model_dir}: modules.json has no Pooling module")


def copy_with_pooling(model_dir: str | os.PathLike, out: str | os.PathLike, pooling: str) -> Path:
    """Copy ``model_dir`` to ``out`` with its Pooling set to ``pooling`` alone; returns ``out``."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
    source, out = Path(model_dir), Path(out)
    if out.exists():
        shutil.rmtree(out)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, out, copy_function=link_or_copy)
    config_path = pooling_folder(out) / "config.json"
    config = json.loads(config_path.read_text())
    dimension = config.get("word_embedding_dimension") or config.get("embedding_dimension")
    config = {key: value for key, value in config.items() if key not in LEGACY_KEYS and key != "pooling_mode"}
    config = {"word_embedding_dimension": dimension, **{key: False for key in LEGACY_KEYS}, **config}
    config[_KEYS[pooling]] = True
    config_path.unlink()  # a hard link: write a new file, never through to the source's
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="alias or sentence-transformers folder (default: minilm)")
    parser.add_argument("--pooling", required=True, choices=POOLINGS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from embedtune.encoders.bundled import resolve_model_path

    print(copy_with_pooling(resolve_model_path(args.model), args.out, args.pooling))


if __name__ == "__main__":
    main()
