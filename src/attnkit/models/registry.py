"""Model kinds by name: a checkpoint records its kind, and the loader builds the right class."""

from __future__ import annotations

from torch import nn

from attnkit.config import RNNConfig, TransformerConfig, TransformerXLConfig
from attnkit.errors import CheckpointError
from attnkit.models.rnn import BahdanauSeq2Seq, HardAttentionSeq2Seq, LuongSeq2Seq, RNNSeq2Seq
from attnkit.models.transformer import Transformer
from attnkit.models.transformer_xl import TransformerXL, VanillaLM

MODELS: dict[str, tuple[type[nn.Module], type]] = {
    Transformer.kind: (Transformer, TransformerConfig),
    TransformerXL.kind: (TransformerXL, TransformerXLConfig),
    VanillaLM.kind: (VanillaLM, TransformerXLConfig),
    RNNSeq2Seq.kind: (RNNSeq2Seq, RNNConfig),
    BahdanauSeq2Seq.kind: (BahdanauSeq2Seq, RNNConfig),
    LuongSeq2Seq.kind: (LuongSeq2Seq, RNNConfig),
    HardAttentionSeq2Seq.kind: (HardAttentionSeq2Seq, RNNConfig),
}


def build_model(kind: str, config) -> nn.Module:
    if kind not in MODELS:
        raise CheckpointError(f"unknown model kind '{kind}' (known: {', '.join(sorted(MODELS))})")
    cls, _ = MODELS[kind]
    return cls.from_config(config)
