"""Cross-entropy over a vocabulary, label smoothing optional, in one softmax pass a chunk of rows (Szegedy et al. 2016;
Vaswani et al. 2017, section 5.4).

N rows, V classes. Per row, against the target t: loss = (1 - eps) * nll + eps * mean_v(-log p_v) with
-log p_v = lse - z_v, so
    loss = lse - (1 - eps) * z_t - eps * mean_v(z_v),   d loss / d z = softmax(z) - (1 - eps) * onehot(t) - eps / V.
`cross_entropy_rows` computes both from the logits a chunk of rows at a time: no (N, V) log-softmax, target
distribution or float32 copy of the logits is ever held whole (the plain autograd path held four (N, V) float32
tensors at once: ~0.5 GB at 4,096 tokens x 8,000), only the logits and their gradient. The translation loss
(`attnkit.train.losses`) and the adaptive softmax's head and clusters (`attnkit.nn.adaptive`) both go through it.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 20  # logits per chunk (4 MB in float32): a chunk's passes stay in the CPU's caches


def _chunks(n: int, v: int) -> list[slice]:
    rows = max(1, CHUNK_ELEMENTS // v)
    return [slice(s, min(n, s + rows)) for s in range(0, n, rows)]


class _SoftmaxCrossEntropy(torch.autograd.Function):
    """(logits (N, V), targets (N,), eps, with_grad) -> (smoothed loss (N,), NLL (N,)), float32 at least.

    One pass over each chunk of rows does everything: softmax (one exponential a logit, torch's fast vectorised one),
    the logsumexp read off it (its largest entry is exp(0) / sum, so lse = max z - log max p), and, when the logits
    need a gradient, the gradient itself by the module's formula, kept in the logits' precision for the backward to
    scale row by row. torch.exp and logsumexp are 1.5-2.5x slower a logit than softmax on CPUs, and the logits are
    read once. The NLL carries no gradient (it is the loss itself when eps is 0)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float, with_grad: bool):
        acc = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for a float64 check
        n, v = logits.shape
        lse = logits.new_empty(n, dtype=acc)  # (N,)
        mean = torch.empty_like(lse) if epsilon else None  # (N,) mean_v z_v
        grad = torch.empty_like(logits) if with_grad else None  # (N, V), for an upstream gradient of 1 a row
        for rows in _chunks(n, v):
            z = logits[rows].to(acc)  # (n, V)
            p = torch.softmax(z, -1)  # (n, V)
            lse[rows] = z.amax(-1) - p.amax(-1).log()
            if mean is not None:
                mean[rows] = z.mean(-1)
            if grad is not None:  # softmax - (1 - eps) * onehot - eps / V
                p.sub_(epsilon / v).scatter_add_(1, target[rows, None], p.new_full((p.size(0), 1), epsilon - 1.0))
                grad[rows] = p
        nll = lse - logits.gather(1, target[:, None])[:, 0].to(acc)  # (N,)
        loss = nll.clone() if mean is None else (1.0 - epsilon) * nll + epsilon * (lse - mean)
        if grad is not None:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        (grad,) = ctx.saved_tensors
        out = torch.empty_like(grad)  # (N, V) in the logits' precision
        for rows in _chunks(*grad.shape):  # each row scaled by its upstream gradient in float32 at least, a chunk at
            # a time: torch's mixed bf16 x float32 product is ~12x slower (39 vs 3.3 ms at 1,900 x 8,000)
            out[rows] = grad[rows].to(grad_loss.dtype, copy=True).mul_(grad_loss[rows, None])
        return out, None, None, None


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, epsilon: float = 0.0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (N, V), target (N,) -> the label-smoothed loss (N,) and the plain NLL (N,) of every row, float32 at
    least (float64 for float64 logits); only the loss carries a gradient. See the module docstring."""
    with_grad = torch.is_grad_enabled() and logits.requires_grad  # no (N, V) gradient made for evaluation
    return _SoftmaxCrossEntropy.apply(logits, target, float(epsilon), with_grad)
