"""Dropout with a uniform-sample mask.

`F.dropout` draws its mask with `bernoulli_`, which on CPUs costs about twice as much as drawing
uniform floats and comparing (measured: 14 ms vs 8 ms for a 1536x1024 float32 tensor on 2 cores):
in a small Transformer that was 17% of a training step. The distribution is the same, Bernoulli(1 - p)
scaled by 1 / (1 - p); on CUDA the fused kernel is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    keep = (torch.rand_like(x) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * keep


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
