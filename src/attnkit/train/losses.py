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
    """(logits (N, V), targets (N,), keep (N,), eps) -> (summed smoothed loss, summed NLL); the gradient by the
    formula of the module's docstring, a chunk at a time from the logits and each row's logsumexp."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, epsilon: float):
        acc = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for a float64 check
        lse = logits.new_empty(logits.size(0), dtype=acc)  # (N,)
        mean = torch.empty_like(lse)  # (N,) mean_v z_v
        for rows in _chunks(*logits.shape):
            z = logits[rows].to(acc)  # (n, V)
            lse[rows], mean[rows] = torch.logsumexp(z, -1), z.mean(-1)
        z_t = logits.gather(1, target[:, None])[:, 0].to(acc)  # (N,)
        weight = keep.to(acc)
        loss = ((lse - (1.0 - epsilon) * z_t - epsilon * mean) * weight).sum()
        nll = ((lse - z_t) * weight).sum()
        ctx.save_for_backward(logits, target, weight, lse)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        logits, target, weight, lse = ctx.saved_tensors
        eps, v = ctx.epsilon, logits.size(1)
        grad = torch.empty_like(logits)
        scale = grad_loss * weight  # (N,)
        for rows in _chunks(*logits.shape):
            g = torch.exp(logits[rows].to(lse.dtype) - lse[rows, None]).sub_(eps / v)  # softmax - eps / V, (n, V)
            g.scatter_add_(1, target[rows, None], g.new_full((g.size(0), 1), -(1.0 - eps)))
            grad[rows] = g.mul_(scale[rows, None])
        return grad, None, None, None


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
