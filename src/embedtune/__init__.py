"""embedtune: smaller and better retrieval embeddings.

DIVE compresses frozen embeddings with a multi-head residual adapter; PACE fine-tunes the
embedding model progressively. See the README for the two-command quick start.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
