"""Why attention divides its scores by sqrt(d_k) (Vaswani et al. 2017, section 3.2.1, footnote 4).

For q, k with independent unit-variance components, q . k = sum of d_k products has variance d_k.
Unscaled, the scores spread out as d_k grows, the softmax saturates (its largest probability
goes to 1) and its Jacobian diag(p) - p p^T, the gradient that reaches the scores, vanishes.
Divided by sqrt(d_k) the variance stays 1 and the softmax stays soft, whatever d_k.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnkit.viz.figure import Plot, finish, subplots

D_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """p (..., n) -> d softmax / d scores (..., n, n) = diag(p) - p p^T."""
    return torch.diag_embed(p) - p[..., :, None] * p[..., None, :]


def softmax_scaling(d_ks: tuple[int, ...] = D_KS, n_keys: int = 32, n_samples: int = 1000,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """For random q (one per sample) and n_keys keys: statistics of the scores, unscaled and scaled.

    Returns d_k, var_raw / var_scaled (variance of q . k), pmax_raw / pmax_scaled (mean largest softmax
    probability), jac_raw / jac_scaled (mean Frobenius norm of the softmax Jacobian).
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[float]] = {k: [] for k in ("var_raw", "var_scaled", "pmax_raw", "pmax_scaled",
                                                   "jac_raw", "jac_scaled")}
    for d in d_ks:
        q = torch.randn(n_samples, 1, d, generator=gen, dtype=torch.float64)
        k = torch.randn(n_samples, n_keys, d, generator=gen, dtype=torch.float64)
        raw = (q * k).sum(-1)  # (N, n_keys) dot products
        for name, scores in (("raw", raw), ("scaled", raw / d**0.5)):
            p = scores.softmax(-1)
            out[f"var_{name}"].append(float(scores.var()))
            out[f"pmax_{name}"].append(float(p.max(-1).values.mean()))
            out[f"jac_{name}"].append(float(torch.linalg.matrix_norm(softmax_jacobian(p)).mean()))
    return {"d_k": np.asarray(d_ks), **{k: np.asarray(v) for k, v in out.items()}}


def plot_softmax(path: str | Path | None, d_ks: tuple[int, ...] = D_KS, n_keys: int = 32,
                 n_samples: int = 1000, seed: int = 0) -> Plot:
    """Three panels against d_k: score variance, largest softmax probability, Jacobian norm."""
    s = softmax_scaling(d_ks, n_keys, n_samples, seed)
    fig, axes = subplots(1, 3, 4.2, 3.6)
    panels = (("var", "variance of q·k", "log"), ("pmax", f"largest softmax prob. ({n_keys} keys)", "linear"),
              ("jac", "‖softmax Jacobian‖_F", "log"))
    for ax, (key, title, yscale) in zip(axes[0], panels):
        ax.plot(s["d_k"], s[f"{key}_raw"], "o-", label="q·k", color="tab:red")
        ax.plot(s["d_k"], s[f"{key}_scaled"], "s-", label="q·k / √d_k", color="tab:blue")
        ax.set(xscale="log", yscale=yscale, xlabel="d_k", title=title)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"why scores are divided by √d_k (random q, k ~ N(0, 1), {n_samples} samples)", fontsize=10)
    return finish(fig, s, path)
