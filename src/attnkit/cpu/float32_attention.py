"""Attention whose two products run in float32 on half-precision (bf16 / fp16) queries, keys and values.

B batch, H heads, T queries, S keys, Dh head dim.

Under bf16 autocast on a CPU, `q @ k^T` and `weights @ v` go to oneDNN, which builds a kernel for every (B * H, T, S) it
has not kept, and token-budget batches bring new lengths nearly every step. These small kernels also push the linear
maps' large kernels out of oneDNN's kernel cache, so those are rebuilt every step too. In float32 the same products are
plain batched GEMMs with no kernel to build, and at these sizes (T, S up to 64 keys, Dh 64) they are a few MFLOP each.
Autocast would cast float32 operands of a product back to bf16, so this is an autograd Function of its own: it saves
the half-precision inputs (views of the projections, which are kept anyway) and the float32 weights (what the softmax
saved before), widens the inputs again in `backward`, and returns the output and gradients in the inputs' dtype.
Dropout on the weights uses the same keep masks as `attnkit.cpu.dropout`.

Attention takes this path in training where `training_scope` finds kernel builds costly (`kernel_builds_costly`:
bf16 on a CPU with AMX), beside the linear maps' stable row counts (attnkit.cpu.rows): there a step builds no kernel
after its first updates. Where oneDNN runs AVX-512 BF16 instead, the step gains nothing and
holds more memory (the float32 weights), so the products stay in bf16. tests/test_float32_attention.py checks the
gradients and that no kernel is built for new lengths; benchmarks/kernel_builds.sh counts the builds per update.
"""

from __future__ import annotations

import torch

from attnkit.cpu.dropout import keep_mask
from attnkit.nn.masks import mask_scores_


class _Float32Products(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float, p: float):  # noqa: ANN001, ANN205
        wide = torch.promote_types(q.dtype, torch.float32)  # float64 stays float64 (gradcheck)
        with torch.autocast(q.device.type, enabled=False):
            scores = torch.matmul(q.to(wide), k.to(wide).transpose(-2, -1)).mul_(scale)  # (B, H, T, S)
            weights = mask_scores_(scores, mask, causal).softmax(dim=-1)  # (B, H, T, S), float32 or wider
            keep = keep_mask(weights.shape, p, weights.device) if p > 0.0 else None
            kept = weights if keep is None else weights * keep / (1.0 - p)
            out = torch.matmul(kept, v.to(wide))  # (B, H, T, Dh)
        ctx.save_for_backward(q, k, v, weights, keep)
        ctx.scale, ctx.p = scale, p
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        q, k, v, weights, keep = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            wide = weights.dtype
            grad = grad.to(wide)  # (B, H, T, Dh)
            kept = weights if keep is None else weights * keep / (1.0 - ctx.p)
            grad_v = torch.matmul(kept.transpose(-2, -1), grad)  # (B, H, S, Dh)
            grad_kept = torch.matmul(grad, v.to(wide).transpose(-2, -1))  # (B, H, T, S)
            grad_weights = grad_kept if keep is None else grad_kept.mul_(keep).div_(1.0 - ctx.p)
            grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, wide).mul_(ctx.scale)
            grad_q = torch.matmul(grad_scores, k.to(wide))  # (B, H, T, Dh)
            grad_k = torch.matmul(grad_scores.transpose(-2, -1), q.to(wide))  # (B, H, S, Dh)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None, None


def attend_float32(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool, scale: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(mask(q k^T * scale)) v with dropout on the weights, its products in float32, returned in q's dtype:
    (B, H, T, Dh) queries over (B, H, S, Dh) keys and values -> (B, H, T, Dh). `mask` is True-may-attend,
    broadcastable to (B, H, T, S); `causal` hides later keys (aligned at the right when S > T)."""
    return _Float32Products.apply(q, k, v, mask, causal, scale, dropout)
