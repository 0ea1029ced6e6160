"""Dropout whose mask on CPUs comes from 16-bit slices of random integers.

`F.dropout` draws its mask with `bernoulli_`, and `torch.rand` is not much cheaper: both spend most of their
time making random numbers, and a boolean mask then costs slow `where`/compare passes. Here one 64-bit draw
of `random_()` over the full int64 range serves four elements: each 16-bit slice is uniform over
[-2^15, 2^15). Less a threshold and stored in x's dtype ("keep scores"), an element is kept where its
score is positive, and that selection is `threshold_backward(x, scores, 0)`, one vectorised pass (its
gradient is the same pass over the incoming gradient). An element is dropped with probability
round(p * 2^16) / 2^16, within 2^-17 of p (0.1 -> 0.100006); kept ones are scaled by 1 / (1 - p); the draws
come from torch's generator, so seeds reproduce.

This replaces 32-bit masks, `where` passes and `bernoulli_`, which made dropout (a training step has dozens of sites)
a visible part of a CPU step; benchmarks/train_profile.py's "activations and dropout" category measures its share.
`training_scope` swaps every nn.Dropout of a model for `Dropout` on CPUs; on CUDA the fused kernel of `F.dropout`
is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def keep_scores(shape: torch.Size, p: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape` and `dtype` that is > 0 at the elements to keep: each independently with
    probability 1 - round(p * 2^16) / 2^16.

    The values are w - t for 16-bit integers w uniform over [-2^15, 2^15) and the half-integer threshold
    t = round(p * 2^16) - 2^15 - 1/2, so rounding to a narrow float (bfloat16) never changes their sign.
    """
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)  # full range
    threshold = round(p * 2**16) - 2**15 - 0.5
    exact = torch.float64 if dtype == torch.float64 else torch.float32
    scores = words.view(torch.int16)[:n].view(shape).to(exact).sub_(threshold)
    return scores.to(dtype)  # a no-op for float32/float64


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - p (to 2^-17), independently."""
    return keep_scores(shape, p, torch.float32, device) > 0


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training) with the mask from `keep_scores` on CPUs (F.dropout's fused kernel elsewhere)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    scores = keep_scores(x.shape, p, x.dtype, x.device)
    return torch.ops.aten.threshold_backward(x, scores, 0.0).mul_(1.0 / (1.0 - p))  # x where scores > 0, else 0


class Dropout(nn.Dropout):
    """nn.Dropout (attnkit.cpu.training_scope swaps it in on CPUs) whose mask comes from `keep_scores`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
