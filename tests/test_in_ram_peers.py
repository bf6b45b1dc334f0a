"""benchmarks/in_ram_peers.py: each installed peer builds, searches exhaustively and holds the bytes asked.

2,000 random unit vectors at d=64, budget 16 B (the module's peers come from the optional
``peers`` extra: ``pip install -e .[peers]``; each test skips when its package is absent).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import in_ram_peers as peers  # noqa: E402

N, D, NQ, K = 2000, 64, 100, 10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    xb = rng.standard_normal((N, D)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    # Queries near corpus points, so the top 10 stand out from the rest as real embeddings' do.
    xq = xb[rng.choice(N, NQ, replace=False)] + 0.5 * rng.standard_normal((NQ, D)).astype(np.float32) / np.sqrt(D)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    _, truth = peers.exact_search(xb, xq, K)
    return xb, xq, truth


def recall_at_k(I: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(I, truth)]))


def check(index, xq, truth, budget, floor):
    D, I = peers.search(index, xq, K)
    assert D.shape == I.shape == (NQ, K)
    assert D.dtype == np.float32 and I.dtype == np.int64
    assert ((I >= 0) & (I < N)).all()
    assert (np.diff(D, axis=1) <= 1e-5).all(), "scores must come best first, higher is better"
    assert peers.ram_bytes(index) == index.ram_bytes == budget
    assert index.fit_s >= 0 and index.held_bytes >= index.ram_bytes
    assert recall_at_k(I, truth) > floor


@pytest.mark.parametrize("name, floor", [("scann-ah", 0.5), ("scann-ah256", 0.5)])
def test_scann_ah_at_16_bytes(data, name, floor):
    pytest.importorskip("scann")
    xb, xq, truth = data
    index = peers.PEERS[name](xb, 16, 0)
    assert index is not None
    blocks = {"scann-ah": 32, "scann-ah256": 16}[name]  # 4-bit blocks (LUT16) or 8-bit blocks (LUT256)
    assert index.params["blocks"] == blocks and index.params["dims_per_block"] == D // blocks
    check(index, xq, truth, 16, floor)
    # LUT16 keeps the unpacked 1-byte-per-block codes besides the packed ones (measured): 3x the code.
    assert index.held_bytes == (48 if name == "scann-ah" else 16)


def test_scann_uneven_blocks_still_exact_bytes(data):
    pytest.importorskip("scann")
    xb, xq, truth = data
    index = peers.build_scann_ah(xb[:, :48].copy(), 16, 0)  # 32 blocks over 48 dims: 16 of 2 dims, 16 of 1
    assert index is not None and index.params["blocks"] == 32 and index.ram_bytes == 16
    assert peers.build_scann_ah(xb, 40, 0) is None  # 80 four-bit blocks would need 80 dims
    assert "80 dimensions" in peers.infeasible_reason("scann-ah", D, 40)


def test_scann_int8_reorder_counts_the_int8_copy(data):
    pytest.importorskip("scann")
    xb, xq, truth = data
    assert peers.PEERS["scann-ah+int8-reorder"](xb, 16, 0) is None  # the int8 copy alone is 64 B
    assert "int8" in peers.infeasible_reason("scann-ah+int8-reorder", D, 16)
    index = peers.PEERS["scann-ah+int8-reorder"](xb, 96, 0)  # 32 B AH code (64 blocks of 1 dim) + 64 B int8
    assert index is not None and index.params["ah_code_bytes"] == 32
    check(index, xq, truth, 96, 0.9)


def test_rabitq_ext(data):
    pytest.importorskip("rabitqlib")
    xb, xq, truth = data
    # 1 bit at d=64 is an 8 B code + 12 B of factors: 16 B is out of reach.
    assert peers.PEERS["rabitq-ext"](xb, 16, 0) is None
    assert "20 B" in peers.infeasible_reason("rabitq-ext", D, 16)
    # 2 bits: 16 B code + 12 B + 8 B factors = 36 B exactly (measured from the saved index, not assumed).
    index = peers.PEERS["rabitq-ext"](xb, 36, 0)
    assert index is not None and index.params["nbits"] == 2
    check(index, xq, truth, 36, 0.5)
    assert index.held_bytes == 40  # + the uint32 id the IVF keeps per vector
    # A budget between two bit widths gets the largest code that fits, and says so.
    index = peers.PEERS["rabitq-ext"](xb, 43, 0)  # 3 bits would be 44 B
    assert index.params["nbits"] == 2 and index.ram_bytes == 36 <= 43
