"""Absolute positions added to the token embeddings: the sinusoids of Vaswani et al. (2017, section 3.5), a learned
table (ConvS2S, Gehring et al. 2017; BERT) or none (the order-blind model); `position_encoding(kind, ...)` builds one.

Each exposes `encodings(length, offset)` (T, D), `forward(x, offset)` (x + those) and `table` (P, D): row p is
position p. The sinusoids extend to any length; a learned table holds `max_positions` rows and refuses more."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.errors import ConfigError


def sinusoid_table(n_positions: int, d_model: int) -> torch.Tensor:
    """(P, D): PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angles = pos * inv_freq  # (P, D/2)
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


def halves_order(d_model: int) -> torch.Tensor:
    """(D,) where the other common layout of the same sinusoid (sines in channels [0, D/2), cosines in [D/2, D): the
    Transformer-XL reference, Marian, fairseq) keeps attnkit's channel j: sin_i sits at 2i here and at i there, cos_i
    at 2i + 1 and D/2 + i. So table_halves[:, halves_order(D)] == sinusoid_table (at equal frequencies)."""
    half = torch.arange(d_model // 2)
    return torch.stack([half, half + d_model // 2], dim=1).flatten()  # (D/2, 2) -> (D,)


class AbsolutePositions(nn.Module):
    """Adds the encodings of positions offset .. offset + T - 1 to (B, T, D) inputs."""

    def encodings(self, length: int, offset: int = 0) -> torch.Tensor:  # (T, D)
        raise NotImplementedError

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x + self.encodings(x.size(1), offset).to(x.dtype)  # (B, T, D) + (T, D)


class SinusoidalPositions(AbsolutePositions):
    """Adds PE[offset : offset + T] to (B, T, D) inputs; grows its table when a longer input comes."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)

    def encodings(self, length: int, offset: int = 0) -> torch.Tensor:
        """PE[offset : offset + length], (T, D)."""
        end = offset + length
        if end > self.table.size(0):
            self.table = sinusoid_table(max(end, 2 * self.table.size(0)), self.d_model).to(self.table.device)
        return self.table[offset:end]


class LearnedPositions(AbsolutePositions):
    """Adds a learned row per position, P[offset : offset + T], to (B, T, D) inputs (ConvS2S's position embeddings,
    BERT's). Initialised N(0, D^-1) per channel as fairseq's learned positions (std 0.06 at D = 256, beside the
    scaled token embeddings' 1: the words dominate at the start). A position past the table is a one-line error
    (a sinusoid could extend; learned rows cannot)."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.table = nn.Parameter(torch.randn(max_positions, d_model) * d_model**-0.5)  # (P, D)

    def encodings(self, length: int, offset: int = 0) -> torch.Tensor:
        """P[offset : offset + length], (T, D)."""
        end = offset + length
        if end > self.table.size(0):
            raise ConfigError(f"learned positions hold {self.table.size(0)} rows (model.max_positions); position "
                              f"{end - 1} was asked for: use shorter inputs or a larger max_positions")
        return self.table[offset:end]


class NoPositions(AbsolutePositions):
    """Adds nothing: a model without position information, whose encoder is permutation-equivariant (shuffling the
    source shuffles its states the same way). `table` is zeros, for the exports that write a table."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.register_buffer("table", torch.zeros(max_positions, d_model), persistent=False)  # (P, D)

    def encodings(self, length: int, offset: int = 0) -> torch.Tensor:
        return self.table.new_zeros(length, self.table.size(1))  # (T, D)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x


def position_encoding(kind: str, d_model: int, max_positions: int) -> AbsolutePositions:
    """The absolute positions a config names (`model.positions`, config.POSITIONS): sinusoidal | learned | none, and
    none for shaw, whose positions are relative ones inside the self-attention (nn/shaw.py)."""
    kinds = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions, "none": NoPositions, "shaw": NoPositions}
    return kinds[kind](d_model, max_positions)
