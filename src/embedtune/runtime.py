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

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

__all__ = [
    "set_threads",
    "thread_budget",
    "single_threaded",
    "map_single_threaded",
    "default_threads",
    "busy_machine_hint",
    "set_progress",
    "progress_enabled",
    "progress_bar",
    "progress_delay",
    "cli_logging",
    "DEPENDENCY_LOGGERS",
    "DEPENDENCY_WARNINGS",
    "verbose_enabled",
    "native_chatter_filtered",
    "FAISS_CHATTER",
    "RAY_CHATTER",
]

# Dependencies whose INFO lines are their internals, not ours: WARNING and above only, even with -v.
DEPENDENCY_LOGGERS = ("faiss.loader", "faiss", "sentence_transformers", "httpx", "httpcore", "urllib3", "filelock",
                      "transformers", "datasets", "accelerate", "torch", "PIL", "matplotlib", "peft", "huggingface_hub")

# (message regex, category, module regex, why it is harmless here): filtered at the default level, shown with -v.
DEPENDENCY_WARNINGS: tuple[tuple[str, type[Warning], str, str], ...] = (
    (r".*`is_gradient_checkpointing` is deprecated.*", FutureWarning, r"transformers\.",
     "transformers 5 deprecating an attribute that PEFT reads when LoRA is attached (every PACE stage); nothing a user can change"),
    (r".*", DeprecationWarning, r"ray\.",
     "Ray Data deprecating its own DataContext fields, warned when it builds its default context (embed-corpus --ray-actors)"),
    (r"lancedb fork support is experimental", RuntimeWarning, r"",
     "LanceDB, once imported, warns in every forked child (a Ray worker, a multiprocessing fork) that its runtime was reset there; "
     "embedtune's children never use LanceDB"),
)

_progress = True
_verbose = False

# Lines native code prints straight to the stderr file descriptor that say nothing a user acts on:
# hidden at the default level and with -q, shown with -v. FAISS's k-means warns on every PQ/OPQ
# sub-quantiser it trains on fewer than 39 points per centroid (a 5k-document corpus: always).
FAISS_CHATTER = (r"^WARNING clustering \d+ points to \d+ centroids",)
# Ray's core (C++) logs this for every Ray Data actor pool: Ray Data keeps the map function in the object store.
# gRPC's core logs the second when the process forks (Ray's workers) while another library's gRPC
# threads run (a Qdrant or Milvus client loaded earlier in the same process).
RAY_CHATTER = (r"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store",
               r"fork_posix\.cc:\d+\] Other threads are currently calling into gRPC, skipping fork\(\) handlers")


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads in torch (intra-op), FAISS (OpenMP) and BLAS (numpy), together.

    One budget for all three: each of them alone defaults to every core, and when other processes
    hold some of those cores their spinning threads wait on each other (a DIVE fit on a busy
    2-core machine: 1:28 on one thread, 10:53 on the defaults). Tokenizers stay single-threaded
    (``TOKENIZERS_PARALLELISM=false``, set by the CLI).
    """
    global _thread_budget
    if threads < 1:
        raise ValueError(f"threads must be >= 1; got {threads}.")
    _thread_budget = int(threads)
    _set_threads_of("torch", threads)
    _set_threads_of("faiss", threads)
    _limit_blas(threads)


_thread_budget: int | None = None


def thread_budget() -> int:
    """Threads embedtune's own numpy loops may split their work over (the trellis encoder's blocks).

    What :func:`set_threads` was last given (the command line's ``--threads``), else ``OMP_NUM_THREADS`` (as torch, FAISS and
    BLAS read it), else the cores this process may run on. Only work that splits into independent pieces with the same
    result uses it.
    """
    if _thread_budget is not None:
        return _thread_budget
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    return max(1, _affinity_cores())


def _affinity_cores() -> int:
    """The cores this process may run on (its CPU affinity; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _limit_blas(threads: int) -> None:
    """Limit every BLAS loaded so far to ``threads`` threads."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its own default
        pass


@contextmanager
def single_threaded() -> Iterator[None]:
    """BLAS, LAPACK and OpenMP (numpy's, FAISS's and torch's) on one thread inside the block, whatever ``--threads`` says.

    OpenBLAS splits some products and decompositions differently on different thread counts and so rounds them
    differently: ``np.linalg.eigh`` of the same covariance, a float32 Gram matrix ``XᵀX`` or FAISS's linear transforms
    differ in their last bits between 1 and 2 threads, and a codec's k-means then walks off to other codebooks. Codec
    fits and encodes run inside this block, and so give the tables and codes they give on one thread on any machine: a
    plan made on a laptop and ``index build --plan`` run on a server write the same codes. OpenMP is limited too:
    FAISS's OpenBLAS runs its threads in whichever OpenMP runtime was loaded first (torch's, once torch is imported),
    which a BLAS-only limit does not reach.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency
        yield
        return
    with threadpool_limits(limits=1):
        yield


_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def map_single_threaded(function: Callable[[_Item], _Result], items: Sequence[_Item], workers: int | None = None) -> list[_Result]:
    """``[function(item) for item in items]``, on ``workers`` threads (default :func:`thread_budget`), each computing as on one.

    For independent pieces of a fit that must give the bits they give on one thread (:func:`single_threaded`): each
    worker limits its own OpenMP to one thread (a per-thread setting; FAISS's OpenBLAS follows it) and BLAS to one, so
    the results do not depend on ``workers``, only the time does. numpy and FAISS release the GIL, so the workers run
    side by side.
    """
    from concurrent.futures import ThreadPoolExecutor

    workers = min(len(items), workers if workers is not None else thread_budget())
    if workers <= 1:
        with single_threaded():
            return [function(item) for item in items]

    def one(item: _Item) -> _Result:
        with single_threaded():
            return function(item)

    with single_threaded(), ThreadPoolExecutor(max_workers=workers) as pool:  # BLAS is process-wide: one thread throughout
        return list(pool.map(one, items))


class _ThreadsOnImport(importlib.abc.MetaPathFinder):
    """Calls ``module.<setter>(threads)`` the moment ``module`` is imported.

    torch takes about a second to import and FAISS a fifth: a command that never uses them (``--help``,
    ``compress apply`` on a PCA) does not pay for them just to set their threads.
    """

    def __init__(self, module: str, setter: str) -> None:
        self.module, self.setter, self.threads = module, setter, 1

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.util.find_spec(fullname)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module, setter, threads = loader.exec_module, self.setter, self.threads

        def exec_module(module: Any) -> None:
            run_module(module)
            getattr(module, setter)(threads)
            _limit_blas(threads)  # a BLAS the module brought along (FAISS bundles OpenBLAS) gets the same budget

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_ON_IMPORT = {"torch": _ThreadsOnImport("torch", "set_num_threads"), "faiss": _ThreadsOnImport("faiss", "omp_set_num_threads")}


def _set_threads_of(module: str, threads: int) -> None:
    """``<module>.<setter>(threads)`` now if ``module`` is imported, else as it is imported."""
    hook = _ON_IMPORT[module]
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, hook.setter):
        getattr(loaded, hook.setter)(threads)
        return
    hook.threads = threads
    if hook not in sys.meta_path:
        sys.meta_path.insert(0, hook)


def _cgroup_cpus() -> float | None:
    """CPUs a cgroup-v2 quota allows this process (``cpu.max``: quota and period), or None without one."""
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max", encoding="ascii").read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1.0, int(quota) / int(period))
    except (ValueError, ZeroDivisionError):
        return None


def _cpu_times() -> tuple[float, float] | None:
    """(idle, total) jiffies of all CPUs from ``/proc/stat``'s ``cpu`` line, or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    try:
        values = [float(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is inside user)
    except ValueError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # iowait is a CPU free to compute
    return idle, sum(values)


def _busy_cores(sample_seconds: float = 0.1) -> float | None:
    """Cores busy over the next ``sample_seconds`` (all CPUs' non-idle share times their count), or None."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(sample_seconds)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    busy_share = 1.0 - (second[0] - first[0]) / (second[1] - first[1])
    return max(0.0, busy_share) * (os.cpu_count() or 1)


def default_threads() -> int:
    """The threads a command uses without ``--threads``: the cores this process may run on, at least 1.

    Its CPU affinity, capped by a cgroup quota; the ``EMBEDTUNE_THREADS`` environment variable overrides it. It does
    not follow the machine's load: OpenBLAS and FAISS round some sums differently on different thread counts, so a
    default of the cores free at launch (as it was) made the same ``compress plan`` score its settings differently on
    a busy machine and on an idle one, and once choose other tables (NPL: 0.4586 and 0.4495 nDCG@10 on the same
    test queries). The same command, data and seed now give the same results on the same machine, busy or not. On a
    busy machine fewer threads are often faster; :func:`busy_machine_hint` says so, and ``--threads`` chooses.
    """
    override = os.environ.get("EMBEDTUNE_THREADS", "").strip()
    if override:
        try:
            value = int(override)
        except ValueError:
            raise ValueError(f"EMBEDTUNE_THREADS must be an integer >= 1; got {override!r}.") from None
        if value < 1:
            raise ValueError(f"EMBEDTUNE_THREADS must be an integer >= 1; got {value}.")
        return value
    return _usable_cores()


def _usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup quota, at least 1."""
    cores = float(_affinity_cores())
    quota = _cgroup_cpus()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, int(cores))


def busy_machine_hint(threads: int) -> str | None:
    """A line of advice where ``threads`` is more than the cores free now, else None.

    Threads that wait for cores other processes hold cost more than they bring: a DIVE fit on a 2-core machine at
    load 8 took 152.6 s on 2 threads against 14.7 s on one (benchmarks/results/threads-memory.md). "Free now" is
    sampled from ``/proc/stat`` over a tenth of a second (the 1-minute load average still counts a command that ended
    seconds ago); without it, the load average.
    """
    busy = _busy_cores()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    cores = _usable_cores()
    free = max(1, min(cores, int(cores - busy + 0.5)))
    if threads <= free:
        return None
    return (f"about {cores - free} of {cores} cores are busy with other work; running on {threads} threads, which gives "
            f"the same results as on an idle machine. On a busy machine fewer threads are often faster: "
            f"`embedtune --threads {free} ...` (or EMBEDTUNE_THREADS={free}); results are reproducible for a given thread count.")


def verbose_enabled() -> bool:
    """Whether ``embedtune -v`` (:func:`cli_logging` with ``verbose``) is in effect."""
    return _verbose


@contextmanager
def native_chatter_filtered(patterns: tuple[str, ...] = FAISS_CHATTER) -> Iterator[None]:
    """Drop the lines matching ``patterns`` that native code (FAISS, Ray's core) writes to fd 2 inside the block.

    fd 2 goes through a pipe for the duration; a thread passes every other line (and bar redraw,
    which ends in ``\\r``) on to the real stderr as it comes, so bars stay live. The number hidden
    is logged at DEBUG. With ``-v`` nothing is filtered.
    """
    import re
    import threading

    if _verbose:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (an embedding host): nothing to filter
        yield
        return
    compiled = [re.compile(p) for p in patterns]
    read_end, write_end = os.pipe()
    hidden = [0]

    def emit(data: bytes) -> None:
        out = []
        for piece in re.split(rb"(?<=[\r\n])", data):
            if piece and any(c.search(piece.decode("utf-8", "replace")) for c in compiled):
                hidden[0] += 1
            elif piece:
                out.append(piece)
        if out:
            os.write(saved, b"".join(out))

    def forward() -> None:
        import select

        pending = b""
        while True:
            ready, _, _ = select.select([read_end], [], [], 0.05)
            if not ready:  # quiet for 50 ms: a bar's redraw ends without a line break; pass it on now
                if pending:
                    emit(pending)
                    pending = b""
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:
                emit(pending)
                os.close(read_end)
                return
            pending += chunk
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
            if cut:
                emit(pending[:cut])
                pending = pending[cut:]

    thread = threading.Thread(target=forward, name="embedtune-native-stderr", daemon=True)
    thread.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread reads to the end and stops
        thread.join(timeout=10)
        if not thread.is_alive():  # else something still holds a copy of the pipe; leave the thread its stderr
            os.close(saved)
        if hidden[0]:
            logging.getLogger(__name__).debug("hid %d lines of native-library chatter (-v shows them)", hidden[0])


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
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(verbose))
    saved_levels = {name: logging.getLogger(name).level for name in ("", *DEPENDENCY_LOGGERS)}
    saved_progress = _progress
    global _verbose
    saved_verbose, _verbose = _verbose, bool(verbose)
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
        if not quiet:  # log lines above the bars; quiet draws no bars, and skips the redirect's import (20 ms)
            from tqdm.contrib.logging import logging_redirect_tqdm

            stack.enter_context(logging_redirect_tqdm(loggers=[root]))
        try:
            yield
        finally:
            set_progress(saved_progress)
            _verbose = saved_verbose
            warnings.formatwarning = saved_formatwarning  # type: ignore[assignment]
            for name, level in saved_levels.items():
                logging.getLogger(name).setLevel(level)
