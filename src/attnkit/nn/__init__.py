"""Layers shared by every attention model: attention, positions, masks, feed-forward, blocks, adaptive input/softmax."""

from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import (
    ConcatHeadsAttention,
    KVCache,
    MultiHeadAttention,
    SharedQKAttention,
    scaled_dot_product,
)
from attnkit.nn.dropout import Dropout, dropout
from attnkit.nn.layers import DecoderLayer, EncoderLayer, FeedForward
from attnkit.nn.linear import Linear, PackedWeights, int8_kernels, int8_scheme, int8_unavailable, linear, prepacked
from attnkit.nn.masks import causal_mask, key_padding_to_attn_mask
from attnkit.nn.positions import LearnedPositions, SinusoidalPositions, position_encoding, sinusoid_table

__all__ = [
    "AdaptiveEmbedding",
    "AdaptiveLogSoftmax",
    "ConcatHeadsAttention",
    "DecoderLayer",
    "Dropout",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LearnedPositions",
    "Linear",
    "MultiHeadAttention",
    "PackedWeights",
    "SharedQKAttention",
    "SinusoidalPositions",
    "causal_mask",
    "int8_kernels",
    "int8_scheme",
    "int8_unavailable",
    "dropout",
    "key_padding_to_attn_mask",
    "linear",
    "position_encoding",
    "prepacked",
    "scaled_dot_product",
    "sinusoid_table",
]
