"""Process-wide runtime settings shared by the CLI and the benchmarks."""

from __future__ import annotations

__all__ = ["set_threads"]


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads in torch and FAISS (small adapters train fastest on 1 when cores are busy)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1; got {threads}.")
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
