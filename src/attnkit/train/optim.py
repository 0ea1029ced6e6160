"""The optimizer training uses: AdamW on torch's fused kernel where it runs (attnkit.cpu.FusedAdamW), else torch's."""

from __future__ import annotations

from typing import Any

import torch

from attnkit.cpu import FusedAdamW


def adamw(groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float], eps: float,
          device: torch.device) -> FusedAdamW | torch.optim.AdamW:
    """AdamW for parameters on `device`: the fused kernel on CPU and CUDA (one pass per parameter instead of the
    default implementation's several element-wise operations, and no compiler import), torch.optim.AdamW's default
    implementation elsewhere."""
    if device.type in ("cpu", "cuda"):
        return FusedAdamW(groups, lr=lr, betas=betas, eps=eps)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
