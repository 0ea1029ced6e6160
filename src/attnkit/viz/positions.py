"""The sinusoidal positional encoding (Vaswani et al. 2017, section 3.5), pictured.

Left: PE as a heatmap, position x dimension. Right: the dot product PE[p] . PE[p + k] as a function of
the offset k for a few reference positions p; the curves coincide because the dot product is
sum_i cos(k w_i), a function of k alone, which is what lets attention find relative positions.

With `linear`, the paper's reason for choosing sinusoids: "for any fixed offset k, PE(pos+k) can be
represented as a linear function of PE(pos)". Each (sin, cos) pair of frequency w turns by the angle k w,
so PE[p + k] = PE[p] @ R_k with R_k block-diagonal (2 x 2 rotations), the same for every p. Checked, not
assumed: the least-squares map from PE[p] to PE[p + k] over P >> D positions leaves a relative residual
of a few 1e-6 (the float32 table's rounding), while for a random table of the same shape no linear map does
(residual ~ sqrt(1 - D/P)). Only the fast dimensions pin the map down: the slowest sinusoids barely move
over P positions, so the fit is free there: the map is drawn for the first dimensions (at most 16, those whose
sinusoid runs through two periods or more in the P positions), where it is R_k.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnkit.errors import AttnkitError
from attnkit.nn.positions import sinusoid_table
from attnkit.viz.figure import Plot, finish, subplots

MAP_DIMS = 16  # dimensions of the fitted map drawn (8 frequency pairs)


def offset_dot_products(table: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets k, PE[position] . PE[position + k]) for every k that stays inside the table."""
    offsets = np.arange(-position, table.shape[0] - position)
    return offsets, table[position + offsets] @ table[position]  # (P, D) @ (D,) -> (P,)


def shift_maps(table: np.ndarray, fit_positions: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each offset k, the least-squares linear map A_k (D, D) with table[p] @ A_k ~ table[p + k] over
    p < fit_positions, and its relative residual |X A_k - Y_k|_F / |Y_k|_F (X = table[:P], Y_k = table[k : P + k]).

    X is the same for every k, so its pseudo-inverse is computed once (the cut-off of numpy's lstsq).
    Returns (maps (K, D, D), residuals (K,)).
    """
    x = table[:fit_positions].astype(np.float64)  # (P, D)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    keep = s > np.finfo(np.float64).eps * max(x.shape) * s[0]
    pinv = (vt[keep].T / s[keep]) @ u[:, keep].T  # (D, P)
    maps, residuals = [], []
    for k in offsets:
        y = table[k : fit_positions + k].astype(np.float64)  # (P, D)
        a = pinv @ y
        maps.append(a)
        residuals.append(np.linalg.norm(x @ a - y) / np.linalg.norm(y))
    return np.stack(maps), np.asarray(residuals)


def rotation(d_model: int, k: int) -> np.ndarray:
    """R_k (D, D): PE[p + k] = PE[p] @ R_k for attnkit's interleaved table (sin at 2i, cos at 2i + 1)."""
    freqs = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    r = np.zeros((d_model, d_model))
    for i, (c, s) in enumerate(zip(np.cos(k * freqs), np.sin(k * freqs))):
        # sin(w(p+k)) = sin(wp) c + cos(wp) s,  cos(w(p+k)) = cos(wp) c - sin(wp) s
        r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, -s], [s, c]]
    return r


def shift_residuals(d_model: int, fit_positions: int, offsets: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Residual of the least-squares map PE[p] -> PE[p + k] over p < fit_positions, for each offset k, for the
    sinusoidal table and for a random (standard normal) table of the same shape."""
    if fit_positions <= d_model:
        raise AttnkitError(f"positions: --fit-positions {fit_positions} must exceed --d-model {d_model}, or "
                           "every table, random or not, fits a linear map exactly")
    n = fit_positions + int(offsets.max())
    tables = {"sinusoid": sinusoid_table(n, d_model).numpy(),
              "random": np.random.default_rng(seed).standard_normal((n, d_model))}
    return {"offsets": offsets, **{name: shift_maps(t, fit_positions, offsets)[1] for name, t in tables.items()}}


def _draw_linear(fig, map_ax, res_ax, d_model: int, offset: int, fit_positions: int, n_offsets: int) -> dict:
    """The fitted map for one offset (first MAP_DIMS dimensions) and the residual against the offset."""
    maps, residuals = shift_maps(sinusoid_table(fit_positions + offset, d_model).numpy(), fit_positions, [offset])
    fitted, residual = maps[0], float(residuals[0])
    freqs = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    dims = max(2, min(MAP_DIMS, 2 * int((freqs >= 4 * np.pi / fit_positions).sum())))  # >= 2 periods in the fit
    block = fitted[:dims, :dims]
    image = map_ax.imshow(block, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=map_ax, fraction=0.046)
    error = float(np.abs(block - rotation(d_model, offset)[:dims, :dims]).max())
    map_ax.set(xlabel="output dimension", ylabel="input dimension", xticks=range(0, dims, 2), yticks=range(0, dims, 2),
               title=f"least-squares map PE[p] → PE[p+{offset}]\n(first {dims} dims; max |A − R_k| {error:.0e})")
    res = shift_residuals(d_model, fit_positions, np.arange(1, n_offsets + 1))
    for name, label, color in (("sinusoid", "sinusoidal PE", "tab:blue"),
                               ("random", "random N(0, 1) table", "tab:red")):
        res_ax.semilogy(res["offsets"], res[name], color=color, label=f"{label} (max {res[name].max():.1e})")
    res_ax.set(xlabel="offset k", ylabel="‖PE[p] A − PE[p+k]‖ / ‖PE[p+k]‖", ylim=(1e-8, 3),
               title=f"best linear map, fitted over {fit_positions} positions")
    res_ax.legend(fontsize=8)
    res_ax.grid(alpha=0.3)
    return {"map": fitted, "map_residual": residual, "map_error": error, "residuals": res}


def plot_positions(path: str | Path | None, d_model: int = 128, n_positions: int = 100, *, linear: bool = False,
                   offset: int = 10, fit_positions: int = 1000) -> Plot:
    """data: table (P, D) as drawn, and dot[p] = (offsets, dot products) for each reference position; with
    `linear`, also the fitted map for `offset` (map, map_residual, map_error: max |A - R_k| over the dimensions
    drawn) and residuals (offsets 1 .. P-1, sinusoid and random residual per offset)."""
    if d_model < 2 or d_model % 2 or n_positions < 2:
        raise AttnkitError("positions: --d-model must be an even number >= 2 and --positions at least 2")
    if linear and offset < 1:
        raise AttnkitError(f"positions: --offset must be at least 1, not {offset}")
    table = sinusoid_table(n_positions, d_model).numpy()
    fig, axes = subplots(2 if linear else 1, 2, 5.5, 4.2)
    heat, dots = axes[0]
    image = heat.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    heat.set(xlabel="dimension", ylabel="position", title=f"sinusoidal positions (d_model {d_model})")
    fig.colorbar(image, ax=heat, fraction=0.046)
    dot = {}
    for p in sorted({n_positions // 4, n_positions // 2, 3 * n_positions // 4}):
        dot[p] = offset_dot_products(table, p)
        dots.plot(*dot[p], label=f"p = {p}", linewidth=1.2)
    dots.set(xlabel="offset k", ylabel="PE[p] · PE[p + k]", title="dot product depends on the offset only")
    dots.legend(fontsize=8)
    dots.grid(alpha=0.3)
    data = {"table": table, "dot": dot}
    if linear:
        data.update(_draw_linear(fig, *axes[1], d_model, offset, fit_positions, max(offset, n_positions - 1)))
    return finish(fig, data, path)
