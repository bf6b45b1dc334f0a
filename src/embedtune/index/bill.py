"""The bill of a stored setting: what its bytes per vector cost in RAM, on disk per query, and in money, at scale.

Pure arithmetic on a row's bytes, used by every plan and frontier table. A gigabyte here is
10^9 bytes (what cloud price lists mean by GB). The price is an assumption the caller states:
:data:`DEFAULT_PRICE_PER_GB_MONTH` is about what on-demand cloud RAM costs (see
:data:`PRICE_ASSUMPTION`), not a quote; pass your own (``compress plan --price-per-gb-month``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "BYTES_PER_GB",
    "DEFAULT_PRICE_PER_GB_MONTH",
    "PRICE_ASSUMPTION",
    "BILL_SCALES",
    "scale_label",
    "float32_bytes",
    "disk_read_per_query",
    "ram_at",
    "monthly_cost",
    "vector_bill",
    "bill_record",
    "BillLine",
    "bill_table",
]

#: Bytes in a gigabyte, as cloud price lists count them.
BYTES_PER_GB = 1_000_000_000
#: US dollars per GB of RAM per month that the bill assumes unless told otherwise.
DEFAULT_PRICE_PER_GB_MONTH = 6.0
#: Where :data:`DEFAULT_PRICE_PER_GB_MONTH` comes from, in words (printed with every bill).
PRICE_ASSUMPTION = ("an assumption, not a quote: about what RAM costs on an on-demand memory-optimised cloud instance "
                    "(e.g. a 16 GiB AWS r7i.large at about $0.13/hour is about $6 per GiB-month); "
                    "set your own with --price-per-gb-month")
#: The corpus sizes every bill is given at: a million, a hundred million and a billion vectors.
BILL_SCALES = (1_000_000, 100_000_000, 1_000_000_000)


def scale_label(n: int) -> str:
    """``1M``, ``100M``, ``1B``: the short name of a corpus size used in column names."""
    for unit, size in (("B", 1_000_000_000), ("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def float32_bytes(input_dim: int) -> int:
    """Bytes of one uncompressed float32 vector of ``input_dim`` dimensions."""
    if input_dim < 1:
        raise ValueError(f"input_dim must be positive; got {input_dim}.")
    return 4 * int(input_dim)


def disk_read_per_query(rescores_float: bool, dim: int, candidates: int) -> int:
    """Bytes a query reads from disk: ``candidates`` float32 vectors of ``dim`` dimensions when the setting rescores from
    disk, else none (a setting served from RAM alone reads nothing)."""
    return int(candidates) * 4 * int(dim) if rescores_float else 0


def ram_at(n_vectors: int, ram_bytes: float, fixed_bytes: float = 0.0) -> float:
    """Bytes of RAM that ``n_vectors`` vectors take at ``ram_bytes`` each, plus the tables that do not grow (``fixed_bytes``)."""
    if n_vectors < 0 or ram_bytes < 0 or fixed_bytes < 0:
        raise ValueError(f"counts and bytes must be non-negative; got n={n_vectors}, ram={ram_bytes}, fixed={fixed_bytes}.")
    return float(n_vectors) * float(ram_bytes) + float(fixed_bytes)


def monthly_cost(total_bytes: float, price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH) -> float:
    """Dollars a month to hold ``total_bytes`` in RAM at ``price_per_gb_month`` per GB (10^9 bytes)."""
    if not math.isfinite(price_per_gb_month) or price_per_gb_month < 0:
        raise ValueError(f"price per GB-month must be a non-negative number; got {price_per_gb_month}.")
    return total_bytes / BYTES_PER_GB * price_per_gb_month


def vector_bill(ram_bytes: float, input_dim: int, fixed_bytes: float = 0.0, disk_read: int = 0,
                price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH, scales: Sequence[int] = BILL_SCALES) -> dict[str, Any]:
    """The bill columns of one setting.

    Returns a dict with ``bytes_ram`` (per vector), ``disk_read_per_query`` (bytes read from disk
    per query), ``float32_share`` (``ram_bytes`` over the uncompressed float32 vector's bytes),
    ``vectors_per_gb`` (10^9 / ``ram_bytes``, tables left out), and for each corpus size ``n`` of
    ``scales`` ``ram_gb@<n>`` (GB of RAM, tables included) and ``usd_month@<n>`` (at the price).
    """
    if ram_bytes <= 0:
        raise ValueError(f"ram_bytes must be positive; got {ram_bytes}.")
    row: dict[str, Any] = {
        "bytes_ram": float(ram_bytes),
        "disk_read_per_query": int(disk_read),
        "float32_share": float(ram_bytes) / float32_bytes(input_dim),
        "vectors_per_gb": BYTES_PER_GB / float(ram_bytes),
    }
    for n in scales:
        total = ram_at(n, ram_bytes, fixed_bytes)
        row[f"ram_gb@{scale_label(n)}"] = total / BYTES_PER_GB
        row[f"usd_month@{scale_label(n)}"] = monthly_cost(total, price_per_gb_month)
    return row


def bill_record(price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH, scales: Sequence[int] = BILL_SCALES) -> Mapping[str, Any]:
    """What a plan records about its bill: the price, whether it is the default assumption, the GB and the scales."""
    monthly_cost(0.0, price_per_gb_month)  # validates the price
    return {"price_per_gb_month": float(price_per_gb_month), "currency": "USD", "bytes_per_gb": BYTES_PER_GB,
            "price_source": PRICE_ASSUMPTION if price_per_gb_month == DEFAULT_PRICE_PER_GB_MONTH else "given by the user",
            "scales": [int(n) for n in scales], "ram": "bytes per vector x vectors + what is held once (codebooks, ranges, rotations, the map's weights)"}


class BillLine(NamedTuple):
    """One row of :func:`bill_table`: a label (the budget), the setting's name, its bytes, and what it reads from disk."""

    label: str
    setting: str
    ram_bytes: float
    fixed_bytes: float = 0.0
    disk_read: str = "–"


def _gigabytes(value: float) -> str:
    """Three significant digits below 100 GB, whole gigabytes above (``0.0449``, ``3.21``, ``1,536``)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def bill_table(lines: Sequence[BillLine], input_dim: int, price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH,
               scales: Sequence[int] = BILL_SCALES, disk_header: str = "read from disk per query") -> list[str]:
    """A Markdown table of the bills of ``lines``, float32 first: bytes, share of float32, vectors per GB, RAM and $ at scale.

    The reports' form of :func:`vector_bill`: RAM at each of ``scales`` includes the fixed tables, and the
    dollars are at the largest scale. ``disk_header`` names the last column (each line's ``disk_read``).
    """
    labels = [scale_label(n) for n in scales]
    largest = labels[-1]
    out = [f"| budget | setting | RAM B / vector | share of float32 bytes | vectors per GB | RAM at {' / '.join(labels)} (GB) "
           f"| $/month at {largest} (at ${price_per_gb_month:g}/GB-month) | {disk_header} |", "|---|---|---|---|---|---|---|---|"]
    for line in (BillLine("float32", "`float32`", float32_bytes(input_dim)), *lines):
        bill = vector_bill(line.ram_bytes, input_dim, line.fixed_bytes, 0, price_per_gb_month, scales)
        ram = " / ".join(_gigabytes(bill[f"ram_gb@{label}"]) for label in labels)
        out.append(f"| {line.label} | {line.setting} | {line.ram_bytes:g} | {100 * bill['float32_share']:.2f} % | {bill['vectors_per_gb']:,.0f} "
                   f"| {ram} | ${bill[f'usd_month@{largest}']:,.0f} | {line.disk_read} |")
    return out
