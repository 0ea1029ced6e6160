"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, section 3.3).

B batch, T query (segment) length, M memory length, S = M + T key length, H heads, Dh head dim,
D = H * Dh model dim.

The score of query i over key j is the sum of four terms, with R the sinusoid of the distance i - j:

    (a) + (c) = (q_i + u) . k_j                content, with the global content bias u (r_w_bias)
    (b) + (d) = (q_i + v) . W_{k,R} R_{i-j}    position, with the global position bias v (r_r_bias)

u and v are learnt per layer by default; with the model's `share_uv` one pair serves every layer (the
XL PyTorch reference's default), passed in as `biases` by the model, which then owns it.

Keys and values are computed over concat(memory, segment); positions have their own key projection
W_{k,R}. The position term is computed for the S distances S-1 .. 0 once per query and moved into
place by `rel_shift` (appendix B) instead of gathering a (T, S, D) tensor. Here the shift is a strided
view of the position scores, so it copies nothing; its gradient is the opposite shift.

Two paths, one result: with autograd (training, or when the weights are asked for) the logits are built
explicitly and go through the base class's `weigh` (mask, softmax, dropout, @ V); without autograd the
position term is the additive bias of the fused `scaled_dot_product_attention` (its CPU kernel cannot
return a gradient for a bias, so training cannot take it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.attention import KVCache, MultiHeadAttention


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(..., T, S) scores against distances S-1 .. 0 -> a view of them against keys 0 .. S-1.

    Column c of row i holds distance S-1-c; query i (absolute position S-T+i) needs distance
    S-T+i-j at key j, i.e. column T-1-i+j: row i moves left by T-1-i. Read with a row stride of S-1
    from offset T-1, the (T, S) block does that shift for every row at once (the paper's pad-and-reshape
    trick, without the copies). Entries for j > S-T+i (the future) read the next row: garbage that must
    be masked. Every read stays inside the block: the last one is at (T-1)(S-1) + (S-1) + (T-1) = TS-1.
    """
    t, s = x.shape[-2:]
    if x.stride(-1) != 1 or x.stride(-2) != s:
        x = x.contiguous()
    return x.as_strided(x.shape, (*x.stride()[:-2], s - 1, 1), x.storage_offset() + t - 1)


def rel_unshift(g: torch.Tensor) -> torch.Tensor:
    """The opposite shift, for gradients: (..., T, S) against keys -> against distances S-1 .. 0.

    Entry (i, c) is g[i, c - (T-1-i)], zero where that key does not exist. With T zero columns padded
    on the left, that is row stride S+T+1 from offset 1 (the last read: (T-1)(S+T+1) + S = T(S+T) - 1).
    """
    t, s = g.shape[-2:]
    padded = g.new_empty(*g.shape[:-1], t + s)  # (..., T, T+S)
    padded[..., :t].zero_()
    padded[..., t:].copy_(g)
    return padded.as_strided(g.shape, (*padded.stride()[:-2], t + s + 1, 1), padded.storage_offset() + 1)


class _AddRelShifted(torch.autograd.Function):
    """content + rel_shift(position) in one pass; the gradient of position is rel_unshift(grad).

    The gradient of the garbage (future) entries is dropped: they are masked, so theirs is zero.
    """

    @staticmethod
    def forward(ctx, content: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return content + rel_shift(position)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, rel_unshift(grad)


def add_rel_shifted(content: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """(B, H, T, S) content logits + the position logits (B, H, T, S) of distances S-1 .. 0, shifted into place."""
    return _AddRelShifted.apply(content, position)


def position_biases(n_heads: int, head_dim: int) -> tuple[nn.Parameter, nn.Parameter]:
    """A fresh (u, v) pair, (H, Dh) each, initialised as in the XL reference (normal, std 0.02)."""
    pair = nn.Parameter(torch.empty(n_heads, head_dim)), nn.Parameter(torch.empty(n_heads, head_dim))
    for p in pair:
        nn.init.normal_(p, std=0.02)
    return pair


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Self-attention of a segment over concat(memory, segment) with relative positions."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, own_biases: bool = True):
        super().__init__(d_model, n_heads, dropout, bias=False)  # the XL reference has no projection biases
        self.pos_proj = nn.Linear(d_model, d_model, bias=False)  # W_{k,R}
        nn.init.xavier_uniform_(self.pos_proj.weight)
        if own_biases:  # without: every call passes the pair shared by all layers (`biases`)
            self.r_w_bias, self.r_r_bias = position_biases(n_heads, self.head_dim)  # u, v

    def position_keys(self, pos: torch.Tensor) -> torch.Tensor:
        """Sinusoids (S, D) of distances S-1 .. 0 -> their keys W_{k,R} R per head (H, S, Dh)."""
        return self.pos_proj(pos).view(pos.size(0), self.n_heads, self.head_dim).transpose(0, 1)

    @staticmethod
    def position_scores(q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """(B, H, T, Dh) queries . (H, S, Dh) position keys -> (B, H, T, S), one matrix product per head.

        The queries are a head-split view of (B, T, D), so (H, B*T, Dh) is a view too; the result is
        returned as a (B, H, T, S) view of the (H, B, T, S) product, whose (T, S) blocks `rel_shift` reads.
        """
        b, h, t, d = q.shape
        scores = q.transpose(0, 1).reshape(h, b * t, d) @ r.transpose(1, 2)  # (H, B*T, S)
        return scores.view(h, b, t, -1).transpose(0, 1)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        r: torch.Tensor,
        *,
        mask: torch.Tensor,
        biases: tuple[torch.Tensor, torch.Tensor] | None = None,
        memory_kv: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, KVCache]:
        """x (B, T, D) over memory (B, M, D) or None, or over the memory's keys and values `memory_kv`
        (B, H, M, Dh) computed before (then `memory` is not read); r (H, S, Dh) the position keys;
        biases: the (u, v) pair (H, Dh) each shared by all layers, None for this layer's own.

        mask (T, S) True = may attend; it must hide the future. Returns (output (B, T, D),
        weights (B, H, T, S) or None, keys and values of the whole context (B, H, S, Dh)).
        """
        q = self.project_q(x)  # (B, H, T, Dh)
        if memory_kv is None and memory is not None and memory.size(1) > 0:
            # apart from the segment: the (stop-gradient) memory needs no input gradient, only W's
            memory_kv = self.project_kv(memory)  # (B, H, M, Dh) each
        new = self.project_kv(x)  # (B, H, T, Dh) each
        kv = new if memory_kv is None else memory_kv.append(new.k, new.v)  # (B, H, S, Dh) each
        scale = self.head_dim**-0.5  # folded into the (small) queries rather than the (T, S) logits
        u, v = (self.r_w_bias, self.r_r_bias) if biases is None else biases  # (H, Dh) each
        q_content = (q + u[:, None]) * scale  # (B, H, T, Dh): q + u
        q_position = (q + v[:, None]) * scale  # (B, H, T, Dh): q + v
        position = self.position_scores(q_position, r)  # (B, H, T, S) against distances S-1 .. 0
        if need_weights or torch.is_grad_enabled():
            scores = add_rel_shifted(q_content @ kv.k.transpose(-2, -1), position)  # (B, H, T, S)
            out, weights = self.weigh(scores, kv.v, mask=mask)
            return self.out_proj(out), weights if need_weights else None, kv
        bias = rel_shift(position).masked_fill(~mask, float("-inf"))  # (B, H, T, S)
        dropout = self.attention_dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q_content, kv.k, kv.v, attn_mask=bias, dropout_p=dropout, scale=1.0)
        return self.out_proj(self.merge_heads(out)), None, kv
