"""attnkit: train, run, measure and understand attention models.

The names below are imported on first use, so that `import attnkit` (and `attnkit --help`) stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "RunConfig": "attnkit.config",
    "TrainConfig": "attnkit.config",
    "TransformerConfig": "attnkit.config",
    "SubwordTokenizer": "attnkit.data",
    "prepare": "attnkit.data",
    "Translation": "attnkit.decode",
    "Translator": "attnkit.decode",
    "greedy_search": "attnkit.decode",
    "score_corpus": "attnkit.eval",
    "Transformer": "attnkit.models",
    "Trainer": "attnkit.train.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
