"""The residual blocks' normalisation: LayerNorm (the paper, section 3.1) or BatchNorm over a batch's tokens.

B batch, T length, D model dim. `model.variant: batch-norm` is the parts table's "BatchNorm instead of LayerNorm": each
feature normalised by its mean and variance over the batch's real tokens (padding neither counts nor moves the
running statistics), as CNNs normalise over a batch's pixels, and by the running statistics at inference: the
normalisation Shen et al. (2020, "PowerNorm") found to fail in NLP Transformers, since token statistics vary
from batch to batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

NormFn = Callable[[torch.Tensor], torch.Tensor]


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d over the tokens of (B, T, D) inputs; `keep` (B, T), True at the tokens the statistics count."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, x.size(-1)).float()  # (B*T, D); the statistics in float32, as LayerNorm's under autocast
        if not self.training:
            return _like(F.batch_norm(flat, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                      self.eps), x)
        rows = flat if keep is None else flat[keep.reshape(-1)]  # (N, D): the real tokens
        mean, var = rows.mean(0), rows.var(0, unbiased=False)  # (D,)
        with torch.no_grad():  # the running statistics, as nn.BatchNorm1d keeps them (an unbiased variance)
            n = rows.size(0)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / max(n - 1, 1), self.momentum)
            self.num_batches_tracked += 1
        return _like((flat - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias, x)


def _like(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B*T, D) float32 -> x's shape; in x's dtype outside autocast (under it, float32, as LayerNorm's output)."""
    out = out.view(x.shape)
    return out if torch.is_autocast_enabled(x.device.type) else out.to(x.dtype)


def norm_function(norm: nn.Module, keep: torch.Tensor | None = None) -> NormFn:
    """`norm` as a function of x alone, reading its parameters and statistics when called (so it stays right while
    they change in place) without a module call (a decoding step makes many): LayerNorm through torch.layer_norm,
    BatchNorm with `keep` in training and its running statistics otherwise."""
    if isinstance(norm, TokenBatchNorm):
        return (lambda x: norm(x, keep)) if norm.training else norm.forward
    shape, weight, bias, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    return lambda x: torch.layer_norm(x, shape, weight, bias, eps)
