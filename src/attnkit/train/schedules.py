"""Learning-rate schedules as plain functions of the update number (1-based). The cosine can also decay over a
wall-clock budget: it is then called with the fraction of the budget spent, and goes by whichever is further on.
Any schedule can end in a cooldown, a linear fall to 0 over the last part of its horizon (steps or time)."""

from __future__ import annotations

import math
from collections.abc import Callable

from attnkit.errors import ConfigError


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """Vaswani et al. (2017), eq. 3: d^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up to peak_lr, then peak_lr * sqrt(warmup / step) (fairseq's inverse_sqrt)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))


def cosine(step: int, peak_lr: float, warmup: int, total: int, min_ratio: float = 0.0, spent: float = 0.0) -> float:
    """Linear warm-up, then half a cosine from peak_lr down to min_ratio * peak_lr at `total` updates or when
    `spent` (the fraction of a time budget used so far) reaches 1, whichever comes first; total 0: time only."""
    step = max(step, 1)
    if step < warmup:
        return peak_lr * step / warmup
    by_steps = (step - warmup) / max(1, total - warmup) if total > 0 else 0.0
    progress = min(1.0, max(by_steps, spent))
    return peak_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def cooldown(progress: float, fraction: float) -> float:
    """The factor of warmup-stable-decay's last phase (Hägele et al., 2024, "Scaling laws and compute-optimal
    training beyond fixed training durations"): 1 until the last `fraction` of the horizon, then falling linearly
    to 0 at its end. `progress` is the share of the horizon done (0..1)."""
    if fraction <= 0 or progress <= 1.0 - fraction:
        return 1.0
    return max(0.0, 1.0 - progress) / fraction


def make_schedule(name: str, *, lr: float | None, warmup: int, d_model: int, total: int = 0,
                  by_time: bool = False, cooldown_fraction: float = 0.0) -> Callable[..., float]:
    """The configured schedule, a function of the update number. `lr` is the peak; noam with lr=None keeps the
    paper's own scale. With `by_time` (a cosine or a cooldown) it also takes `spent`, the fraction of the time
    budget used. `cooldown_fraction` > 0 ends the schedule in a linear fall to 0 over that last share of the
    horizon: `total` updates or the time budget, whichever comes first."""
    if by_time and name != "cosine" and cooldown_fraction <= 0:
        raise ConfigError(f"train.horizon=time decays the cosine schedule over the time budget; {name} has no horizon")
    if cooldown_fraction > 0 and total <= 0 and not by_time:
        raise ConfigError("train.cooldown needs a horizon: train.max_steps > 0 or train.horizon=time")
    base = _base_schedule(name, lr=lr, warmup=max(warmup, 1), d_model=d_model, total=total, by_time=by_time)
    if cooldown_fraction <= 0:
        return base

    def with_cooldown(step: int, spent: float = 0.0) -> float:
        progress = max(step / total if total > 0 else 0.0, spent)
        return base(step, spent=spent) * cooldown(progress, cooldown_fraction)
    return with_cooldown


def _base_schedule(name: str, *, lr: float | None, warmup: int, d_model: int, total: int,
                   by_time: bool) -> Callable[..., float]:
    """The schedule without its cooldown; every one takes (step, spent=0.0), and only the cosine reads spent."""
    if name == "noam":
        peak = noam(warmup, d_model, warmup)
        factor = 1.0 if lr is None else lr / peak
        return lambda step, spent=0.0: noam(step, d_model, warmup, factor)
    peak_lr = 5e-4 if lr is None else lr
    if name == "inverse_sqrt":
        return lambda step, spent=0.0: inverse_sqrt(step, peak_lr, warmup)
    if name == "cosine":
        if total <= 0 and not by_time:
            raise ConfigError("the cosine schedule needs a horizon: train.max_steps > 0 or train.horizon=time")
        return lambda step, spent=0.0: cosine(step, peak_lr, warmup, total, spent=spent)
    return lambda step, spent=0.0: peak_lr
