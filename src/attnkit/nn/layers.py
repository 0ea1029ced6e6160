"""Transformer blocks: position-wise FFN and encoder/decoder layers with residual + LayerNorm.

B batch, S source length, T target length, D model dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnkit.nn.attention import KVCache, MultiHeadAttention
from attnkit.nn.dropout import Dropout, drop
from attnkit.nn.linear import Linear, linear


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2 (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.w1, self.w2 = Linear(d_model, d_ff), Linear(d_ff, d_model)
        self.activation = activation
        self.dropout = Dropout(dropout)
        for lin in (self.w1, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, F) -> (B, T, D). Dropout's 1 / (1 - p) rides on W2 (a D x F product in
        both directions) rather than costing passes over the 4x wider hidden layer."""
        hidden = linear(x, self.w1.weight, self.w1.bias, activation=self.activation)  # (B, T, F)
        kept, scale = drop(hidden, self.dropout.p, self.training)
        return linear(kept, self.w2.weight if scale == 1.0 else self.w2.weight * scale, self.w2.bias)


class Residual(nn.Module):
    """x + Dropout(f(x)) with LayerNorm after (post-LN, the paper) or before f (pre-LN)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm_first:
            return self._add(x, fn(self._norm(x)))
        return self._norm(self._add(x, fn(x)))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """self.norm(x) without the module call (a decoding step makes nine)."""
        n = self.norm
        return torch.layer_norm(x, n.normalized_shape, n.weight, n.bias, n.eps)

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x + dropout(y), the 1 / (1 - p) applied by the addition itself (alpha)."""
        kept, scale = drop(y, self.dropout.p, self.training)
        return torch.add(x, kept, alpha=scale)


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, dropout: float, attention_dropout: float,
                 activation_dropout: float, activation: str, norm_first: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation, activation_dropout)
        self.attn_block = Residual(d_model, dropout, norm_first)
        self.ffn_block = Residual(d_model, dropout, norm_first)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S) -> (B, S, D), weights (B, H, S, S) or None."""
        weights = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            out, weights, _ = self.self_attn(h, mask=mask, need_weights=need_weights)
            return out

        x = self.attn_block(x, attend)
        return self.ffn_block(x, self.ffn), weights


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, dropout: float, attention_dropout: float,
                 activation_dropout: float, activation: str, norm_first: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation, activation_dropout)
        self.self_block = Residual(d_model, dropout, norm_first)
        self.cross_block = Residual(d_model, dropout, norm_first)
        self.ffn_block = Residual(d_model, dropout, norm_first)

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor | KVCache,
        *,
        memory_mask: torch.Tensor | None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        beams: int = 1,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None], KVCache | None]:
        """y (B, T, D) over memory (B, S, D) -> (B, T, D), {"self", "cross"} weights, grown cache.

        Without a cache the self-attention is causal over T; with one, y holds only the new
        position(s) and attends to everything cached before them. With beams > 1 the memory and its mask
        hold B / beams sentences, each attended by `beams` consecutive rows of y.
        """
        weights: dict[str, torch.Tensor | None] = {}

        def self_attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal cache
            out, weights["self"], cache = self.self_attn(
                h, causal=cache is None or h.size(1) > 1, cache=cache, need_weights=need_weights)
            return out

        def cross_attend(h: torch.Tensor) -> torch.Tensor:
            b, t, d = h.shape  # a sentence's beams are one block of beams * T queries: (B / beams, beams * T, D)
            out, w, _ = self.cross_attn(h.reshape(b // beams, beams * t, d), memory, mask=memory_mask,
                                        need_weights=need_weights)
            weights["cross"] = None if w is None else w.unflatten(2, (beams, t)).transpose(1, 2).flatten(0, 1)
            return out.reshape(b, t, d)

        y = self.self_block(y, self_attend)
        y = self.cross_block(y, cross_attend)
        return self.ffn_block(y, self.ffn), weights, cache
