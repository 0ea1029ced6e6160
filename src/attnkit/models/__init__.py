"""Model families, one file each; `build_model` makes any of them from its kind (attnkit.config.FAMILIES)."""

from __future__ import annotations

from torch import nn

from attnkit.config import family
from attnkit.models import rnn, rnn_lm, transformer, transformer_xl
from attnkit.models.transformer import DecoderState, Encoded, Transformer

_MODULES = {"transformer": transformer, "transformer_xl": transformer_xl, "rnn": rnn, "rnn_lm": rnn_lm}


def model_class(kind: str) -> type[nn.Module]:
    """The class that builds a model kind, as its family names it."""
    module, name = family(kind).model.split(":")
    return getattr(_MODULES[module], name)


def build_model(kind: str, config) -> nn.Module:
    return model_class(kind).from_config(config)


__all__ = ["DecoderState", "Encoded", "Transformer", "build_model", "model_class"]
