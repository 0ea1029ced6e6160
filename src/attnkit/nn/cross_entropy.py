"""Cross-entropy over a vocabulary, label smoothing optional, in one softmax pass a chunk of rows (Szegedy et al. 2016;
Vaswani et al. 2017, section 5.4).

N rows, V classes. Per row, against the target t: loss = (1 - eps) * nll + eps * mean_v(-log p_v) with
-log p_v = lse - z_v, so
    loss = lse - (1 - eps) * z_t - eps * mean_v(z_v),   d loss / d z = softmax(z) - (1 - eps) * onehot(t) - eps / V.
`cross_entropy_rows` computes both from the logits a chunk of rows at a time: no (N, V) log-softmax, target
distribution or float32 copy of the logits is ever held whole (the plain autograd path held four (N, V) float32
tensors at once, 16 N V bytes), only the logits and their gradient; the adaptive softmax's head and
clusters (`attnkit.nn.adaptive`) go through it. `projected_cross_entropy` starts a step earlier, from the output
layer's input h (N, D) and weights: each chunk's logits are made, used and dropped, so neither the logits nor their
gradient is ever held whole; the translation loss (`attnkit.train.losses`) trains the Transformer through it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 20  # logits per chunk (4 bytes each in float32): a chunk's passes stay in the CPU's caches


PROJECTED_CHUNK_ELEMENTS = 1 << 23  # logits per product of the projected loss on a CPU: 1,024 rows at V = 8,000
CUDA_CHUNK_FACTOR = 8  # on a GPU 8x as many: fewer, larger kernels per step


def _chunks(n: int, v: int) -> list[slice]:
    rows = max(1, CHUNK_ELEMENTS // v)
    return [slice(s, min(n, s + rows)) for s in range(0, n, rows)]


def _softmax_pass(z: torch.Tensor, target: torch.Tensor, epsilon: float, with_grad: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One chunk of logits z (n, V), float32 at least -> each row's logsumexp (n,), its mean logit (n,) when eps is
    not 0, and, `with_grad`, the loss's gradient softmax - (1 - eps) * onehot - eps / V (n, V), made in place of the
    softmax: one exponential a logit (lse = max z - log max p)."""
    p = torch.softmax(z, -1)  # (n, V)
    lse = z.amax(-1) - p.amax(-1).log()
    mean = z.mean(-1) if epsilon else None
    if not with_grad:
        return lse, mean, None
    p.sub_(epsilon / z.size(1)).scatter_add_(1, target[:, None], p.new_full((p.size(0), 1), epsilon - 1.0))
    return lse, mean, p


def _rows_pass(logits: torch.Tensor, target: torch.Tensor, epsilon: float, with_grad: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits (N, V), target (N,) -> each row's smoothed loss (N,) and NLL (N,), float32 at least, and `with_grad` the
    loss's gradient (N, V) in the logits' precision (for an upstream gradient of 1 a row): `_softmax_pass` a chunk of
    rows at a time, the chunk's float32 passes in the CPU's caches."""
    acc = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for a float64 check
    n, v = logits.shape
    lse = logits.new_empty(n, dtype=acc)  # (N,)
    mean = torch.empty_like(lse) if epsilon else None  # (N,) mean_v z_v
    grad = torch.empty_like(logits) if with_grad else None  # (N, V)
    for rows in _chunks(n, v):
        lse[rows], chunk_mean, p = _softmax_pass(logits[rows].to(acc), target[rows], epsilon, with_grad)
        if mean is not None:
            mean[rows] = chunk_mean
        if grad is not None:
            grad[rows] = p
    nll = lse - logits.gather(1, target[:, None])[:, 0].to(acc)  # (N,)
    loss = nll.clone() if mean is None else (1.0 - epsilon) * nll + epsilon * (lse - mean)
    return loss, nll, grad


class _SoftmaxCrossEntropy(torch.autograd.Function):
    """(logits (N, V), targets (N,), eps, with_grad) -> (smoothed loss (N,), NLL (N,)), float32 at least.

    One pass over each chunk of rows does everything: softmax (one exponential a logit, torch's fast vectorised one),
    the logsumexp read off it (its largest entry is exp(0) / sum, so lse = max z - log max p), and, when the logits
    need a gradient, the gradient itself by the module's formula, kept in the logits' precision for the backward to
    scale row by row. torch.exp and logsumexp cost more a logit than softmax's vectorised exponential on CPUs, and the
    logits are read once (benchmarks/loss_memory.py times it against the plain path). The NLL carries no gradient
    (it is the loss itself when eps is 0)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float, with_grad: bool):
        loss, nll, grad = _rows_pass(logits, target, epsilon, with_grad)
        if grad is not None:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        (grad,) = ctx.saved_tensors
        out = torch.empty_like(grad)  # (N, V) in the logits' precision
        for rows in _chunks(*grad.shape):  # each row scaled by its upstream gradient in float32 at least, a chunk at
            # a time: torch's mixed bf16 x float32 product is many times slower (benchmarks/loss_memory.py)
            out[rows] = grad[rows].to(grad_loss.dtype, copy=True).mul_(grad_loss[rows, None])
        return out, None, None, None


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, epsilon: float = 0.0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (N, V), target (N,) -> the label-smoothed loss (N,) and the plain NLL (N,) of every row, float32 at
    least (float64 for float64 logits); only the loss carries a gradient. See the module docstring."""
    with_grad = torch.is_grad_enabled() and logits.requires_grad  # no (N, V) gradient made for evaluation
    return _SoftmaxCrossEntropy.apply(logits, target, float(epsilon), with_grad)


def projection_rows(v: int, device: torch.device | None = None, row_multiple: int = 0) -> int:
    """Rows of a chunk of `projected_cross_entropy` over V classes: about PROJECTED_CHUNK_ELEMENTS logits (on a CPU
    1,024 rows at V = 8,000), a multiple of 16; with a `row_multiple` no more than it, and every chunk then runs on
    that many rows, the last padded with zero rows (the products' shapes repeat: attnkit.cpu.rows)."""
    elements = PROJECTED_CHUNK_ELEMENTS * (CUDA_CHUNK_FACTOR if device is not None and device.type == "cuda" else 1)
    rows = max(16, elements // v // 16 * 16)
    return min(rows, row_multiple) if row_multiple else rows


class _ProjectedCrossEntropy(torch.autograd.Function):
    """(h (N, D), weight (V, D), bias (V,) or None, targets (N,), eps, needs) -> (summed smoothed loss, summed NLL).

    The logits h W^T + b are made a chunk of rows at a time (in autocast's precision where it is on) and never held
    whole: each chunk's `_rows_pass` (itself a cache-sized chunk at a time) gives its loss and its gradient dz, which
    goes at once into the gradients of h (dz W), W (dz^T h, summed in float32) and b (dz summed); the backward scales
    them by the loss's upstream gradient, one number, as the loss is a sum. `needs` says which of h, weight and bias
    want a gradient (none: evaluation). Against the logits made whole and `cross_entropy_rows` over them, this holds
    neither the logits nor their gradient, so the peak memory falls and the logits are read while in cache:
    benchmarks/loss_memory.py measures both in bf16 and float32; tests/test_cross_entropy.py checks the values."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                epsilon: float, needs: tuple[bool, bool, bool], row_multiple: int):
        acc = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64 for a float64 check
        n, v = h.size(0), weight.size(0)
        rows, padded = projection_rows(v, h.device, row_multiple), row_multiple > 0
        grad_h = torch.empty_like(h) if needs[0] else None  # (N, D)
        grad_w = torch.zeros_like(weight, dtype=acc) if needs[1] else None  # (V, D)
        grad_b = torch.zeros(v, dtype=acc, device=h.device) if needs[2] else None  # (V,)
        loss, nll = h.new_zeros((), dtype=acc), h.new_zeros((), dtype=acc)
        for start in range(0, n, rows):
            hc, tc = h[start : start + rows], target[start : start + rows]  # (k, D), (k,)
            k = hc.size(0)
            if padded and k < rows:
                hc = F.pad(hc, (0, 0, 0, rows - k))  # (rows, D): zero rows, dropped below
            z = F.linear(hc, weight, bias)  # (rows or k, V) in the products' precision
            chunk_loss, chunk_nll, dz = _rows_pass(z[:k], tc, epsilon, any(needs))  # dz (k, V) like z
            loss += chunk_loss.sum()
            nll += chunk_nll.sum()
            if dz is None:
                continue
            if grad_b is not None:  # summed in float32, rounded to dz's precision as the product for W is; a
                # float32 result from bf16 costs several times the time (benchmarks/loss_memory.py)
                grad_b += dz.sum(0)
            if k < hc.size(0):
                dz = F.pad(dz, (0, 0, 0, hc.size(0) - k))  # zero rows: nothing reaches W or b from the padding
            # the products in z's precision: autocast, still on here, casts W (from its cache) and h as for z
            if grad_h is not None:
                grad_h[start : start + k] = (dz @ weight)[:k]  # (k, D)
            if grad_w is not None:
                grad_w += dz.t() @ hc  # (V, rows) @ (rows, D)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        grad_h, grad_w, grad_b = (None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors)
        return grad_h, grad_w, grad_b, None, None, None, None


def projected_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                            epsilon: float = 0.0, row_multiple: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """h (N, D) through the output layer (weight (V, D), bias (V,) or None) against target (N,) -> the summed
    label-smoothed loss and the summed plain NLL, float32 at least, without ever holding the (N, V) logits: equal to
    `cross_entropy_rows(F.linear(h, weight, bias), target, epsilon)` summed, in value and gradient. Only the loss
    carries a gradient, which must be a scalar's (the loss is a sum). `row_multiple`: `projection_rows`."""
    tracked = (h, weight, bias)
    needs = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad for t in tracked)
    return _ProjectedCrossEntropy.apply(h, weight, bias, target, float(epsilon), needs, row_multiple)
