"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

N tokens, V vocabulary.
"""

from __future__ import annotations

import torch


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
    (1 - eps) * nll + eps * mean_v(-log p_v), from one log-softmax (the vocabulary-sized pass is the
    costly one); the caller divides by the token count (per target token, across accumulated batches).
    """
    logp = logits.reshape(-1, logits.size(-1)).float().log_softmax(dim=-1)  # (N, V)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    nll = -logp.gather(1, target[:, None]).squeeze(1)  # (N,)
    uniform = -logp.mean(dim=-1)  # (N,)
    loss = ((1.0 - epsilon) * nll + epsilon * uniform).masked_fill(~keep, 0.0).sum()
    return loss, nll.detach().masked_fill(~keep, 0.0).sum()
