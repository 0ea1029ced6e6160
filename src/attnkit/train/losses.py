"""The translation loss: label-smoothed cross-entropy per target token, padding ignored (Szegedy et al. 2016;
Vaswani et al. 2017, section 5.4), computed a chunk of rows at a time by `attnkit.nn.cross_entropy`: from the logits,
or from the output layer's input and weights, the logits then made a chunk at a time and never whole.

N tokens, D model dim, V vocabulary.
"""

from __future__ import annotations

import torch

from attnkit.nn.cross_entropy import cross_entropy_rows, projected_cross_entropy


def smoothed_targets(target: torch.Tensor, vocab_size: int, epsilon: float) -> torch.Tensor:
    """(N,) class ids -> (N, V) target distribution: 1 - eps + eps/V on the true class, eps/V elsewhere."""
    dist = torch.full((target.numel(), vocab_size), epsilon / vocab_size)
    dist.scatter_(1, target.view(-1, 1), 1.0 - epsilon + epsilon / vocab_size)
    return dist


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed plain NLL over non-ignored tokens.

    logits (..., V), target (...). The smoothed loss is the cross-entropy against `smoothed_targets`,
    (1 - eps) * nll + eps * mean_v(-log p_v); the NLL carries no gradient; the caller divides by the token count
    (per target token, across accumulated batches).
    """
    target = target.reshape(-1)
    loss, nll = cross_entropy_rows(logits.reshape(-1, logits.size(-1)), target, epsilon)  # (N,) each
    keep = target.ne(ignore_index).to(loss.dtype)  # (N,)
    return (loss * keep).sum(), (nll * keep).sum()


def projected_label_smoothed_nll(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, epsilon: float,
    ignore_index: int = 0, row_multiple: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`label_smoothed_nll` of the logits h W^T + b, which are never held whole: h (..., D) the output layer's input,
    weight (V, D), bias (V,) or None, target (...). Only the non-ignored tokens' rows are projected at all.
    `row_multiple`: the products' rows padded to it (nn.cross_entropy.projection_rows)."""
    target = target.reshape(-1)
    rows = target.ne(ignore_index).nonzero()[:, 0]  # (n,) the real tokens
    return projected_cross_entropy(h.reshape(-1, h.size(-1))[rows], weight, bias, target[rows], epsilon,
                                   row_multiple)
