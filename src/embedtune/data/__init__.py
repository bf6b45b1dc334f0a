"""BEIR loading, query-disjoint splits and training triplets."""

from embedtune.data.beir import BUNDLED_DATASETS, BeirDataset, document_text, load_beir, resolve_dataset_path
from embedtune.data.errors import DataFormatError
from embedtune.data.splits import QuerySplit, query_disjoint_split

__all__ = [
    "BUNDLED_DATASETS",
    "BeirDataset",
    "DataFormatError",
    "QuerySplit",
    "document_text",
    "load_beir",
    "query_disjoint_split",
    "resolve_dataset_path",
]
