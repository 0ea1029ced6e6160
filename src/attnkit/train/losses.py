"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

N tokens, V vocabulary.

Per token, against the target t: loss = (1 - eps) * nll + eps * mean_v(-log p_v) with -log p_v = lse - z_v, so
    loss = lse - (1 - eps) * z_t - eps * mean_v(z_v),   d loss / d z = softmax(z) - (1 - eps) * onehot(t) - eps / V.
`label_smoothed_nll` computes both from the logits a chunk of rows at a time: no (N, V) log-softmax, target
distribution or float32 copy of the logits is ever held whole (the plain autograd path held four (N, V) float32
tensors at once: ~0.5 GB at 4,096 tokens x 8,000), only the logits and their gradient.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 20  # logits per chunk (4 MB in float32): a chunk's passes stay in the CPU's caches


def smoothed_targets(target: torch.Tensor, vocab_size: int, epsilon: float) -> torch.Tensor:
    """(N,) class ids -> (N, V) target distribution: 1 - eps + eps/V on the true class, eps/V elsewhere."""
    dist = torch.full((target.numel(), vocab_size), epsilon / vocab_size)
    dist.scatter_(1, target.view(-1, 1), 1.0 - epsilon + epsilon / vocab_size)
    return dist


def _chunks(n: int, v: int) -> list[slice]:
    rows = max(1, CHUNK_ELEMENTS // v)
    return [slice(s, min(n, s + rows)) for s in range(0, n, rows)]


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(logits (N, V), targets (N,), keep (N,), eps) -> (summed smoothed loss, summed NLL).

    One pass over each chunk of rows does everything: softmax (one exponential a logit, torch's fast vectorised one),
    the logsumexp read off it (its largest entry is exp(0) / sum, so lse = max z - log max p), and, when the logits
    need a gradient, the gradient itself by the module's formula, kept in the logits' precision for the backward to
    scale. torch.exp and logsumexp are 1.5-2.5x slower a logit than softmax on CPUs, and the logits are read once."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, epsilon: float):
        acc = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for a float64 check
        n, v = logits.shape
        lse = logits.new_empty(n, dtype=acc)  # (N,)
        mean = torch.empty_like(lse)  # (N,) mean_v z_v
        weight = keep.to(acc)  # (N,)
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None  # (N, V), unscaled
        for rows in _chunks(n, v):
            z = logits[rows].to(acc)  # (n, V)
            p = torch.softmax(z, -1)  # (n, V)
            lse[rows], mean[rows] = z.amax(-1) - p.amax(-1).log(), z.mean(-1)
            if grad is not None:  # softmax - (1 - eps) * onehot - eps / V, zero on ignored rows
                p.sub_(epsilon / v).scatter_add_(1, target[rows, None], p.new_full((p.size(0), 1), epsilon - 1.0))
                grad[rows] = p.mul_(weight[rows, None])
        z_t = logits.gather(1, target[:, None])[:, 0].to(acc)  # (N,)
        loss = ((lse - (1.0 - epsilon) * z_t - epsilon * mean) * weight).sum()
        nll = ((lse - z_t) * weight).sum()
        if grad is not None:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None, None  # (N, V) in the logits' precision


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed plain NLL over non-ignored tokens.

    logits (..., V), target (...). The smoothed loss is the cross-entropy against `smoothed_targets`,
    (1 - eps) * nll + eps * mean_v(-log p_v), computed a chunk of rows at a time (the module's docstring); the
    NLL carries no gradient; the caller divides by the token count (per target token, across accumulated batches).
    """
    target = target.reshape(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), target, target.ne(ignore_index),
                                       float(epsilon))
