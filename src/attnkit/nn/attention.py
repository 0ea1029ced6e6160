"""Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2).

B batch, T query length, S key length, H heads, Dh head dim, D = H * Dh model dim.

The products with the keys and values are an attention function's, chosen outside the model (`sdpa_attention`:
torch's fused kernels on CPU and CUDA, `eager_attention`: written out; attnkit.cpu has its own for small CPU
batches); when the caller asks for the weights (pictures, alignments) the explicit path (`weigh`) computes
softmax(QK^T / sqrt(Dh)) V and returns them. Variants (relative attention) build their own logits and
reuse `weigh`. The variants take one of the paper's parts away to see what it does, a subclass each: the
1 / sqrt(Dh) scale (`UnscaledAttention`: raw dot products), separate keys (`SharedQKAttention`: the keys are the
queries' projection) and W^O (`ConcatHeadsAttention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.masks import causal_mask, mask_scores_


@dataclass
class _Room:
    """Time-major key/value buffers, (capacity, B, H, Dh), of which the first `used` positions are filled.

    Appending a position writes one contiguous (B, H, Dh) slab, and the filled part is one contiguous
    prefix, read as (B, H, used, Dh) views.
    """

    k: torch.Tensor
    v: torch.Tensor
    used: int = 0

    @staticmethod
    def make(like: torch.Tensor, capacity: int, rows: int | None = None) -> _Room:
        """Empty buffers for keys/values shaped like `like` (B, H, S, Dh), with `rows` rows (default B)."""
        b, h, _, dh = like.shape
        shape = (capacity, b if rows is None else rows, h, dh)
        return _Room(like.new_empty(shape), like.new_empty(shape))

    @staticmethod
    def positions(buffer: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Positions [start, stop) of a buffer as a (B, H, stop - start, Dh) view."""
        return buffer[start:stop].permute(1, 2, 0, 3)

    def filled(self) -> KVCache:
        return KVCache(self.positions(self.k, 0, self.used), self.positions(self.v, 0, self.used), self)

    def write(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        """Fill the next (B, H, t, Dh) positions; returns the cache of everything filled so far."""
        n, t = self.used, k.size(2)
        self.positions(self.k, n, n + t).copy_(k)
        self.positions(self.v, n, n + t).copy_(v)
        self.used = n + t
        return self.filled()


@dataclass
class KVCache:
    """Keys and values seen so far by one attention layer: (B, H, S, Dh) each.

    Incremental decoding grows the cache one position per step. Rather than concatenating (a copy of the
    whole cache per step and layer), `append(..., spare=n)` writes into spare room of a buffer that grows
    when full; `k` and `v` are then views of its filled part. A cache stays valid after it is appended to:
    only the newest cache grown from a buffer writes into it, any other append (a branch) copies first.

    The buffer is time-major (`_Room`), so the filled part is one block without gaps, which a step's q K^T
    reads with cold caches faster than a (B, H, capacity, Dh) buffer, whose filled rows lie between the gaps
    left for later positions (`attnkit bench --workloads mt-greedy`; tests/test_attention.py checks the cache).
    """

    k: torch.Tensor
    v: torch.Tensor
    room: _Room | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor, *, spare: int = 0) -> KVCache:
        """The cache with (B, H, t, Dh) more keys and values. `spare`: when a new buffer must be made, room
        for at least this many later positions (0: plain concatenation, contiguous keys and values)."""
        n, t = self.k.size(2), k.size(2)
        room = self.room
        if room is None or room.used != n or n + t > room.k.size(0):
            if spare == 0:
                return KVCache(torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2))
            room = _Room.make(self.k, n + t + max(spare, n + t if room is not None else 0))
            room.write(self.k, self.v)
        return room.write(k, v)

    def reorder(self, indices: torch.Tensor) -> KVCache:
        if self.room is None or (torch.is_grad_enabled() and (self.k.requires_grad or self.v.requires_grad)):
            return KVCache(self.k.index_select(0, indices), self.v.index_select(0, indices))
        # New buffers with room for the next position (beam search reorders every step); only the filled
        # positions are copied.
        n = self.k.size(2)
        room = _Room.make(self.k, n + 1, rows=len(indices))
        torch.index_select(self.room.k[:n], 1, indices, out=room.k[:n])
        torch.index_select(self.room.v[:n], 1, indices, out=room.v[:n])
        room.used = n
        return room.filled()


def scaled_dot_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive reference: softmax(QK^T / sqrt(d)) V with a True-may-attend mask. Returns (out, weights)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights  # (B, H, T, Dh), (B, H, T, S)


def _normalise(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """softmax over keys; half-precision logits are normalised in float32, float32/float64 stay as they are."""
    return (scores.float() if scores.element_size() < 4 else scores).softmax(dim=-1).to(dtype)


class StackedLinear(nn.Linear):
    """A linear map whose output rows stack several maps (W^Q; W^K; W^V): `part` applies the rows [start, stop)
    alone, so a cross-attention projects its queries with W^Q and its memory with [W^K; W^V] from one Parameter."""

    def part(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """(..., K) -> (..., stop - start): x through rows start .. stop - 1 of the weight (and bias)."""
        bias = None if self.bias is None else self.bias[start:stop]
        return F.linear(x, self.weight[start:stop], bias)


# An attention function: (module, q, k, v (B, H, T|S, Dh), mask, causal, need_weights) -> (out (B, T, D), weights or
# None). Which one a model's attention calls is chosen outside the model (`set_attention_function`), as Hugging
# Face's attention-function registry does: the paper's arithmetic is the same in each, its kernels are not.
AttentionFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def eager_attention(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    mask: torch.Tensor | None, causal: bool, need_weights: bool
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(mask(QK^T * scale)) V written out, dropout on the weights: ((B, T, D), weights (B, H, T, S))."""
    return module.weigh(module.scores(q, k), v, mask=mask, causal=causal)


def sdpa_attention(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   mask: torch.Tensor | None, causal: bool, need_weights: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's fused `scaled_dot_product_attention` (CPU and CUDA kernels); the explicit path when the caller asks
    for the weights (pictures, alignments), which SDPA does not return."""
    if need_weights:
        return eager_attention(module, q, k, v, mask=mask, causal=causal, need_weights=True)
    if causal and (mask is not None or q.size(2) != k.size(2)):
        # SDPA's is_causal aligns top-left; with a prefix of keys or a padding mask, spell it out.
        keep = causal_mask(q.size(2), k.size(2), q.device)
        mask, causal = (keep if mask is None else mask & keep), False
    p = module.attention_dropout.p if module.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                         scale=module.score_scale)
    return module.merge_heads(out), None


def set_attention_function(model: nn.Module, fn: AttentionFunction) -> None:
    """Every MultiHeadAttention in `model` calls `fn` (sdpa_attention by default; attnkit.cpu chooses its own)."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.attention_function = fn


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with one packed (3D, D) input projection.

    Self-attention projects Q, K, V in a single matmul; cross-attention uses the Q rows for the
    queries and the K/V rows for the memory, so both share one parameter layout. The softmax and the products with
    the keys and values are `attention_function`'s (sdpa_attention unless the caller chose another).
    """

    attention_function: AttentionFunction = staticmethod(sdpa_attention)

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.score_scale = 1 / math.sqrt(self.head_dim)  # section 3.2.1
        self.attention_dropout = nn.Dropout(dropout)  # on the attention weights
        self.in_proj = StackedLinear(d_model, 3 * d_model, bias=bias)  # [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.d_model)  # (B, H, T, Dh) -> (B, T, D)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) -> queries, keys, values (B, H, T, Dh) each, views of one product."""
        b, t, _ = x.shape
        qkv = self.in_proj(x).view(b, t, 3, self.n_heads, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        return self.split_heads(self.in_proj.part(x, 0, self.d_model))

    def project_kv(self, memory: torch.Tensor) -> KVCache:
        """Keys and values of an encoder memory, computed once per source (cross-attention)."""
        k, v = self.in_proj.part(memory, self.d_model, 3 * self.d_model).chunk(2, dim=-1)
        return KVCache(self.split_heads(k), self.split_heads(v))

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Attention logits (B, H, T, S)."""
        return (q @ k.transpose(-2, -1)).mul_(self.score_scale)  # a fresh product: scaled in place

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, H, T, Dh) queries over (B, H, S, Dh) keys -> ((B, T, D), weights (B, H, T, S) or None)."""
        out, weights = self.attention_function(self, q, k, v, mask=mask, causal=causal, need_weights=need_weights)
        return out, (weights if need_weights else None)

    def weigh(
        self, scores: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The explicit path: logits (B, H, T, S), a fresh tensor that is masked in place, -> softmax, dropout,
        @ V -> (output (B, T, D), weights (B, H, T, S))."""
        weights, kept = self.normalised(scores, v.dtype, mask=mask, causal=causal)
        return self.merge_heads(kept @ v), weights  # (B, H, T, Dh) -> (B, T, D)

    def normalised(self, scores: torch.Tensor, dtype: torch.dtype, *, mask: torch.Tensor | None, causal: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, H, T, S), masked in place -> (weights, the weights after dropout), in `dtype`."""
        weights = _normalise(mask_scores_(scores, mask, causal), dtype)
        return weights, self.attention_dropout(weights)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | KVCache | None = None,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from x (B, T, D): memory=None self-attention, memory=(B, S, D) tensor or a precomputed
        KVCache cross-attention. Returns (output (B, T, D), weights or None). Incremental decoding with a
        cache of keys and values is `DecoderLayer.step`."""
        if memory is None:
            q, k, v = self.project_qkv(x)
        else:
            q = self.project_q(x)
            kv = memory if isinstance(memory, KVCache) else self.project_kv(memory)
            k, v = kv.k, kv.v
        out, weights = self.attend(q, k, v, mask=mask, causal=causal, need_weights=need_weights)
        return self.output(out), weights

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        """The concatenated heads (B, T, D) -> the attention's output (B, T, D): W^O (section 3.2.2)."""
        return self.out_proj(heads)


class ConcatHeadsAttention(MultiHeadAttention):
    """Multi-head attention without W^O: the concatenated heads are the output (Kyubyong Park's TensorFlow
    Transformer; `model.variant: no-wo`). D = H * Dh, so the shapes stay those of the paper's."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        self.out_proj = None  # no parameters, so none in the state dict

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        return heads


class UnscaledAttention(MultiHeadAttention):
    """Multi-head attention on the raw dot products, q . k undivided by sqrt(Dh) (`model.variant: no-scale`): what
    the paper's scale is for (section 3.2.1: large dot products push the softmax into its flat regions)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        self.score_scale = 1.0


class SharedQKAttention(MultiHeadAttention):
    """Multi-head attention whose keys are its queries' projection, W^K = W^Q (`model.variant: shared-qk`; the
    Reformer's shared-QK attention, Kitaev et al. 2020, without its other changes): one (2D, D) product gives the
    [q; v] rows, and a self-attention's keys are its queries. Cross-attention projects the memory with W^Q for its
    keys. Initialised as MultiHeadAttention's q and v rows (the same seed gives the same W^Q and W^V)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        packed = self.in_proj  # (3D, D): the [q; k; v] rows the base class initialised
        self.in_proj = StackedLinear(d_model, 2 * d_model, bias=bias, device="meta")  # no random draws: rows come below
        self.in_proj.weight = nn.Parameter(torch.cat([packed.weight[:d_model], packed.weight[2 * d_model :]]).detach())
        if bias:
            self.in_proj.bias = nn.Parameter(torch.zeros(2 * d_model))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) -> queries, keys (the same tensor), values (B, H, T, Dh), views of one product."""
        b, t, _ = x.shape
        qv = self.in_proj(x).view(b, t, 2, self.n_heads, self.head_dim)
        q, v = qv.permute(2, 0, 3, 1, 4).unbind(0)
        return q, q, v

    def project_kv(self, memory: torch.Tensor) -> KVCache:
        """A memory's keys W^Q m and values W^V m, computed once per source (cross-attention)."""
        k, v = self.in_proj(memory).chunk(2, dim=-1)
        return KVCache(self.split_heads(k), self.split_heads(v))
