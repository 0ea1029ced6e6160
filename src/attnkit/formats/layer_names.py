"""The tensor names of a fairseq-style encoder-decoder Transformer, which fairseq's `transformer` and Hugging Face's
MarianMTModel share (HF took them from fairseq): one table from attnkit's names to theirs, read by the Marian
import and export and the fairseq import, and attnkit's own shapes to check a mapping against."""

from __future__ import annotations

import torch

from attnkit.config import TransformerConfig
from attnkit.models import Transformer

# How a tensor meets the residual stream's channel order: its columns read the stream, its rows (or entries) write
# it, or neither (q, k, v and FFN w1 biases live in head or FFN space).
READS, WRITES, AS_IS = "reads", "writes", "as is"


def _attention(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.in_proj.weight", tuple(f"{h}.{p}_proj.weight" for p in "qkv"), READS),
            (f"{a}.in_proj.bias", tuple(f"{h}.{p}_proj.bias" for p in "qkv"), AS_IS),
            (f"{a}.out_proj.weight", (f"{h}.out_proj.weight",), WRITES),
            (f"{a}.out_proj.bias", (f"{h}.out_proj.bias",), WRITES)]


def _norm(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.weight", (f"{h}.weight",), WRITES), (f"{a}.bias", (f"{h}.bias",), WRITES)]


def _ffn(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.w1.weight", (f"{h}.fc1.weight",), READS), (f"{a}.w1.bias", (f"{h}.fc1.bias",), AS_IS),
            (f"{a}.w2.weight", (f"{h}.fc2.weight",), WRITES), (f"{a}.w2.bias", (f"{h}.fc2.bias",), WRITES)]


def layer_table(n_encoder: int, n_decoder: int) -> list[tuple[str, tuple[str, ...], str]]:
    """(attnkit name, fairseq's names (Marian's without the `model.` prefix), how a channel order applies) for
    every tensor of the layers; several names are concatenated along dim 0 (q, k, v -> in_proj). The imports and
    the export read it; the vocabulary tensors (embeddings, output projection and bias) reorder rows too and are
    mapped apart."""
    rows = []
    for i in range(n_encoder):
        a, h = f"encoder.{i}", f"encoder.layers.{i}"
        rows += _attention(f"{a}.self_attn", f"{h}.self_attn")
        rows += _norm(f"{a}.attn_block.norm", f"{h}.self_attn_layer_norm")
        rows += _ffn(f"{a}.ffn", h) + _norm(f"{a}.ffn_block.norm", f"{h}.final_layer_norm")
    for i in range(n_decoder):
        a, h = f"decoder.{i}", f"decoder.layers.{i}"
        rows += _attention(f"{a}.self_attn", f"{h}.self_attn")
        rows += _norm(f"{a}.self_block.norm", f"{h}.self_attn_layer_norm")
        rows += _attention(f"{a}.cross_attn", f"{h}.encoder_attn")
        rows += _norm(f"{a}.cross_block.norm", f"{h}.encoder_attn_layer_norm")
        rows += _ffn(f"{a}.ffn", h) + _norm(f"{a}.ffn_block.norm", f"{h}.final_layer_norm")
    return rows


def reorder(t: torch.Tensor, how: str, order: torch.Tensor) -> torch.Tensor:
    """A tensor in the other side's channel order (Marian's sinusoid layout): READS permutes its columns, WRITES its
    rows (or entries)."""
    if how == READS:
        return t[:, order]
    return t[order] if how == WRITES else t


def model_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """attnkit's state-dict shapes for `config`, from a model built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Transformer.from_config(config).state_dict().items()}


__all__ = ["AS_IS", "READS", "WRITES", "layer_table", "model_shapes", "reorder"]
