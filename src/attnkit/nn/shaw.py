"""Relative position representations in self-attention (Shaw, Uszkoreit and Vaswani 2018), the paper's other relative
scheme beside Transformer-XL's (nn/relative.py).

B batch, T queries, S keys, H heads, Dh head dim, K clipping distance, R = 2K + 1 relative positions.

Query i and key j meet through learned vectors of their clipped distance d = clip(j - i, -K, K):

    e_ij = q_i . (k_j + a^K_d) / sqrt(Dh),    z_i = sum_j softmax_j(e_ij) (v_j + a^V_d)

(eqs. 3-5). The 2K + 1 vectors a^K and a^V are a layer's own, shared by its heads: the paper's efficient form
(section 3.3) as tensor2tensor implements it. No absolute positions are added to the embeddings (`positions: shaw`).
Both terms cost (T x R) work rather than (T x S x Dh): q . a^K is one product with the R vectors, gathered to each
key's distance, and the value term sums the weights of the keys at each distance before one product with a^V.

The queries are the last T of the S positions (teacher forcing: T = S; a decoding step: one query, the newest
key), so one layer serves the encoder, the causal decoder and its cached steps alike.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from attnkit.nn.attention import MultiHeadAttention


def relative_distances(t: int, s: int, clip: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, S) indices into the R = 2 clip + 1 vectors: clip(j - i, -clip, clip) + clip, the queries being the last T
    of the S key positions."""
    queries = torch.arange(s - t, s, device=device)[:, None]  # (T, 1)
    keys = torch.arange(s, device=device)[None, :]  # (1, S)
    return (keys - queries).clamp(-clip, clip) + clip


class ShawAttention(MultiHeadAttention):
    """Self-attention with relative position representations a^K, a^V (R, Dh) of distances clipped to `clip`.
    Always the explicit path (`normalised`: the masking, softmax and dropout `weigh` uses): the value term needs the
    weights."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, *, clip: int = 16):
        super().__init__(d_model, n_heads, dropout, bias)
        self.clip = clip
        self.rel_keys = nn.Parameter(torch.randn(2 * clip + 1, self.head_dim) * self.head_dim**-0.5)  # a^K (R, Dh)
        self.rel_values = nn.Parameter(torch.randn(2 * clip + 1, self.head_dim) * self.head_dim**-0.5)  # a^V (R, Dh)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool,
               need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, H, T, Dh) queries over (B, H, S, Dh) keys -> ((B, T, D), weights (B, H, T, S) or None)."""
        b, h, t, _ = q.shape
        at = relative_distances(t, k.size(2), self.clip, q.device).expand(b, h, t, -1)  # (B, H, T, S) into R
        by_distance = q @ self.rel_keys.to(q.dtype).T  # (B, H, T, R): q_i . a^K_r for every r
        scores = (q @ k.transpose(-2, -1)).add_(by_distance.gather(-1, at)).mul_(self.score_scale)  # (B, H, T, S)
        weights, kept = self.normalised(scores, v.dtype, mask=mask, causal=causal)
        at_distance = torch.zeros(b, h, t, 2 * self.clip + 1, dtype=kept.dtype, device=kept.device)
        at_distance.scatter_add_(-1, at, kept)  # (B, H, T, R): the weight of the keys at each distance
        out = kept @ v + at_distance @ self.rel_values.to(kept.dtype)  # (B, H, T, Dh): sum_j a_ij (v_j + a^V_d(i, j))
        return self.merge_heads(out), (weights if need_weights else None)


def self_attention_for(positions: str, clip: int, attention: Callable[..., MultiHeadAttention] = MultiHeadAttention
                       ) -> Callable[..., MultiHeadAttention]:
    """The self-attention class a config's `positions` asks for: ShawAttention with its clipping distance for
    `shaw`, else the layer's own `attention`."""
    return partial(ShawAttention, clip=clip) if positions == "shaw" else attention
