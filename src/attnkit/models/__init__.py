"""Model families, one file each, and the registry that builds them by name."""

from attnkit.models.registry import MODELS, build_model
from attnkit.models.transformer import DecoderState, Encoded, Transformer

__all__ = ["MODELS", "DecoderState", "Encoded", "Transformer", "build_model"]
