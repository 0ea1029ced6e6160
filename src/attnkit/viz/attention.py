"""Attention heatmaps: one panel per head, axes labelled with the tokens."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from attnkit.io import atomic_write_bytes  # noqa: E402


def plot_attention_heads(weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str],
                         path: str | Path, title: str = "") -> plt.Figure:
    """weights (H, Tq, Tk) -> a grid of H heatmaps saved as PNG at `path`; returns the figure."""
    weights = weights.detach().float().cpu()
    n_heads = weights.size(0)
    cols = min(4, n_heads)
    rows = math.ceil(n_heads / cols)
    size = max(2.5, 0.28 * max(len(key_tokens), len(query_tokens)))
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= n_heads:
            ax.axis("off")
            continue
        ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h + 1}", fontsize=9)
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return fig
