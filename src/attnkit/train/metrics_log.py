"""Metrics to a CSV file (always) and TensorBoard (when installed), plus a plain-text run log."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

from attnkit.io import atomic_open
from attnkit.runtime import peak_resident_mb, resident_mb
from attnkit.viz.fonts import said_once

FIELDS = ["split", "step", "epoch", "elapsed_s", "loss", "nll", "ppl", "lr", "tok_s", "bleu", "bleu_lc", "chrf",
          "exact", "rss_mb", "peak_rss_mb"]


class MetricsLog:
    def __init__(self, run_dir: Path, *, resume_step: int | None = None, tensorboard: bool = True):
        self.csv_path = run_dir / "metrics.csv"
        self.text_path = run_dir / "train.log"
        if resume_step is not None and self.csv_path.exists():
            self._truncate_after(resume_step)  # rows a killed run wrote past its last checkpoint
        elif self.csv_path.exists():
            self.csv_path.unlink()
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard is an optional extra
                self.tb = None

    def _truncate_after(self, step: int) -> None:
        with self.csv_path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
        with atomic_open(self.csv_path, "w") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, split: str, step: int, **values: Any) -> None:
        values.setdefault("rss_mb", resident_mb())  # the process's resident memory now, so a run shows its footprint,
        values.setdefault("peak_rss_mb", peak_resident_mb())  # and its highest so far (inside steps, evaluations)
        new = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, FIELDS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({"split": split, "step": step, **{k: _fmt(v) for k, v in values.items()}})
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and key not in ("epoch", "elapsed_s"):
                    self.tb.add_scalar(f"{split}/{key}", value, step)
            self.tb.flush()

    @property
    def images(self) -> bool:
        """Whether figures go anywhere (TensorBoard is installed and on): drawing them costs time otherwise."""
        return self.tb is not None

    def figure(self, tag: str, fig, step: int) -> None:
        """A matplotlib figure as a TensorBoard image at `step` (laid out, rendered, then closed)."""
        if self.tb is None:
            return
        with said_once(fig):  # the figure's fonts are fitted (viz.report); a missing CJK font was said once
            fig.tight_layout()
            self.tb.add_figure(tag, fig, step, close=True)
        self.tb.flush()

    def say(self, message: str) -> None:
        """A line for the human log (train.log), time-stamped."""
        with self.text_path.open("a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class NullLog:
    """The log of a rank other than 0: every process trains, only rank 0 writes."""

    images = False

    def figure(self, tag: str, fig, step: int) -> None:
        pass

    def say(self, message: str) -> None:
        pass

    def write(self, split: str, step: int, **values: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v
