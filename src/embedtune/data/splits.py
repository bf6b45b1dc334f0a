"""Query-disjoint train/validation/test splits, as in the DIVE paper (§4.1, "Training Protocol").

Three protocols:

- ``query_disjoint_split`` (the paper's): one qrels split's judged queries cut 60/20/20;
- ``train_qrels_split`` (``beir-train``): train and validation from the dataset's own train
  qrels, test = every judged query of the test qrels, for a larger, lower-variance test set;
- ``positive_disjoint_folds``: every judged query is tested once, by a fit on folds that share no
  positive document with it. A query-disjoint split still lets a test query's relevant document be
  a training query's positive (a "seen" query); these folds make every test query "unseen", so a
  supervised gain is measured where users need it, on all the judged queries instead of the few
  unseen ones a single split leaves.

Judged query ids are ranked by ``sha256(f"{seed}:{query_id}")`` (hex digest order) and cut at
the given fractions (60/20/20 by default). The manifest records the seed, fractions, counts,
query ids and the sha256 of every source file, and is byte-identical across re-runs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedtune import __version__
from embedtune.data.beir import BeirDataset
from embedtune.errors import NoQueriesError
from embedtune.io import atomic_write_json

__all__ = ["QuerySplit", "query_disjoint_split", "train_qrels_split", "positive_components", "positive_disjoint_folds",
           "rank_by_hash", "DEFAULT_FRACTIONS", "DEFAULT_SEED"]

DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)
DEFAULT_SEED = 2027
PARTS = ("train", "val", "test")


@dataclass(frozen=True)
class QuerySplit:
    """Disjoint query-id lists, each sorted by rank, plus everything needed to reproduce them."""

    train: list[str]
    val: list[str]
    test: list[str]
    seed: int
    fractions: tuple[float, float, float]
    dataset: str
    qrels_split: str
    fingerprints: dict[str, str]
    #: ``(fold, n_folds)`` for one fold of :func:`positive_disjoint_folds`; None for a single split.
    fold: tuple[int, int] | None = None

    @property
    def train_val(self) -> list[str]:
        return self.train + self.val

    def part(self, name: str) -> list[str]:
        """The query ids of one part (``train``, ``val``, ``test`` or ``train+val``).

        Raises:
            NoQueriesError: the part is empty, with the reason (a fraction of 0, or too few
                judged queries for the fractions) and the fix, so nothing is trained or scored
                on zero queries.
        """
        if name == "train+val":
            ids = self.train_val
        elif name not in PARTS:
            raise ValueError(f"unknown split part {name!r}; choose train, val, test or train+val.")
        else:
            ids = getattr(self, name)
        if not ids:
            raise NoQueriesError(self._why_empty(name))
        return ids

    def _why_empty(self, name: str) -> str:
        parts = ["train", "val"] if name == "train+val" else [name]
        fraction = sum(self.fractions[PARTS.index(p)] for p in parts)
        n = len(self.train) + len(self.val) + len(self.test)
        where = (f"{self.dataset}: the query-disjoint split (seed {self.seed}, fractions "
                 f"{'/'.join(f'{f:g}' for f in self.fractions)}) of the {n} judged queries of qrels {self.qrels_split!r}")
        label = {"val": "validation"}.get(name, name)
        if "+" in self.qrels_split:  # beir-train: train and validation both come from the train qrels
            return (f"{self.dataset}: the beir-train split (seed {self.seed}) of qrels {self.qrels_split!r} leaves 0 {label} "
                    f"queries ({len(self.train) + len(self.val)} judged train queries). Fix: the train qrels need at least 2 "
                    "judged queries, or use the paper protocol.")
        if fraction <= 0:
            return f"{where} has no {label} queries: its fraction is 0. Fix: give the {label} part a fraction above 0."
        needed = math.ceil(0.5 / fraction)
        return (f"{where} leaves 0 {label} queries ({n} x {fraction:g} rounds to 0). Fix: use a dataset with at least "
                f"{needed} judged queries, or a larger {label} fraction.")

    def manifest(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "qrels_split": self.qrels_split,
            "seed": self.seed,
            "fractions": dict(zip(PARTS, self.fractions)),
            "counts": {name: len(getattr(self, name)) for name in PARTS},
            "query_ids": {name: getattr(self, name) for name in PARTS},
            "source_sha256": dict(sorted(self.fingerprints.items())),
            "rank_rule": "sha256(f'{seed}:{query_id}').hexdigest(), ascending",
            **({"fold": self.fold[0], "n_folds": self.fold[1], "fold_rule": FOLD_RULE} if self.fold else {}),
            "embedtune_version": __version__,
        }

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.manifest())


def rank_by_hash(ids: Iterable[str], seed: int) -> list[str]:
    """``ids`` sorted by ``sha256(f"{seed}:{id}")`` (hex digest, ascending), ties by the id itself.

    The one query-id ranking of the project: every split (train/val/test, the epoch-selection
    hold-out, the validation hold-out of ``fit``) takes a prefix of it, so a split depends on
    the ids and the seed only, not on their order.
    """
    return sorted(ids, key=lambda query_id: (hashlib.sha256(f"{seed}:{query_id}".encode("utf-8")).hexdigest(), query_id))


def query_disjoint_split(
    dataset: BeirDataset,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    seed: int = DEFAULT_SEED,
) -> QuerySplit:
    """Split the judged queries of ``dataset.qrels`` into disjoint train/val/test parts.

    Sizes are ``round(n·f_train)``, ``round(n·f_val)`` and the remainder for test.
    """
    fractions = tuple(float(f) for f in fractions)  # type: ignore[assignment]
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1 (train, val, test); got {fractions}.")
    ranked = rank_by_hash(dataset.judged_query_ids(), seed)
    if not ranked:
        raise ValueError(f"{dataset.source}: qrels split {dataset.split!r} has no judged queries to split.")
    n_train = int(round(len(ranked) * fractions[0]))
    n_val = int(round(len(ranked) * fractions[1]))
    n_val = min(n_val, len(ranked) - n_train)
    return QuerySplit(
        train=ranked[:n_train],
        val=ranked[n_train : n_train + n_val],
        test=ranked[n_train + n_val :],
        seed=seed,
        fractions=fractions,  # type: ignore[arg-type]
        dataset=dataset.name,
        qrels_split=dataset.split,
        fingerprints=dict(dataset.fingerprints),
    )


def train_qrels_split(
    train: BeirDataset, test: BeirDataset, val_fraction: float = 0.2, seed: int = DEFAULT_SEED
) -> QuerySplit:
    """The ``beir-train`` protocol: train/val from ``train``'s judged queries, test = all of ``test``'s.

    Train queries are ranked by ``sha256(f"{seed}:{query_id}")`` and the first
    ``round(n·val_fraction)`` become validation. A query judged in both qrels files would leak
    test labels into training, so it is an error.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction!r}.")
    train_ids, test_ids = train.judged_query_ids(), test.judged_query_ids()
    if not train_ids:
        raise ValueError(f"{train.source}: qrels split {train.split!r} has no judged queries; the beir-train protocol needs qrels/train.tsv.")
    if not test_ids:
        raise ValueError(f"{test.source}: qrels split {test.split!r} has no judged queries to test on.")
    shared = set(train_ids) & set(test_ids)
    if shared:
        raise ValueError(
            f"{train.source}: {len(shared)} queries are judged in both qrels/{train.split}.tsv and qrels/{test.split}.tsv "
            f"(e.g. {sorted(shared)[0]!r}); the beir-train protocol needs disjoint queries. Use the paper protocol instead."
        )
    ranked = rank_by_hash(train_ids, seed)
    n_val = min(len(ranked) - 1, max(1, int(round(len(ranked) * val_fraction))))
    test_ranked = rank_by_hash(test_ids, seed)
    n_all = len(ranked) + len(test_ranked)
    return QuerySplit(
        train=ranked[n_val:],
        val=ranked[:n_val],
        test=test_ranked,
        seed=seed,
        fractions=((len(ranked) - n_val) / n_all, n_val / n_all, len(test_ranked) / n_all),
        dataset=test.name,
        qrels_split=f"{train.split}+{test.split}",
        fingerprints={**train.fingerprints, **test.fingerprints},
    )


FOLD_RULE = ("queries that share a positive document form one group (connected components); groups, largest first "
             "(ties by the hash rank of their first query), each go to the fold with the fewest queries so far (ties: the lower fold); "
             "validation: whole groups of the other folds, in hash-rank order, each that keeps it within val_fraction of their queries "
             "(else the smallest group)")


def positive_components(qrels: Mapping[str, Mapping[str, int]], query_ids: Iterable[str]) -> list[list[str]]:
    """The queries of ``query_ids`` grouped so that two queries share a group iff a chain of shared positives links them.

    A positive is a document judged above 0; a query with none is a group of its own. Each group
    keeps the order of ``query_ids`` (a repeated id counts once), and the groups come in the order
    of their first query. Selection hold-outs (:mod:`embedtune.compress.holdout`) and the
    positive-disjoint folds both group queries this way.

    >>> positive_components({"a": {"d1": 1}, "b": {"d1": 2, "d2": 1}, "c": {"d2": 1}, "e": {"d9": 1}}, "ceab")
    [['c', 'a', 'b'], ['e']]
    """
    ids = list(dict.fromkeys(query_ids))
    parent = {q: q for q in ids}

    def root(q: str) -> str:
        while parent[q] != q:
            parent[q] = parent[parent[q]]
            q = parent[q]
        return q

    owner: dict[str, str] = {}
    for q in ids:
        for doc, grade in (qrels.get(q) or {}).items():
            if grade <= 0:
                continue
            if doc in owner:
                parent[root(q)] = root(owner[doc])
            else:
                owner[doc] = q
    groups: dict[str, list[str]] = {}
    for q in ids:
        groups.setdefault(root(q), []).append(q)
    return list(groups.values())


def positive_disjoint_folds(
    dataset: BeirDataset, n_folds: int = 5, seed: int = DEFAULT_SEED, val_fraction: float = 0.2
) -> list[QuerySplit]:
    """``n_folds`` splits of ``dataset``'s judged queries: fold ``i`` tests on its own queries, none of
    whose positives is a positive of a train or validation query of that fold.

    Queries linked by shared positives (:func:`positive_components`) stay together, so the folds are
    as balanced as the groups allow: a collection whose queries mostly share documents (one group
    holding most of them) gives one large fold and small ones, and the manifest's counts say so.
    Train and validation are the other folds' queries, validation whole groups in hash-rank order,
    each that keeps it within ``val_fraction`` of them (if none fits, the smallest group). The same dataset and seed give the same folds.

    Raises:
        ValueError: fewer than 2 folds, a ``val_fraction`` outside [0, 1), or fewer groups than folds.
    """
    if n_folds < 2:
        raise ValueError(f"n_folds must be at least 2; got {n_folds!r}.")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1); got {val_fraction!r}.")
    ranked = rank_by_hash(dataset.judged_query_ids(), seed)
    if not ranked:
        raise ValueError(f"{dataset.source}: qrels split {dataset.split!r} has no judged queries to split.")
    position = {q: i for i, q in enumerate(ranked)}
    groups = [sorted(g, key=position.__getitem__) for g in positive_components(dataset.qrels, ranked)]
    if len(groups) < n_folds:
        raise ValueError(f"{dataset.source}: its {len(ranked)} judged queries form {len(groups)} groups that share positives, "
                         f"fewer than the {n_folds} folds asked for. Fix: ask for at most {len(groups)} folds.")
    groups.sort(key=lambda g: (-len(g), position[g[0]]))
    members: list[list[list[str]]] = [[] for _ in range(n_folds)]
    sizes = [0] * n_folds
    for group in groups:
        fold = min(range(n_folds), key=lambda f: (sizes[f], f))
        members[fold].append(group)
        sizes[fold] += len(group)
    splits = []
    for fold in range(n_folds):
        test = sorted((q for g in members[fold] for q in g), key=position.__getitem__)
        rest = sorted((g for f in range(n_folds) if f != fold for g in members[f]), key=lambda g: position[g[0]])
        n_rest = sum(len(g) for g in rest)
        val: list[str] = []
        train: list[str] = []
        for group in rest:  # a group that would take validation past its share trains instead
            (val if len(val) + len(group) <= val_fraction * n_rest else train).extend(group)
        if not val and val_fraction > 0 and len(rest) > 1:  # every group too large: the smallest one validates
            smallest = min(rest, key=lambda g: (len(g), position[g[0]]))
            val, moved = list(smallest), set(smallest)
            train = [q for q in train if q not in moved]
        n_all = len(ranked)
        splits.append(QuerySplit(
            train=sorted(train, key=position.__getitem__),
            val=sorted(val, key=position.__getitem__),
            test=test,
            seed=seed,
            fractions=(len(train) / n_all, len(val) / n_all, len(test) / n_all),
            dataset=dataset.name,
            qrels_split=dataset.split,
            fingerprints=dict(dataset.fingerprints),
            fold=(fold, n_folds),
        ))
    return splits
