"""The sinusoidal positional encoding (Vaswani et al. 2017, section 3.5), pictured.

Left: PE as a heatmap, position x dimension. Right: the dot product PE[p] . PE[p + k] as a function of
the offset k for a few reference positions p; the curves coincide because the dot product is
sum_i cos(k w_i), a function of k alone, which is what lets attention find relative positions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnkit.errors import AttnkitError
from attnkit.nn.positions import sinusoid_table
from attnkit.viz.figure import Plot, finish, subplots


def offset_dot_products(table: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets k, PE[position] . PE[position + k]) for every k that stays inside the table."""
    offsets = np.arange(-position, table.shape[0] - position)
    return offsets, table[position + offsets] @ table[position]  # (P, D) @ (D,) -> (P,)


def plot_positions(path: str | Path | None, d_model: int = 128, n_positions: int = 100) -> Plot:
    """data: table (P, D) as drawn, and dot[p] = (offsets, dot products) for each reference position."""
    if d_model < 2 or d_model % 2 or n_positions < 2:
        raise AttnkitError("positions: --d-model must be an even number >= 2 and --positions at least 2")
    table = sinusoid_table(n_positions, d_model).numpy()
    fig, axes = subplots(1, 2, 5.5, 4.2)
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
    return finish(fig, {"table": table, "dot": dot}, path)
