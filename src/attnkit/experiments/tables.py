"""The tables every experiment writes: CSV at full precision, markdown with two decimals."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from attnkit.io import atomic_open, atomic_write_text


def cell(value) -> str:
    """A table cell: floats with two decimals (NaN empty), ints with thousands separators."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(out_dir: Path, stem: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """`stem`.csv (full precision) and `stem`.md (two decimals) in `out_dir`."""
    with atomic_open(out_dir / f"{stem}.csv", "w") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    atomic_write_text(out_dir / f"{stem}.md", markdown_table(header, rows))
