"""The demo trains the same model on any CPU: its budget is updates, so a slower CPU takes longer, not scores lower."""

from __future__ import annotations

import csv
import itertools
import sys

from attnkit.config import resolve
from attnkit.demo import budget, run_demo

TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.device=cpu", "train.eval_max_sentences=10", "train.max_tokens=512",
        "train.max_epochs=3"]  # the preset's own budget otherwise: no minutes


class SlowClock:
    """time as a CPU 100 times slower would see it: each reading a minute after the last."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def monotonic(self) -> float:
        return 60.0 * next(self._ticks)

    def __getattr__(self, name):
        import time

        return getattr(time, name)


def updates(run_dir) -> list[tuple[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [(r["split"], r["step"]) for r in csv.DictReader(f)]


def test_the_demo_preset_budgets_updates_not_minutes():
    t = resolve(["demo"]).train
    assert t.max_minutes == 0 and t.max_epochs == 10 and budget(t) == "10 epochs, at most 1,310 updates"
    assert t.cooldown > 0 and t.max_steps == 1310  # the rate falls to 0 at the last update: every run ends settled


def test_a_slower_cpu_trains_the_demo_to_the_same_model(tmp_path, monkeypatch):
    quiet = {"progress": False, "say": lambda *a: None, "n_train": 200, "n_eval": 10, "overrides": TINY}
    fast = run_demo(tmp_path / "fast", **quiet)
    monkeypatch.setattr(sys.modules["attnkit.train.trainer"], "time", SlowClock())
    slow = run_demo(tmp_path / "slow", **quiet)
    assert updates(tmp_path / "slow") == updates(tmp_path / "fast")  # every update and evaluation, at the same steps
    assert int(updates(tmp_path / "fast")[-1][1]) > 3 * 2  # three epochs of a few batches each ran
    assert slow.scores == fast.scores and slow.samples == fast.samples
