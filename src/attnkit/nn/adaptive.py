"""Adaptive input embeddings (Baevski & Auli 2019) and the adaptive softmax (Grave et al. 2017) over shared clusters.

N tokens, D model dim, V vocabulary sorted by frequency. `cutoffs` c_1 < .. < c_n split the ids into
cluster 0 = [0, c_1) (the head's shortlist) and tail clusters i = [c_i, c_{i+1}) (c_{n+1} = V); V_i is the
size of cluster i and D_i = D // div_val**i its embedding size (Transformer-XL's `div_val`).

- `AdaptiveEmbedding`: id w of cluster i -> row w - c_i of table_i (V_i, D_i), projected to D by proj_i (D, D_i).
  There is no projection where D_i = D: cluster 0 always, every cluster with div_val 1. Without cutoffs the
  module is exactly nn.Embedding(V, D) (its one table is `weight`).
- `AdaptiveLogSoftmax`: the head scores the shortlist and one logit per tail cluster; a tail word w of cluster i
  has log p(w | h) = log p(cluster i | h) + log p(w | cluster i, h), the second a softmax over cluster i only,
  with h projected to D_i (h proj_i) against table_i. Its word vectors are an AdaptiveEmbedding passed in at
  every call: the input embedding itself when input and output are tied (tables and projections per cluster:
  the output vector of w is proj_i table_i[w - c_i], exactly its input embedding before scaling), or the
  model's own output tables. Without cutoffs it is exactly the full softmax log_softmax(h W^T + b).

`nll` is the training path: every token pays for the head and for its own cluster only, and no (N, V)
matrix is built; each softmax's cross-entropy is `attnkit.nn.cross_entropy`'s one pass a chunk. `log_prob`
builds the whole (N, V) distribution, for sampling and per-position scoring.
Every cluster takes part in every call, with an empty set of tokens when a batch has none of its words,
so every parameter gets a gradient (zero): DDP needs no `find_unused_parameters`.

A tail cluster's products can run over its rows padded to a multiple of `row_multiple` (`bucketed`; 0, the default:
as they are), the padding's results dropped: the count of a cluster's words changes with every batch, and where each
new row count costs a kernel to build (oneDNN under bf16 autocast) attnkit.cpu sets a multiple, so that a few
bucketed counts stay cached (benchmarks/kernel_builds.sh counts the builds). Values and gradients are those of the
unpadded rows (tests/test_adaptive.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.cross_entropy import cross_entropy_rows


def cluster_bounds(vocab_size: int, cutoffs: Sequence[int]) -> list[int]:
    """[0, c_1, .., c_n, V]: cluster i holds the ids bounds[i] .. bounds[i + 1] - 1."""
    bounds = [0, *cutoffs, vocab_size]
    if any(hi <= lo for lo, hi in zip(bounds, bounds[1:])):
        raise ValueError(f"cutoffs {list(cutoffs)} must increase strictly between 0 and the vocabulary size "
                         f"{vocab_size}")
    return bounds


def bucketed(rows: torch.Tensor, multiple: int) -> torch.Tensor:
    """Row positions (N_i,) -> (N_p,), N_p the next multiple of `multiple` (0: N_i): padded with copies of the first,
    whose results the caller drops (the first N_i rows are `rows` itself)."""
    pad = -rows.numel() % multiple if multiple else 0
    return rows if pad == 0 else torch.cat([rows, rows[:1].expand(pad)])


def _fp32(x: torch.Tensor) -> torch.Tensor:
    """Half-precision scores in float32 for the softmax statistics; float32 / float64 unchanged."""
    return x.float() if x.element_size() < 4 else x


class _Clustered(nn.Module):
    """Cluster bookkeeping shared by the embedding and the softmax."""

    row_multiple = 0  # a tail cluster's rows are padded to a multiple of this (module docstring)

    def __init__(self, vocab_size: int, cutoffs: Sequence[int]):
        super().__init__()
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.register_buffer("cutoffs", torch.tensor(list(cutoffs), dtype=torch.long), persistent=False)

    @property
    def n_clusters(self) -> int:
        return len(self.bounds) - 1

    def cluster_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The cluster of every id (...) -> (...): 0 = head, i = tail cluster i."""
        return torch.bucketize(ids, self.cutoffs, right=True)

    def members(self, cluster: torch.Tensor, i: int) -> torch.Tensor:
        """Positions (N_i,) of the flat (N,) cluster ids that are in cluster i (possibly none)."""
        return (cluster == i).nonzero().squeeze(1)


class AdaptiveEmbedding(_Clustered):
    """Per-cluster tables of size D // div_val**i, projected to D; see the module docstring."""

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int] = (), div_val: int = 1):
        super().__init__(vocab_size, cutoffs)
        self.d_model = d_model
        sizes = [hi - lo for lo, hi in zip(self.bounds, self.bounds[1:])]
        dims = [d_model // div_val**i for i in range(self.n_clusters)]
        self.weight = nn.Parameter(torch.empty(sizes[0], d_model))  # cluster 0 (V_0, D)
        self.tables = nn.ParameterList(nn.Parameter(torch.empty(v, d)) for v, d in zip(sizes[1:], dims[1:]))
        self.projs = nn.ParameterList(nn.Parameter(torch.empty(d_model, d)) for d in dims[1:] if d != d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Tables N(0, 1/D), projections N(0, 1/D_i): every effective embedding proj_i table_i[w] has variance
        1/D per coordinate, as a full table does (unit variance after the model's sqrt(D) scale)."""
        for table in (self.weight, *self.tables):
            nn.init.normal_(table, std=self.d_model**-0.5)
        for proj in self.projs:
            nn.init.normal_(proj, std=proj.size(1) ** -0.5)

    def cluster(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cluster i's table (V_i, D_i) and projection (D, D_i), None where D_i = D."""
        if i == 0:
            return self.weight, None
        return self.tables[i - 1], self.projs[i - 1] if len(self.projs) else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (...) -> (..., D), not scaled."""
        if self.n_clusters == 1:
            return F.embedding(ids, self.weight)
        flat = ids.reshape(-1)  # (N,)
        cluster = self.cluster_of(flat)
        out = self.weight.new_empty(flat.numel(), self.d_model)  # every row is written: each id has one cluster
        for i in range(self.n_clusters):
            rows = self.members(cluster, i)  # (N_i,)
            table, proj = self.cluster(i)
            padded = rows if proj is None else bucketed(rows, self.row_multiple)  # (N_p,): padded for a product
            local = flat[padded] - self.bounds[i]  # (N_p,)
            vectors = F.embedding(local, table)  # (N_p, D_i)
            if proj is not None:
                vectors = F.linear(vectors, proj)  # (N_p, D)
            out.index_copy_(0, rows, vectors[: rows.numel()].to(out.dtype))
        return out.view(*ids.shape, self.d_model)


class AdaptiveLogSoftmax(_Clustered):
    """The head (shortlist + one logit per tail cluster) and the tail clusters' softmaxes; see the module docstring.

    It owns the word biases and the head's cluster logits; the word vectors (`words`) are passed in.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int] = ()):
        super().__init__(vocab_size, cutoffs)
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # cluster i's words at bounds[i] : bounds[i + 1]
        self.cluster_head = nn.Linear(d_model, len(cutoffs)) if cutoffs else None  # (n, D): the tail clusters' logits
        if self.cluster_head is not None:
            nn.init.zeros_(self.cluster_head.weight)  # as the Transformer-XL reference
            nn.init.zeros_(self.cluster_head.bias)

    def head_logits(self, h: torch.Tensor, words: AdaptiveEmbedding) -> torch.Tensor:
        """h (..., D) -> (..., V_0 + n): the shortlist's words, then tail clusters 1 .. n."""
        weight, bias = words.weight, self.bias[: self.bounds[1]]
        if self.cluster_head is not None:
            weight = torch.cat([weight, self.cluster_head.weight])
            bias = torch.cat([bias, self.cluster_head.bias])
        return F.linear(h, weight, bias)

    def tail_logits(self, h: torch.Tensor, words: AdaptiveEmbedding, i: int) -> torch.Tensor:
        """h (..., D) -> (..., V_i): the words of tail cluster i given that cluster."""
        table, proj = words.cluster(i)
        return F.linear(h if proj is None else h @ proj, table, self.bias[self.bounds[i] : self.bounds[i + 1]])

    def log_prob(self, h: torch.Tensor, words: AdaptiveEmbedding) -> torch.Tensor:
        """h (..., D) -> log p(w | h) (..., V) for every word w (float32 at least)."""
        head = _fp32(self.head_logits(h, words)).log_softmax(-1)  # (..., V_0 + n)
        v0 = self.bounds[1]
        parts = [head[..., :v0]]
        for i in range(1, self.n_clusters):
            parts.append(head[..., v0 + i - 1, None] + _fp32(self.tail_logits(h, words, i)).log_softmax(-1))
        return torch.cat(parts, -1) if len(parts) > 1 else parts[0]

    def logits(self, h: torch.Tensor, words: AdaptiveEmbedding) -> torch.Tensor:
        """h (..., D) -> (..., V) scores whose softmax is the model's distribution: the full softmax's logits,
        the adaptive softmax's log-probabilities."""
        return self.head_logits(h, words) if self.cluster_head is None else self.log_prob(h, words)

    def nll(self, h: torch.Tensor, words: AdaptiveEmbedding, targets: torch.Tensor) -> torch.Tensor:
        """h (..., D), targets (...) -> -log p(target | h) (...), without building (..., V)."""
        flat, y = h.reshape(-1, h.size(-1)), targets.reshape(-1)  # (N, D), (N,)
        head_target = y  # the full softmax's: no clusters to look up (Triton cannot compile a bucketize over none)
        if self.n_clusters > 1:
            cluster = self.cluster_of(y)
            head_target = torch.where(cluster == 0, y, self.bounds[1] + cluster - 1)  # a tail word: its cluster's logit
        nll = cross_entropy_rows(self.head_logits(flat, words), head_target)[0]  # (N,), float32 at least
        for i in range(1, self.n_clusters):
            rows = self.members(cluster, i)  # (N_i,)
            padded = bucketed(rows, self.row_multiple)  # (N_p,)
            tail = self.tail_logits(flat[padded], words, i)[: rows.numel()]  # (N_i, V_i) of (N_p, V_i)
            nll = nll.index_add(0, rows, cross_entropy_rows(tail, y[rows] - self.bounds[i])[0])
        return nll.view(targets.shape)
