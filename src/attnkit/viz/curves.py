"""Curves over training: metrics.csv of one or more run folders, where two models' curves cross, and learning-rate
schedules.

Any model family that logs to metrics.csv (columns split, step, elapsed_s and its metrics) gets its
curves drawn: every column of METRICS that holds numbers is a panel, every run a colour, training
rows solid and validation rows dashed, against updates and against wall-clock minutes.
`plot_crossing` draws the validation curves of several groups of runs (one corpus each) against the wall-clock
minutes of their budget and finds the minute from which one model stays ahead of another (`crossing_minute`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


# --- where two curves cross -----------------------------------------------------------------------------------------
Curve = tuple[np.ndarray, np.ndarray]  # (minutes, validation loss in nats), both (n,), minutes increasing


def valid_curve(run_dir: str | Path) -> Curve:
    """A run's validation loss (nats per token) against the wall-clock minutes of its budget at each evaluation."""
    valid = read_metrics(run_dir).get("valid", {})
    loss, seconds = valid.get("nll", valid.get("loss")), valid.get("elapsed_s")
    keep = None if loss is None or seconds is None else ~np.isnan(loss) & ~np.isnan(seconds)
    if keep is None or not keep.any():
        raise AttnkitError(f"{run_dir}/metrics.csv holds no validation loss with its elapsed_s")
    return seconds[keep] / 60.0, loss[keep]


def crossing_minute(a: Curve, b: Curve) -> float:
    """The minute from which curve `a` stays at or below curve `b` (each linear between its points) over the minutes
    both cover: the first of them when `a` is never above `b`, inf when `a` ends above `b`."""
    lo, hi = max(a[0][0], b[0][0]), min(a[0][-1], b[0][-1])
    grid = np.union1d(a[0], b[0])
    grid = grid[(grid >= lo) & (grid <= hi)]
    if grid.size == 0:
        raise AttnkitError(f"the two curves share no minutes ({a[0][0]:.1f}-{a[0][-1]:.1f} and "
                           f"{b[0][0]:.1f}-{b[0][-1]:.1f})")
    gap = np.interp(grid, *a) - np.interp(grid, *b)  # > 0 where a is behind
    behind = np.flatnonzero(gap > 0)
    if behind.size == 0:
        return float(grid[0])
    i = int(behind[-1])
    if i == grid.size - 1:
        return math.inf
    return float(grid[i] + (grid[i + 1] - grid[i]) * gap[i] / (gap[i] - gap[i + 1]))  # where the segment meets 0


@dataclass(frozen=True)
class CurveGroup:
    """One panel of `plot_crossing`: a corpus's runs by label, whose level sets the y axis (bits per character, or
    perplexity), and the labels of the baselines every other run is compared with."""

    title: str
    level: str  # char | word
    runs: dict[str, Path]
    baselines: tuple[str, ...]


@dataclass(frozen=True)
class Crossing:
    group: str
    model: str
    baseline: str
    minute: float  # from which `model` stays at or below `baseline` (inf: not within the runs)
    model_last: float  # each run's last validation figure (bpc or ppl)
    baseline_last: float
    minutes: float  # the last minute both runs reach


def level_metric(loss, level: str):
    """Nats per token (a float or an array) as a corpus's figure: bits per character at character level, else
    perplexity."""
    return loss / math.log(2) if level == "char" else np.exp(np.minimum(loss, 50.0))


def group_crossings(group: CurveGroup, curves: dict[str, Curve]) -> list[Crossing]:
    """Every non-baseline run of a group against each of its baselines."""
    out = []
    for base in group.baselines:
        for label in (k for k in curves if k not in group.baselines):
            (minutes, loss), (base_minutes, base_loss) = curves[label], curves[base]
            last, base_last = level_metric(np.array([loss[-1], base_loss[-1]]), group.level)
            out.append(Crossing(group.title, label, base, crossing_minute(curves[label], curves[base]), float(last),
                                float(base_last), float(min(minutes[-1], base_minutes[-1]))))
    return out


def plot_crossing(groups: Sequence[CurveGroup], path: str | Path | None, dpi: int = 110
                  ) -> tuple[Plot, list[Crossing]]:
    """One panel per group: each run's validation bpc (ppl) against minutes, baselines dashed, and a dotted line
    where a run goes below a baseline for good. data["group/label"] = (minutes, bpc or ppl)."""
    fig, axes = subplots(1, len(groups), 5.0, 3.6)
    data: dict[str, Curve] = {}
    crossings: list[Crossing] = []
    for ax, group in zip(axes[0], groups):
        curves = {label: valid_curve(run) for label, run in group.runs.items()}
        for (label, (minutes, loss)), color in zip(curves.items(), _colors(len(curves))):
            data[f"{group.title}/{label}"] = (minutes, level_metric(loss, group.level))
            ax.plot(minutes, level_metric(loss, group.level), color=color, marker="o", markersize=2.5, label=label,
                    linestyle="--" if label in group.baselines else "-")
        found = group_crossings(group, curves)
        crossings += found
        for c in (c for c in found if math.isfinite(c.minute)):
            ax.axvline(c.minute, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"{c.model} ahead\nfrom {c.minute:.0f} min", (c.minute, 0.95), fontsize=7, ha="left",
                        va="top", xycoords=("data", "axes fraction"), xytext=(3, 0), textcoords="offset points")
        ax.set(xlabel="wall-clock minutes of the budget", title=group.title,
               ylabel="valid bits per character" if group.level == "char" else "valid perplexity")
        if group.level != "char":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return finish(fig, data, path, dpi), crossings


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
