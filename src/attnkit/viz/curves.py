"""Curves over training: metrics.csv of one or more run folders, and learning-rate schedules.

Any model family that logs to metrics.csv (columns split, step, elapsed_s and its metrics) gets its
curves drawn: every column of METRICS that holds numbers is a panel, every run a colour, training
rows solid and validation rows dashed, against updates and against wall-clock minutes.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnkit.errors import AttnkitError
from attnkit.viz.figure import Plot, finish, subplots

METRICS = ("loss", "ppl", "bpc", "bleu", "lr")
X_AXES = {"step": ("step", "updates"), "time": ("elapsed_s", "wall-clock (min)")}


def read_metrics(run_dir: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """split -> column -> float array (NaN where a row has no value); train perplexity from its nll."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise AttnkitError(f"no metrics.csv in {run_dir} (is it a run folder?)")
    rows: dict[str, list[dict[str, str]]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row.get("split") or "train", []).append(row)
    out: dict[str, dict[str, np.ndarray]] = {}
    for split, split_rows in rows.items():
        cols = {k: np.array([_number(r.get(k)) for r in split_rows]) for k in split_rows[0] if k != "split"}
        if "ppl" in cols and "nll" in cols and np.isnan(cols["ppl"]).all():
            cols["ppl"] = np.exp(np.minimum(cols["nll"], 50))  # train rows log nll, not ppl
        out[split] = cols
    return out


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _run_labels(run_dirs: list[Path]) -> list[str]:
    names = [p.resolve().name for p in run_dirs]
    return names if len(set(names)) == len(names) else [f"{i + 1}:{n}" for i, n in enumerate(names)]


def plot_curves(run_dirs: list[str | Path], path: str | Path | None, x_axes: tuple[str, ...] = ("step", "time"),
                metrics: tuple[str, ...] = METRICS, dpi: int = 100) -> Plot:
    """Rows: x axes (updates, wall-clock); columns: metrics present. data["run/split/metric/x"] = (x, y)."""
    runs = [Path(r) for r in run_dirs]
    logs = [read_metrics(r) for r in runs]
    present = [m for m in metrics if any(m in cols and not np.isnan(cols[m]).all()
                                         for log in logs for cols in log.values())]
    if not present:
        raise AttnkitError(f"no {'/'.join(metrics)} values in the metrics.csv of {', '.join(map(str, runs))}")
    fig, axes = subplots(len(x_axes), len(present), 4.0, 3.0)
    data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for label, log, color in zip(_run_labels(runs), logs, _colors(len(runs))):
        for split, cols in log.items():
            for r, x in enumerate(x_axes):
                column, _ = X_AXES[x]
                for c, metric in enumerate(present):
                    if metric not in cols or column not in cols or np.isnan(cols[metric]).all():
                        continue
                    keep = ~np.isnan(cols[metric]) & ~np.isnan(cols[column])
                    xs = cols[column][keep] / (60.0 if x == "time" else 1.0)
                    data[f"{label}/{split}/{metric}/{x}"] = (xs, cols[metric][keep])
                    axes[r, c].plot(xs, cols[metric][keep], color=color, linestyle="-" if split == "train" else "--",
                                    marker=None if split == "train" else "o", markersize=3, label=f"{label} {split}")
    for r, x in enumerate(x_axes):
        for c, metric in enumerate(present):
            ax = axes[r, c]
            ax.set(xlabel=X_AXES[x][1], title=metric)
            if metric in ("ppl", "lr") and _positive(data, metric):
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    return finish(fig, data, path, dpi)


def _positive(data: dict, metric: str) -> bool:
    values = [y for key, (_, y) in data.items() if key.split("/")[-2] == metric]
    return bool(values) and all((v > 0).all() for v in values)


def _colors(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def plot_schedule(schedule: Callable[[int], float], steps: int, path: str | Path | None, title: str = "") -> Plot:
    """The learning rate at updates 1..steps. data: steps, lr (exactly the schedule's values)."""
    if steps < 1:
        raise AttnkitError("schedule: --steps must be at least 1")
    xs = np.arange(1, steps + 1)
    lr = np.array([schedule(int(s)) for s in xs])
    fig, axes = subplots(1, 1, 6.0, 3.6)
    ax = axes[0, 0]
    ax.plot(xs, lr, color="tab:blue")
    peak = int(lr.argmax())
    ax.annotate(f"peak {lr[peak]:.3g} at step {xs[peak]}", (xs[peak], lr[peak]), textcoords="offset points",
                xytext=(10, -12), fontsize=8)
    ax.set(xlabel="update", ylabel="learning rate", title=title or "learning-rate schedule")
    ax.grid(alpha=0.3)
    return finish(fig, {"steps": xs, "lr": lr}, path)
