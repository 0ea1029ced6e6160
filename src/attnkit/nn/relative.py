"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, section 3.3).

B batch, T query (segment) length, M memory length, S = M + T key length, H heads, Dh head dim,
D = H * Dh model dim.

The score of query i over key j is the sum of four terms, with R the sinusoid of the distance i - j:

    (a) + (c) = (q_i + u) . k_j                content, with the global content bias u (r_w_bias)
    (b) + (d) = (q_i + v) . W_{k,R} R_{i-j}    position, with the global position bias v (r_r_bias)

Keys and values are computed over concat(memory, segment); positions have their own key projection
W_{k,R}. The position term is computed for the S distances S-1 .. 0 once per query and moved into
place by `rel_shift` (appendix B) instead of gathering a (T, S, D) tensor.

The variant only changes how scores are computed: its queries and keys carry two halves each,
[q + u | q + v] and [k | W_{k,R} R], and `scores` splits them again, so masking, softmax, dropout and
the returned weights are the base class's `attend`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.nn.attention import MultiHeadAttention


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, S) scores against distances S-1 .. 0 -> scores against keys 0 .. S-1.

    Column c of row i holds distance S-1-c; query i (absolute position S-T+i) needs distance
    S-T+i-j at key j, i.e. column T-1-i+j: row i moves left by T-1-i. Padding one zero column,
    reading the buffer as (S+1, T) and dropping the first row does that shift for every row at once.
    Entries for j > S-T+i (the future) hold garbage and must be masked.
    """
    b, h, t, s = x.shape
    padded = torch.cat([x.new_zeros(b, h, t, 1), x], dim=-1)  # (B, H, T, S+1)
    padded = padded.view(b, h, s + 1, t)  # the same buffer read as (S+1, T)
    return padded[:, :, 1:].reshape(b, h, t, s)  # (B, H, T, S)


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Self-attention of a segment over concat(memory, segment) with relative positions."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__(d_model, n_heads, dropout, bias=False)  # the XL reference has no projection biases
        self.pos_proj = nn.Linear(d_model, d_model, bias=False)  # W_{k,R}
        self.r_w_bias = nn.Parameter(torch.empty(n_heads, self.head_dim))  # u
        self.r_r_bias = nn.Parameter(torch.empty(n_heads, self.head_dim))  # v
        nn.init.xavier_uniform_(self.pos_proj.weight)
        nn.init.normal_(self.r_w_bias, std=0.02)
        nn.init.normal_(self.r_r_bias, std=0.02)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """[q+u | q+v] (B, H, T, 2Dh) over [k | W_R R] (B, H, S, 2Dh) -> logits (B, H, T, S)."""
        d = self.head_dim
        content = q[..., :d] @ k[..., :d].transpose(-2, -1)  # (B, H, T, S)
        position = rel_shift(q[..., d:] @ k[..., d:].transpose(-2, -1))  # (B, H, T, S)
        return (content + position) / math.sqrt(d)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        pos: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D) over memory (B, M, D) or None; pos (S, D) the sinusoids of distances S-1 .. 0.

        mask (T, S) True = may attend. Returns (output (B, T, D), weights (B, H, T, S) or None).
        """
        context = x if memory is None or memory.size(1) == 0 else torch.cat([memory, x], dim=1)  # (B, S, D)
        q = self.project_q(x)  # (B, H, T, Dh)
        kv = self.project_kv(context)  # (B, H, S, Dh) each
        b, s = context.size(0), context.size(1)
        r = self.pos_proj(pos).view(1, s, self.n_heads, self.head_dim).transpose(1, 2)  # (1, H, S, Dh)
        q2 = torch.cat([q + self.r_w_bias[:, None], q + self.r_r_bias[:, None]], dim=-1)  # (B, H, T, 2Dh)
        k2 = torch.cat([kv.k, r.expand(b, -1, -1, -1)], dim=-1)  # (B, H, S, 2Dh)
        out, weights = self.attend(q2, k2, kv.v, mask=mask, causal=False, need_weights=need_weights)
        return self.out_proj(out), weights
