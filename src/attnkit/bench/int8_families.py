"""The int8 kernel families a CPU can be made to run, and how: for tests and measurements per family.

fbgemm and oneDNN pick their int8 kernels once per process from the CPU, capped by `FBGEMM_ENABLE_INSTRUCTIONS`
(the `x86` and `fbgemm` engines' dynamic linear) and `ONEDNN_MAX_CPU_ISA` (the `onednn` engine). Each family
below is an engine plus the variable that forces its kernels, the CPU flags they need (a family the CPU lacks
would silently run another), and whether they add pairs of products in 16 bits (AVX2, AVX-512 without VNNI), where
`attnkit.cpu.int8_scheme` must find 7-bit weights (or, with ATTNKIT_INT8_SATURATING=inputs, 7-bit inputs) instead
of the 8 + 8 bits that kernels accumulating in 32 bits sum exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from attnkit.cpu import cpu_flags
from attnkit.errors import ConfigError


@dataclass(frozen=True)
class Family:
    engine: str  # torch.backends.quantized.engine
    env: dict[str, str] = field(hash=False)  # what forces its kernels
    needs: frozenset[str]  # /proc/cpuinfo flags
    pairs_in_16_bits: bool  # saturating kernels: 7-bit weights or inputs


_AVX2 = frozenset({"avx2", "fma"})
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
_VNNI = _AVX512 | {"avx512_vnni"}
FAMILIES = {
    "fbgemm-avx2": Family("x86", {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}, _AVX2, True),
    "fbgemm-avx512": Family("x86", {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"}, _AVX512, True),
    "fbgemm-avx512-256": Family("x86", {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_256"}, _AVX512, True),
    "fbgemm-avx512-vnni": Family("x86", {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"}, _VNNI, False),
    "fbgemm-avx512-vnni-256": Family("x86", {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1_256"}, _VNNI, False),
    "onednn-avx2": Family("onednn", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, _AVX2, True),
    "onednn-avx2-vnni": Family("onednn", {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"}, _AVX2 | {"avx_vnni"}, False),
    "onednn-avx512": Family("onednn", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, _AVX512, True),
    "onednn-avx512-vnni": Family("onednn", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, _VNNI, False),
    "onednn-amx": Family("onednn", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, _VNNI | {"amx_int8", "amx_tile"}, False),
}
ENGINE_VARIABLE = "ATTNKIT_QUANTIZED_ENGINE"  # read by the processes that run a family (`apply_engine`)
SATURATING_VARIABLE = "ATTNKIT_INT8_SATURATING"  # "weights" or "inputs": the 7-bit side on saturating kernels


def unavailable(name: str) -> str:
    """Why this process's CPU and PyTorch cannot run family `name` ("" when they can)."""
    family = FAMILIES[name]
    if family.engine not in torch.backends.quantized.supported_engines:
        return f"this PyTorch has no {family.engine!r} quantized engine"
    if missing := family.needs - cpu_flags():
        return f"this CPU lacks {', '.join(sorted(missing))}"
    return ""


def environment(name: str, saturating: str = "weights") -> dict[str, str]:
    """The environment of a process that runs family `name`: this one's, its kernel cap, its engine and the 7-bit
    side (`saturating`, "weights" or "inputs") if its kernels add pairs in 16 bits."""
    family = FAMILIES[name]
    return {**os.environ, **family.env, ENGINE_VARIABLE: family.engine, SATURATING_VARIABLE: saturating}


def apply_engine() -> None:
    """In a process started with `environment(...)`: switch to its family's quantized engine. For the entry points
    of tests and measurement scripts only (it changes process-wide state, which a library call never does)."""
    if engine := os.environ.get(ENGINE_VARIABLE):
        torch.backends.quantized.engine = engine
    saturating_side()  # a bad value fails here, at the start


def saturating_side() -> str:
    """The 7-bit side on saturating kernels this process was started with (`environment`): "weights" (the default)
    or "inputs", what attnkit.cpu.for_inference's `saturating` takes."""
    saturating = os.environ.get(SATURATING_VARIABLE, "weights")
    if saturating not in ("weights", "inputs"):
        raise ConfigError(f"{SATURATING_VARIABLE} must be weights or inputs; got {saturating!r}")
    return saturating


__all__ = ["FAMILIES", "SATURATING_VARIABLE", "Family", "apply_engine", "cpu_flags", "environment", "saturating_side",
           "unavailable"]
