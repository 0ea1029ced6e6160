"""Layers shared by every attention model: attention, positions, masks, feed-forward, blocks, adaptive input/softmax."""

from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import (
    ConcatHeadsAttention,
    KVCache,
    MultiHeadAttention,
    SharedQKAttention,
    StackedLinear,
    UnscaledAttention,
    eager_attention,
    scaled_dot_product,
    sdpa_attention,
    set_attention_function,
)
from attnkit.nn.layers import DecoderLayer, EncoderLayer, FeedForward, Residual, Unskipped
from attnkit.nn.masks import causal_mask, key_padding_to_attn_mask
from attnkit.nn.positions import LearnedPositions, SinusoidalPositions, position_encoding, sinusoid_table
from attnkit.nn.ssru import SSRU, SSRUDecoderLayer

__all__ = [
    "AdaptiveEmbedding",
    "AdaptiveLogSoftmax",
    "ConcatHeadsAttention",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LearnedPositions",
    "MultiHeadAttention",
    "Residual",
    "SSRU",
    "SSRUDecoderLayer",
    "SharedQKAttention",
    "StackedLinear",
    "SinusoidalPositions",
    "UnscaledAttention",
    "Unskipped",
    "causal_mask",
    "eager_attention",
    "key_padding_to_attn_mask",
    "position_encoding",
    "scaled_dot_product",
    "sdpa_attention",
    "set_attention_function",
    "sinusoid_table",
]
