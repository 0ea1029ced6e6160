"""Attention masks. Convention: boolean, True = may attend (as in torch's SDPA).

B batch, S key length, T query length.
"""

from __future__ import annotations

import torch


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> torch.Tensor:
    """(T, S) lower-triangular mask; with S > T the extra keys are a prefix every query may see."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def key_padding_to_attn_mask(pad_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) True-at-padding -> (B, 1, 1, S) True-may-attend, broadcast over heads and queries."""
    return ~pad_mask[:, None, None, :]


def mask_scores_(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Attention logits (B, H, T, S) with -inf, in place, where a key is hidden: later keys when `causal` (aligned at
    the right, as `causal_mask`), and where the True-may-attend `mask` (broadcastable) is False."""
    if causal:
        scores.masked_fill_(~causal_mask(scores.size(2), scores.size(3), scores.device), float("-inf"))
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return scores
