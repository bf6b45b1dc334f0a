"""Process-wide runtime settings shared by the CLI and the benchmarks: threads, progress bars, logging.

What a person sees while a long job runs is decided here, once for every command:

- :func:`progress_bar`: one tqdm bar per long job, with a total, a rate and an ETA. A bar with
  nothing to do (``total == 0``) is not drawn, and :func:`set_progress` (``embedtune --quiet``)
  hides them all.
- :func:`cli_logging`: log lines go through tqdm's logging redirect, so they print above the bars
  instead of inside them. At the default level a line is what a user acts on (a result, a warning,
  where files went) and reads without the logger's name; internals are DEBUG (``embedtune -v``).
  Python warnings print once, without source paths, and known harmless warnings of dependencies
  are filtered (see :data:`DEPENDENCY_WARNINGS`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

__all__ = [
    "set_threads",
    "set_progress",
    "progress_enabled",
    "progress_bar",
    "progress_delay",
    "cli_logging",
    "DEPENDENCY_LOGGERS",
    "DEPENDENCY_WARNINGS",
]

# Dependencies whose INFO lines are their internals, not ours: WARNING and above only, even with -v.
DEPENDENCY_LOGGERS = ("faiss.loader", "faiss", "sentence_transformers", "httpx", "httpcore", "urllib3", "filelock",
                      "transformers", "datasets", "accelerate", "torch", "PIL", "matplotlib", "peft", "huggingface_hub")

# (message regex, category, module regex, why it is harmless here): filtered at the default level, shown with -v.
DEPENDENCY_WARNINGS: tuple[tuple[str, type[Warning], str, str], ...] = (
    (r".*`is_gradient_checkpointing` is deprecated.*", FutureWarning, r"transformers\.",
     "transformers 5 deprecating an attribute that PEFT reads when LoRA is attached (every PACE stage); nothing a user can change"),
)

_progress = True


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads in torch and FAISS (small adapters train fastest on 1 when cores are busy)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1; got {threads}.")
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


def set_progress(enabled: bool) -> None:
    """Show (True) or hide (False) every embedtune progress bar in this process."""
    global _progress
    _progress = bool(enabled)


def progress_enabled() -> bool:
    """Whether bars are drawn: :func:`set_progress` and ``EMBEDTUNE_PROGRESS=0`` turn them off."""
    return _progress and os.environ.get("EMBEDTUNE_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def progress_delay() -> float:
    """Seconds a job runs before its bar appears (``EMBEDTUNE_PROGRESS_DELAY``, default 1): quick jobs draw none."""
    try:
        return max(0.0, float(os.environ.get("EMBEDTUNE_PROGRESS_DELAY", "1")))
    except ValueError:
        return 1.0


def progress_bar(total: int | None, desc: str, unit: str = "it", *, enabled: bool = True, leave: bool = True,
                 initial: int = 0, **kwargs: Any) -> Any:
    """One tqdm bar, the way every embedtune job draws one: ``desc: 45%|███▌    | 2331/5183 [00:31<00:38, 74.2doc/s]``.

    Args:
        total: the number of units of the whole job (a resumed job passes what is already done
            as ``initial``, so the rate and ETA count only this run's work). 0 hides the bar.
        desc: what the job is, e.g. ``"encoding documents"``.
        unit: one unit of work, singular (``"doc"``, ``"step"``, ``"epoch"``, ``"run"``).
        enabled: the caller's own switch (e.g. a config's ``progress``); the process-wide one
            (:func:`set_progress`) applies as well.
        leave: keep the finished bar on screen (False for the inner bars of a larger job).

    A bar appears only once its job has run :func:`progress_delay` seconds, so a cache hit or a
    tiny job draws nothing.
    """
    from tqdm.auto import tqdm  # imported here so that `import embedtune.runtime` stays instant

    disable = not (enabled and progress_enabled()) or total == 0
    kwargs.setdefault("delay", progress_delay())
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, initial=initial, disable=disable, dynamic_ncols=True, **kwargs)


class _Formatter(logging.Formatter):
    """Default level: INFO as the bare message, warnings and errors with their level; ``-v``: level, logger and time."""

    def __init__(self, verbose: bool) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s" if verbose else "%(message)s", datefmt="%H:%M:%S")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.verbose and record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        return text


def _short_warning(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    # No source path or source line: they name a dependency's file, which a user cannot act on.
    return f"{category.__name__}: {message}"


@contextmanager
def cli_logging(verbose: bool = False, quiet: bool = False) -> Iterator[None]:
    """Log to stderr the way the ``embedtune`` command does, for the duration of the block.

    ``verbose``: DEBUG lines too, with their logger and time, and warnings with their source.
    ``quiet``: warnings and errors only, and no progress bars. Logging, warning and progress
    settings are restored on exit, so tests can call the CLI in-process.
    """
    from tqdm.contrib.logging import logging_redirect_tqdm  # imported here so that `import embedtune.runtime` stays instant

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(verbose))
    saved_levels = {name: logging.getLogger(name).level for name in ("", *DEPENDENCY_LOGGERS)}
    saved_progress = _progress
    saved_formatwarning = warnings.formatwarning
    with ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        root.addHandler(handler)
        stack.callback(root.removeHandler, handler)
        root.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
        for name in DEPENDENCY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        warnings.simplefilter("default")  # each warning once per place it comes from
        if not verbose:
            for message, category, module, _why in DEPENDENCY_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category, module=module)
            warnings.formatwarning = _short_warning  # type: ignore[assignment]
        logging.captureWarnings(True)
        stack.callback(logging.captureWarnings, False)
        if quiet:
            set_progress(False)
        transformers_logging = sys.modules.get("transformers.utils.logging")
        if not verbose and transformers_logging is not None and transformers_logging.is_progress_bar_enabled():
            # Already imported (in-process callers): its bars for sub-second loads; `main` sets
            # HF_HUB_DISABLE_PROGRESS_BARS before the import otherwise. -v keeps them.
            transformers_logging.disable_progress_bar()
            stack.callback(transformers_logging.enable_progress_bar)
        try:
            with logging_redirect_tqdm(loggers=[root]):
                yield
        finally:
            set_progress(saved_progress)
            warnings.formatwarning = saved_formatwarning  # type: ignore[assignment]
            for name, level in saved_levels.items():
                logging.getLogger(name).setLevel(level)
