"""Model kinds by name: a checkpoint records its kind, and the loader builds the right class."""

from __future__ import annotations

from torch import nn

from attnkit.config import TransformerConfig
from attnkit.errors import CheckpointError
from attnkit.models.transformer import Transformer

MODELS: dict[str, tuple[type[nn.Module], type]] = {
    Transformer.kind: (Transformer, TransformerConfig),
}


def build_model(kind: str, config) -> nn.Module:
    if kind not in MODELS:
        raise CheckpointError(f"unknown model kind '{kind}' (known: {', '.join(sorted(MODELS))})")
    cls, _ = MODELS[kind]
    return cls.from_config(config)
