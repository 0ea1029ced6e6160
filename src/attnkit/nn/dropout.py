"""Dropout whose mask on CPUs comes from random integer bits.

`F.dropout` draws its mask with `bernoulli_`, and `torch.rand` is not much cheaper; both spend most of
their time making the random numbers (measured on 2 cores for a (32, 4, 128, 512) float32 tensor, the
attention weights of the LM workload: F.dropout 76 ms, uniform floats + compare 65 ms, this mask 50 ms;
at 4 layers that was 13% of a Transformer-XL training step). Here one 64-bit draw of `random_()`
(uniform over [0, 2^63)) serves two elements: read as two int32 words, the low word is uniform over all
2^32 values and the high word over [0, 2^31), and each is compared with p times its range. So an element
is dropped with probability p to within 2^-32 (float uniforms resolve 2^-24), kept ones are scaled by
1 / (1 - p), and the draws come from torch's generator, so seeds reproduce. On CUDA the fused kernel is used.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - p, independently."""
    n = shape.numel()
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=device).random_().view(torch.int32).view(-1, 2)
    low, high = round(p * 2**32) - 2**31, round(p * 2**31)  # drop below these: (low word, high word)
    thresholds = (low, high) if sys.byteorder == "little" else (high, low)
    keep = words >= torch.tensor(thresholds, dtype=torch.int32, device=device)  # (ceil(n/2), 2)
    return keep.view(-1)[:n].view(shape)


def drop(x: torch.Tensor, p: float, training: bool) -> tuple[torch.Tensor, float]:
    """(x with the dropped elements zeroed, the scale the kept ones still need): the caller may apply the
    scale to a smaller tensor further on (attention scales its output rather than its weights)."""
    if not training or p == 0.0:
        return x, 1.0
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training), 1.0
    return torch.where(keep_mask(x.shape, p, x.device), x, 0.0), 1.0 / (1.0 - p)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    kept, scale = drop(x, p, training)
    return kept if scale == 1.0 else kept * scale


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
