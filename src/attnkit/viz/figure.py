"""What every picture shares: the Agg backend, a CJK font for CJK text (viz/fonts.py), atomic PNG writes, and the
arrays behind a figure."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attnkit.io import atomic_write_bytes  # noqa: E402
from attnkit.viz.fonts import fit_fonts, said_once  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Plot:
    """A drawn picture: the (closed) figure, the file it went to, and the arrays it shows by name."""

    figure: Figure
    data: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """Lay out and render `fig` to PNG bytes, then close it (figures left open leak memory in long runs)."""
    fit_fonts(fig)  # before the layout: it measures the text in the fonts that will draw it
    buf = io.BytesIO()
    with said_once(fig):
        fig.tight_layout()  # only for files: the layout pass costs a full draw
        fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def finish(fig: Figure, data: dict[str, Any], path: str | Path | None, dpi: int = 100) -> Plot:
    """Save `fig` atomically as PNG at `path` (if given) and wrap it with its arrays. Its texts get their fonts
    either way, so a caller who saves the returned figure draws CJK tokens too."""
    fit_fonts(fig)
    if path is None:
        plt.close(fig)
        return Plot(fig, data)
    atomic_write_bytes(path, png_bytes(fig, dpi))
    return Plot(fig, data, Path(path))


def subplots(rows: int, cols: int, width: float, height: float) -> tuple[Figure, Any]:
    """A rows x cols grid of axes (always 2-D) with panels of the given size in inches."""
    return plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
