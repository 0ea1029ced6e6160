"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

N tokens, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def smoothed_targets(target: torch.Tensor, vocab_size: int, epsilon: float) -> torch.Tensor:
    """(N,) class ids -> (N, V) target distribution: 1 - eps + eps/V on the true class, eps/V elsewhere."""
    dist = torch.full((target.numel(), vocab_size), epsilon / vocab_size)
    dist.scatter_(1, target.view(-1, 1), 1.0 - epsilon + epsilon / vocab_size)
    return dist


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed plain NLL over non-ignored tokens.

    logits (..., V), target (...). The smoothed loss is the cross-entropy against `smoothed_targets`;
    the caller divides by the token count (normalised per target token, across accumulated batches).
    """
    logits = logits.reshape(-1, logits.size(-1)).float()
    target = target.reshape(-1)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum")
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    return loss, nll
