"""Import every compressor module so that each registers itself, in ``--method`` order.

Modules not written yet are skipped, so the registry always lists what is importable.
"""

import importlib

_MODULES = [
    "embedtune.compress.frozen",
    "embedtune.compress.truncate",
    "embedtune.compress.pca",
    "embedtune.compress.autoencoder",
    "embedtune.compress.mrl_adaptor",
    "embedtune.compress.search_adaptor",
    "embedtune.compress.smec",
    "embedtune.compress.dive",
]

for _name in _MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as _error:
        if _error.name != _name:
            raise
