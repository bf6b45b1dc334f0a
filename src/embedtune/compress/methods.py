"""Import every compressor module so that each registers itself, in ``--method`` order."""

from embedtune.compress import (  # noqa: F401
    frozen,
    truncate,
    pca,
    autoencoder,
    mrl_adaptor,
    search_adaptor,
    smec,
    dive,
    csr,
)
