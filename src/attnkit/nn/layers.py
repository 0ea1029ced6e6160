"""Transformer blocks: position-wise FFN and encoder/decoder layers with residual + LayerNorm.

B batch, S source length, T target length, D model dim.

A layer takes its sublayers as modules and its residual blocks from a factory, as the Annotated Transformer's
`EncoderLayer(size, self_attn, feed_forward, dropout)` does, so the model's variants (attnkit.models.transformer)
swap one part each: a block without its skip connection (`Unskipped`) passes the sublayer's output alone on (still
normalised), a layer without its FFN (`ffn=None`) is its attention blocks alone, and a block's norm may be a
BatchNorm over the batch's real tokens (`keep`, (B, T); attnkit.nn.norms) instead of a LayerNorm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.attention import KVCache, MultiHeadAttention
from attnkit.nn.norms import NormFn, norm_function

# swish is SiLU, x * sigmoid(x) (Marian's and Hugging Face's name for it)
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2 (section 3.3); act is relu, gelu or swish (SiLU, Marian's)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        for lin in (self.w1, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, F) -> (B, T, D)."""
        return self.w2(self.dropout(ACTIVATIONS[self.activation](self.w1(x))))


def residual(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], norm: NormFn, norm_first: bool,
             dropout: Callable[[torch.Tensor], torch.Tensor] | None = None, skip: bool = True) -> torch.Tensor:
    """A residual block: x + Dropout(f(x)), LayerNorm after the sum (post-LN, the paper) or before f (pre-LN);
    `skip=False` drops the "x +", leaving Dropout(f(x)) alone: the block without its residual connection.

    The one definition both teacher forcing (`Residual`) and incremental decoding (`DecoderLayer.step`, no dropout)
    use.
    """
    if norm_first:
        out = fn(norm(x))
        out = out if dropout is None else dropout(out)
        return x + out if skip else out
    out = fn(x)
    out = out if dropout is None else dropout(out)
    return norm(x + out if skip else out)


class Residual(nn.Module):
    """x + Dropout(f(x)) with LayerNorm (or the given `norm`) after the sum (post-LN, the paper) or before f (pre-LN):
    see `residual`."""

    skip = True  # the "x +" (`Unskipped`: none)

    def __init__(self, d_model: int, dropout: float, norm_first: bool, norm: nn.Module | None = None):
        super().__init__()
        self.norm = nn.LayerNorm(d_model) if norm is None else norm
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor],
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D); `keep` (B, T): the real tokens, which a BatchNorm's statistics count."""
        return residual(x, fn, norm_function(self.norm, keep), self.norm_first, self.dropout, self.skip)


class Unskipped(Residual):
    """The block without its residual connection: Norm(Dropout(f(x))) (post-LN), Dropout(f(Norm(x))) (pre-LN)."""

    skip = False


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN (None: the attention block alone), each in a residual block made by `block()`."""

    def __init__(self, self_attn: MultiHeadAttention, ffn: FeedForward | None, block: Callable[[], Residual]):
        super().__init__()
        self.self_attn, self.ffn = self_attn, ffn
        self.attn_block = block()
        self.ffn_block = None if ffn is None else block()

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None, need_weights: bool = False,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S), keep (B, S) the real tokens -> (B, S, D), weights (B, H, S, S) or None."""
        weights = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, mask=mask, need_weights=need_weights)
            return out

        x = self.attn_block(x, attend, keep)
        return _apply(self.ffn_block, self.ffn, x, keep), weights


def _apply(block: Residual | None, fn: Callable[[torch.Tensor], torch.Tensor] | None, x: torch.Tensor,
           keep: torch.Tensor | None) -> torch.Tensor:
    """x through a residual block around fn, or x itself where the layer has no such block (no FFN)."""
    return x if block is None else block(x, fn, keep)


class StepWeights(NamedTuple):
    """What a decoder layer's incremental step reads, fetched once per search (`DecoderLayer.step_weights`).

    A decoding step is short on arithmetic (one position per row), so nn.Module attribute lookups, a
    dictionary walk per level, are a visible share of it; the step takes the sublayers, their output maps and the
    norms (as functions: attnkit.nn.norms.norm_function) from here once per search (the sublayers' own methods do
    the projections). `attnkit bench --workloads mt-greedy` measures the step.
    Holding the modules themselves (not copies of their weights), this stays correct while the weights change in
    place; a search takes a fresh one.
    """

    self_attn: MultiHeadAttention | nn.Module  # an SSRU layer's SSRU (nn.ssru) where the self-attention would be
    cross_attn: MultiHeadAttention
    ffn: FeedForward | None  # None: a layer without an FFN
    # the attentions' outputs from their concatenated heads (W^O, or nothing for an attention without one)
    self_out: Callable[[torch.Tensor], torch.Tensor]
    cross_out: Callable[[torch.Tensor], torch.Tensor]
    norms: tuple[NormFn, NormFn, NormFn | None]  # the three residual blocks' norms, as functions
    norm_first: bool
    skip: bool  # the blocks' residual connections (False: `Unskipped` blocks)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention, the FFN (None: none), each in a residual block made by `block()`."""

    def __init__(self, self_attn: MultiHeadAttention, cross_attn: MultiHeadAttention, ffn: FeedForward | None,
                 block: Callable[[], Residual]):
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = self_attn, cross_attn, ffn
        self.self_block, self.cross_block = block(), block()
        self.ffn_block = None if ffn is None else block()

    def forward(
        self, y: torch.Tensor, memory: torch.Tensor, *, memory_mask: torch.Tensor | None, need_weights: bool = False,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """Teacher forcing: y (B, T, D) over memory (B, S, D) -> (B, T, D), {"self", "cross"} weights; keep (B, T):
        the real target tokens. The self-attention is causal over T."""
        weights: dict[str, torch.Tensor | None] = {}

        def self_attend(h: torch.Tensor) -> torch.Tensor:
            out, weights["self"] = self.self_attn(h, causal=True, need_weights=need_weights)
            return out

        y = self.self_block(y, self_attend, keep)
        y, weights["cross"] = attend_source(self, y, memory, memory_mask=memory_mask, need_weights=need_weights,
                                            keep=keep)
        return y, weights

    def step_weights(self) -> StepWeights:
        """The tensors and settings `step` reads (see StepWeights)."""
        sa, ca, ffn = self.self_attn, self.cross_attn, self.ffn
        norms = tuple(None if b is None else norm_function(b.norm) for b in (self.self_block, self.cross_block,
                                                                            self.ffn_block))
        return StepWeights(sa, ca, ffn, sa.output, ca.output, norms, self.self_block.norm_first, self.self_block.skip)

    @staticmethod
    def step(
        w: StepWeights,
        y: torch.Tensor,
        memory: KVCache,
        *,
        memory_mask: torch.Tensor | None,
        cache: KVCache | None,
        need_weights: bool = False,
        beams: int = 1,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None], KVCache]:
        """Incremental decoding (inference: the model in eval mode): y (B, 1, D) holds each row's newest position,
        which attends to everything in `cache` (None: the first step, nothing yet) and to itself. The memory's keys
        and values and its mask hold B / beams sentences, each attended by `beams` consecutive rows of y as one block
        of queries (`step_source`).
        -> (B, 1, D), {"self", "cross"} weights, the grown cache.

        The same residual blocks and sublayers as `forward` (`residual`, the attentions' projections, the FFN),
        reading `w`; the test suite checks it step by step against `forward`.
        """
        pre, (n_self, _, _) = w.norm_first, w.norms
        self_weights = None
        if cache is None:  # the first step: an empty cache of the right shape
            empty = memory.k.new_zeros(y.size(0), memory.k.size(1), 0, memory.k.size(3))  # (B, H, 0, Dh)
            cache = KVCache(empty, empty)

        def self_attend(h: torch.Tensor) -> torch.Tensor:  # over the cache, which this position joins
            nonlocal cache, self_weights
            q, k, v = w.self_attn.project_qkv(h)
            cache = cache.append(k, v, spare=32)  # the next steps write in place
            out, self_weights = w.self_attn.attend(q, cache.k, cache.v, mask=None, causal=False,
                                                   need_weights=need_weights)
            return w.self_out(out)

        y = residual(y, self_attend, n_self, pre, skip=w.skip)
        y, cross = step_source(w, y, memory, memory_mask=memory_mask, need_weights=need_weights, beams=beams)
        return y, {"self": self_weights, "cross": cross}, cache


def attend_source(layer: nn.Module, y: torch.Tensor, memory: torch.Tensor, *, memory_mask: torch.Tensor | None,
                  need_weights: bool, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder layer's second half in teacher forcing: y (B, T, D) through the cross-attention block over memory
    (B, S, D), then the FFN block (where the layer has one) -> (B, T, D), the cross weights (B, H, T, S) or None.
    `layer` has `cross_attn`, `cross_block`, `ffn`, `ffn_block` (DecoderLayer, nn.ssru.SSRUDecoderLayer)."""
    weights = None

    def cross_attend(h: torch.Tensor) -> torch.Tensor:
        nonlocal weights
        out, weights = layer.cross_attn(h, memory, mask=memory_mask, need_weights=need_weights)
        return out

    y = layer.cross_block(y, cross_attend, keep)
    return _apply(layer.ffn_block, layer.ffn, y, keep), weights


def step_source(w: StepWeights, y: torch.Tensor, memory: KVCache, *, memory_mask: torch.Tensor | None,
                need_weights: bool, beams: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder layer's second half in a decoding step: y (B, 1, D) through the cross-attention block over the
    memory's keys and values, kept once per sentence (B / beams, H, S, Dh) and attended by a sentence's `beams`
    consecutive rows as one block of queries, then the FFN block -> (B, 1, D), cross weights (B, H, 1, S) or None."""
    b, t, d = y.shape  # t = 1
    pre, (_, n_cross, n_ffn) = w.norm_first, w.norms
    cross = None

    def cross_attend(h: torch.Tensor) -> torch.Tensor:  # a sentence's beams: one block (B / beams, H, beams, Dh)
        nonlocal cross
        q = w.cross_attn.project_q(h.reshape(b // beams, beams * t, d))
        out, cross = w.cross_attn.attend(q, memory.k, memory.v, mask=memory_mask, causal=False,
                                         need_weights=need_weights)
        out = out.reshape(b, t, d)
        return w.cross_out(out)

    y = residual(y, cross_attend, n_cross, pre, skip=w.skip)
    if w.ffn is not None:
        y = residual(y, w.ffn, n_ffn, pre, skip=w.skip)
    if cross is not None:
        cross = cross.unflatten(2, (beams, t)).transpose(1, 2).flatten(0, 1)  # (B, H, 1, S)
    return y, cross
