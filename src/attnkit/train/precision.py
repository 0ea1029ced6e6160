"""`train.dtype: auto`: the precision that trains faster on this machine, timed on the run's own first batches.

bf16 autocast halves the bytes a matrix product moves and, on a CPU with bf16 instructions (AVX-512 BF16, AMX, Arm's
BF16), the arithmetic too; without them oneDNN emulates it, slower than float32. The flags do not settle it either:
two CPUs with AVX-512 BF16 can rank bf16 and float32 opposite ways (the memory system and the kernels oneDNN picks
differ; benchmarks/train_profile.py profiles a recipe in its preset's precision). So `auto` decides:

- on CUDA, bfloat16 where the GPU supports it (Ampere and later), else float32, without timing;
- on a CPU whose flags show no bf16 instructions, float32, without timing;
- on any other CPU, by timing forward + backward over the run's first few batches in each precision (one untimed
  round each, then PROBE_ROUNDS alternating rounds, summed over DDP ranks so that all choose alike): bfloat16 when it
  takes under BF16_MARGIN of float32's time, since float32 is the exact one. A float32 pass runs each batch as
  PROBE_PARTS row slices (`probe_parts`): the same work, holding half a batch's float32 activations, about what a
  bfloat16 training step holds, so the probe does not set the run's peak memory (whole float32 batches would).
  A bfloat16 pass runs whole batches, as a training step does: oneDNN builds bf16 kernels for each new shape, more
  per batch than its cache keeps, so slices would build them twice and, where builds are slow (AMX), time bfloat16
  far slower than its training steps run. float32's products build no kernels, so slicing costs them nothing
  (tests/test_precision.py checks both);
- elsewhere (MPS), float32.

The probe leaves no trace (`no_trace`): the RNG, the buffers and the gradients are restored, so a run with `auto`
trains exactly as the same run given the precision it chose. Its seconds count against the run's wall-clock budget.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.cpu import emulated_bf16

PROBE_BATCHES = 4  # the run's first batches (segments), their real shapes
PROBE_ROUNDS = 2  # timed rounds per precision, after an untimed one
BF16_MARGIN = 0.95  # bf16 is chosen over the exact precision only when it takes under this share of its time
PROBE_PARTS = 2  # row slices each probe batch runs as (the module docstring)

Passes = Callable[[str], None]  # dtype -> forward + backward over the probe batches in that precision


@dataclass(frozen=True)
class Choice:
    dtype: str  # float32 | bfloat16
    why: str  # one line for train.log
    seconds: float = 0.0  # wall-clock the probe took


def probe_parts(rows: int, dtype: str) -> list[slice]:
    """The row slices a probe batch of `rows` rows runs as in `dtype`: the whole batch in bfloat16; in float32
    PROBE_PARTS slices (fewer when it has fewer rows)."""
    size = rows if dtype == "bfloat16" else -(-rows // PROBE_PARTS)
    return [slice(start, start + size) for start in range(0, rows, size)]


def timed(passes: Passes, dtype: str) -> float:
    """Seconds one round of probe passes takes in `dtype`."""
    start = time.perf_counter()
    passes(dtype)
    return time.perf_counter() - start


def choose_dtype(device: torch.device, passes: Passes,
                 sum_ranks: Callable[..., list[float]] = lambda *v: list(v)) -> Choice:
    """The precision `train.dtype: auto` trains in on `device` (see the module docstring)."""
    if device.type == "cuda":
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
        return Choice(dtype, f"train.dtype auto: {dtype} (this GPU {'has' if dtype == 'bfloat16' else 'lacks'} bf16)")
    if device.type != "cpu":
        return Choice("float32", f"train.dtype auto: float32 (bf16 autocast on {device.type} is not measured)")
    if emulated_bf16(device, "bfloat16"):
        return Choice("float32", "train.dtype auto: float32 (this CPU has no bf16 instructions)")
    start = time.perf_counter()
    spent = {"float32": 0.0, "bfloat16": 0.0}
    for dtype in spent:  # kernels built, memory grown
        passes(dtype)
    for _ in range(PROBE_ROUNDS):
        for dtype in spent:
            spent[dtype] += timed(passes, dtype)
    f32, bf16 = sum_ranks(spent["float32"], spent["bfloat16"])
    dtype = "bfloat16" if bf16 < BF16_MARGIN * f32 else "float32"
    return Choice(dtype, f"train.dtype auto: {dtype} (forward + backward of the first {PROBE_BATCHES} batches took "
                         f"{bf16 / f32:.2f}x as long in bfloat16 as in float32; bfloat16 needs < {BF16_MARGIN})",
                  time.perf_counter() - start)


@contextlib.contextmanager
def no_trace(model: torch.nn.Module):
    """Run probe passes on `model` and leave no trace: the CPU RNG (dropout masks), the buffers (BatchNorm's running
    statistics), the gradients and the train / eval mode are as they were before."""
    rng = torch.get_rng_state()
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    mode = model.training
    model.train()
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        model.zero_grad(set_to_none=True)
        model.train(mode)
