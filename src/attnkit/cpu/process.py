"""Process settings for speed: the CPU's flags and what they say about bf16 and kernel builds, the kernels training
runs on, glibc's malloc and oneDNN's kernel caches.

The process-wide settings (`keep_freed_memory`, `bound_kernel_caches`) the library never makes on its own: the
`attnkit` command makes them for the verbs that pay for them, and a Python program opts in by name
(tests/test_cpu_process.py checks each setting).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


@functools.cache  # read once: the trainers ask on every batch
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (x86 `flags`, Arm `Features`; empty where /proc/cpuinfo is not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def kernel_builds_costly(device: torch.device, dtype: str) -> bool:
    """Whether products in `dtype` on `device` build their kernels slowly enough for training to keep its product
    shapes stable (attnkit.cpu.rows: the training scope swaps in RowsLinear): bf16 on a CPU whose oneDNN runs AMX,
    whose kernels take long to build (benchmarks/kernel_builds.sh counts and times the builds)."""
    if device.type != "cpu" or dtype != "bfloat16" or "amx_bf16" not in cpu_flags():
        return False
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()  # a cap set here
    return isa in ("ALL", "DEFAULT") or "AMX" in isa


BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # AVX-512 BF16, AMX, Arm's BF16: products in bf16


def emulated_bf16(device: torch.device, dtype: str) -> str:
    """Why bf16 autocast may run slower than float32 here (one line), or "": on a CPU whose flags are known and show
    none of BF16_FLAGS, oneDNN emulates bf16 products with float32 instructions plus conversions."""
    flags = cpu_flags() if dtype == "bfloat16" and device.type == "cpu" else set()
    if not flags or flags & BF16_FLAGS:
        return ""
    return ("train.dtype bfloat16: this CPU has no bf16 instructions (no avx512_bf16 / amx_bf16 flag), so autocast "
            "emulates them and may train slower than --train.dtype=float32")


# cuDNN's fused attention builds an execution plan for every new shape, and bucketed batches change shape almost every
# update, so a plan is built nearly every step; the flash / memory-efficient kernels need no plan
# (benchmarks/cuda.sh times training with them; tests/test_cpu_process.py checks the switches).
PLANLESS_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextlib.contextmanager
def training_kernels(device: torch.device):
    """On CUDA inside the block: TF32 matmuls and convolutions (Ampere and later: free speed, ample precision for
    training) and scaled-dot-product attention without cuDNN's per-shape plans (PLANLESS_ATTENTION). The switches
    are process-wide, so the block restores what the host had set; elsewhere it changes nothing."""
    if device.type != "cuda":
        yield
        return
    kept = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with sdpa_kernel(PLANLESS_ATTENTION):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = kept


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEPT = None  # the C library whose malloc keeps freed memory, once keep_freed_memory has made the setting


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse rather than hand it back to the kernel.

    glibc serves large blocks with fresh mmap'd pages and trims its heap once much of it is free, so a
    loop that allocates large blocks every step (decoding: logits, reordered key/value caches; training: its
    activations) pays a page fault and the zeroing of every page, every step, and spends much of its CPU time in
    the kernel. With blocks below the mmap threshold (32 << 20 bytes) taken from the heap and free heap up to the
    trim threshold (1 << 30) kept, the pages are reused instead, for a little more peak memory. jemalloc or
    tcmalloc (LD_PRELOAD) do the same. To measure it, run `attnkit bench --workloads mt-beam5 mt-train` with and
    without ATTNKIT_SYSTEM_MALLOC=1; tests/test_cpu_process.py checks the setting.

    It changes the whole process, so the library never calls it on its own: the `attnkit` command does, for
    the verbs that decode (translate, score, serve, lm eval / generate) and those that train, and so do the
    bench's measuring processes; a Python program opts in by calling it. ATTNKIT_SYSTEM_MALLOC=1 makes it a
    no-op. Returns whether the setting was made.
    """
    if os.environ.get("ATTNKIT_SYSTEM_MALLOC", "") not in ("", "0"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
    except (OSError, TypeError):  # Windows has no "process's own" library
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl, macOS, Windows)
        return False
    global _KEPT
    if not (libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)):
        return False
    _KEPT = libc
    return True


def release_kept_memory() -> bool:
    """Hand back to the kernel the free heap memory that `keep_freed_memory`'s setting kept (glibc's malloc_trim).

    Kept memory is reused by the next step, but over an hour of token-budget batches of ever new shapes, and an
    evaluation after every epoch with shapes of its own, the free holes in the heap that were touched once stay
    resident, and a long run's resident set climbs. The training loops call this at their quiet points (after each
    evaluation and checkpoint), where the trim and the page faults of refilling the next step's memory are small
    next to an epoch (tests/test_cpu_process.py). Changes nothing unless the process opted in with
    `keep_freed_memory`; returns whether memory was handed back.
    """
    return _KEPT is not None and bool(_KEPT.malloc_trim(0))


# oneDNN primitives kept by the verbs that train, by what they train: a translation step has ~27 shapes and new ones
# with every batch (on AMX, where builds are slow, its linear maps run on fixed row counts, cpu.rows.RowsLinear, and
# its attention multiplies in float32, cpu.float32_attention, so none vary); a language model's step (Transformer-XL
# with the adaptive softmax) has the same shapes every update but more than 32 of them, so with 32 kept it rebuilt
# some every update (benchmarks/kernel_builds.sh, docs/speed.md)
KERNEL_CACHE = {"translation": 32, "lm": 64}


def bound_kernel_caches(kind: str) -> None:
    """Keep oneDNN's kernel caches small: flat memory when shapes keep changing, and the reuse within a step kept.

    Under bf16 autocast on a CPU, PyTorch runs matmuls through oneDNN, which builds a "primitive" (a kernel
    specialised to the exact shapes) for each new shape and keeps up to 1,024 of them, and ideep keeps
    another 1,024 of its own. Token-budget batches have a new (sentences, source length, target length)
    almost every step, about 27 primitives each, so the default caches only grow, and the resident memory
    grows many times past the tensors in use. A step still reuses each of its shapes (every layer's products
    share them, forward and backward), so a small cache keeps most of the reuse at a small, flat cost in memory
    (benchmarks/kernel_builds.sh measures the builds per cache size); ideep's cache stays off. `kind`
    ("translation" or "lm") picks the size (KERNEL_CACHE).

    Like `keep_freed_memory` it is process-wide (environment variables read when oneDNN first runs), so
    the library never calls it: the `attnkit` command does for the verbs that train. A value already in
    the environment wins.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(KERNEL_CACHE[kind]))
    os.environ.setdefault("LRU_CACHE_CAPACITY", "1")  # ideep's cache of converted weights and primitives
