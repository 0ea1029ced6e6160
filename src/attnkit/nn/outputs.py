"""The output layer: hidden states to vocabulary logits, and a decoding step's log-probabilities.

N rows, D model dim, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Logits(nn.Module):
    """h W^T + b with the output layer's weight passed in: the target embedding where the two are tied, so this
    module owns no parameters (the state dict holds the table once) and a model swaps it as a whole (attnkit.cpu)."""

    def forward(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """(..., D) -> (..., V)."""
        return F.linear(h, weight, bias)

    def log_probs(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """A decoding step's (N, D) -> float32 log-probabilities (N, V)."""
        return self(h, weight, bias).float().log_softmax(dim=-1)
