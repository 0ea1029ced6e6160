"""Stable row counts: products whose shapes repeat from step to step, so oneDNN builds each kernel once.

Under bf16 autocast oneDNN builds a kernel for every new product shape (costly where it runs AMX), and token-budget
batches bring new row counts each step. One rule pads them to counts that repeat:
- `RowsLinear` pads each product's rows with zero rows up to a multiple of `RowRule.multiple` (the token budget
  where builds are costly, 0 elsewhere); the zero rows add nothing to the gradient, their work is the price;
- the projected loss's chunks run on that many rows too (nn.cross_entropy.projection_rows);
- an adaptive softmax's tail clusters pad their rows to a multiple of ADAPTIVE_ROWS (nn.adaptive.bucketed).
tests/test_linear.py and tests/test_adaptive.py check values and gradients; benchmarks/kernel_builds.sh counts builds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.attention import StackedLinear

ADAPTIVE_ROWS = 32  # an adaptive softmax's tail cluster rows are padded to a multiple of this on CPUs


@dataclass
class RowRule:
    """What the products of one training run pad their rows to: `multiple` (0: as they are). Shared by every
    RowsLinear of a model, set per precision by `TrainingScope.precision`."""

    multiple: int = 0


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, multiple: int) -> torch.Tensor:
    """F.linear on x's rows padded with zero rows to a multiple of `multiple` (0: as is): (..., K) -> (..., N)."""
    n = x.numel() // max(x.size(-1), 1)
    extra = -n % multiple if multiple else 0
    if not extra:
        return F.linear(x, weight, bias)
    rows = F.pad(x.reshape(n, x.size(-1)), (0, 0, 0, extra))  # (n + extra, K)
    return F.linear(rows, weight, bias)[:n].view(*x.shape[:-1], -1)  # (n + extra, N) -> (..., N)


class RowsLinear(nn.Linear):
    """nn.Linear (same parameters) whose products run on rows padded to its rule's multiple."""

    rule: RowRule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded_linear(x, self.weight, self.bias, self.rule.multiple)


class RowsStackedLinear(RowsLinear, StackedLinear):
    """StackedLinear (same parameters) whose products, `part`'s too, run on rows padded to its rule's multiple."""

    def part(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        bias = None if self.bias is None else self.bias[start:stop]
        return padded_linear(x, self.weight[start:stop], bias, self.rule.multiple)
