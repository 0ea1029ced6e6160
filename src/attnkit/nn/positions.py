"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5)."""

from __future__ import annotations

import math

import torch
from torch import nn


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


class SinusoidalPositions(nn.Module):
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

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x + self.encodings(x.size(1), offset).to(x.dtype)  # (B, T, D) + (T, D)
