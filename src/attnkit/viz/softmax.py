"""Why attention divides its scores by sqrt(d_k) (Vaswani et al. 2017, section 3.2.1, footnote 4).

For q, k with independent unit-variance components, q . k = sum of d_k products has variance d_k.
Unscaled, the scores spread out as d_k grows, the softmax saturates (its largest probability
goes to 1) and its Jacobian diag(p) - p p^T, the gradient that reaches the scores, vanishes.
Divided by sqrt(d_k) the variance stays 1 and the softmax stays soft, whatever d_k.

The same argument on three numbers: the logits [a, a, 2a] put 1 / (1 + 2 e^-a) on the largest one, and
the Jacobian's entries shrink like e^-a. Unscaled scores of width d_k differ by about sqrt(d_k), so a grows
like sqrt(d_k): at d_k = 64, a = 8 leaves a Jacobian norm of 1e-3, against 0.47 at a = 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnkit.viz.figure import Plot, finish, subplots

D_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TABLE_AS = (0, 1, 2, 4, 8, 16, 32)  # the values of a the picture lists as numbers


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


def two_to_one_logits(a_values: np.ndarray) -> dict[str, np.ndarray]:
    """For the logits [a, a, 2a] at each a: a, pmax (the probability of 2a), pother (of each a) and jac (the
    Frobenius norm of the softmax Jacobian), in float64 so the small gradients stay visible."""
    a = torch.as_tensor(np.asarray(a_values, dtype=np.float64))
    logits = torch.stack([a, a, 2 * a], dim=-1)  # (A, 3)
    p = logits.softmax(-1)
    jac = torch.linalg.matrix_norm(softmax_jacobian(p))  # (A,)
    return {"a": a.numpy(), "pmax": p[:, 2].numpy(), "pother": p[:, 0].numpy(), "jac": jac.numpy()}


def _draw_scaling(axes, s: dict[str, np.ndarray], n_keys: int) -> None:
    panels = (("var", "variance of q·k", "log"), ("pmax", f"largest softmax prob. ({n_keys} keys)", "linear"),
              ("jac", "‖softmax Jacobian‖_F", "log"))
    for ax, (key, title, yscale) in zip(axes, panels):
        ax.plot(s["d_k"], s[f"{key}_raw"], "o-", label="q·k", color="tab:red")
        ax.plot(s["d_k"], s[f"{key}_scaled"], "s-", label="q·k / √d_k", color="tab:blue")
        ax.set(xscale="log", yscale=yscale, xlabel="d_k", title=title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)


def _draw_two_to_one(axes, f: dict[str, np.ndarray], table: dict[str, np.ndarray], d_ks: tuple[int, ...]) -> None:
    """The [a, a, 2a] row: probabilities and Jacobian norm against a (a = √d_k marked), then the numbers."""
    probs, grads, numbers = axes
    probs.plot(f["a"], f["pmax"], color="tab:red", label="p(2a)")
    probs.plot(f["a"], f["pother"], color="tab:blue", label="p(a), each")
    probs.set(xlabel="a", ylabel="probability", title="softmax([a, a, 2a])", ylim=(0, 1))
    grads.semilogy(f["a"], f["jac"], color="tab:purple")
    grads.set(xlabel="a", title="‖Jacobian‖_F of softmax([a, a, 2a])")
    for d in sorted({d for d in d_ks if d in (64, d_ks[-1])}):  # where unscaled scores of width d_k sit
        for ax in (probs, grads):
            ax.axvline(d**0.5, color="gray", linestyle="--", linewidth=1)
        grads.annotate(f"a = √{d}", (d**0.5, f["jac"].max()), fontsize=8, rotation=90, va="top", ha="right")
    for ax in (probs, grads):
        ax.grid(alpha=0.3)
    probs.legend(fontsize=8)
    rows = [f"{a:>4g}   {p:.6f}   {j:.2e}" for a, p, j in zip(table["a"], table["pmax"], table["jac"])]
    numbers.axis("off")
    numbers.text(0.0, 1.0, "   a   p(2a)      ‖J‖_F\n" + "\n".join(rows), family="monospace", fontsize=9,
                 va="top", transform=numbers.transAxes)
    numbers.set_title("[a, a, 2a] in numbers", fontsize=10)


def plot_softmax(path: str | Path | None, d_ks: tuple[int, ...] = D_KS, n_keys: int = 32,
                 n_samples: int = 1000, seed: int = 0) -> Plot:
    """Top row against d_k: score variance, largest softmax probability, Jacobian norm, sampled with and without
    the 1/√d_k; bottom row: the same two quantities for the logits [a, a, 2a] against a, up to a = √max(d_k).

    data: the sampled statistics (`softmax_scaling`'s keys), `two_to_one` (the curves of `two_to_one_logits`)
    and `two_to_one_table` (the numbers listed, at a in TABLE_AS up to the largest a drawn).
    """
    s = softmax_scaling(d_ks, n_keys, n_samples, seed)
    a_max = max(8.0, max(d_ks) ** 0.5)
    curve = two_to_one_logits(np.linspace(0.0, a_max, 241))
    table = two_to_one_logits(np.asarray([a for a in TABLE_AS if a <= a_max], dtype=np.float64))
    fig, axes = subplots(2, 3, 4.2, 3.6)
    _draw_scaling(axes[0], s, n_keys)
    _draw_two_to_one(axes[1], curve, table, d_ks)
    fig.suptitle(f"why scores are divided by √d_k (top: random q, k ~ N(0, 1), {n_samples} samples; "
                 "bottom: the logits [a, a, 2a])", fontsize=10)
    return finish(fig, {**s, "two_to_one": curve, "two_to_one_table": table}, path)
