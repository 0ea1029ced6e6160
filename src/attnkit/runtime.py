"""Device, precision, seeding and memory readings: the few lines every entry point shares.

The settings a process makes for speed (CPU flags, malloc, oneDNN's caches, the kernels training runs on) are
attnkit.cpu's (attnkit/cpu/process.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys

import numpy as np
import torch

from attnkit.errors import ConfigError

try:
    import resource
except ImportError:  # Windows
    resource = None


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device: unknown device '{name}' (use auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast when asked (on a CPU without bf16 instructions oneDNN emulates it: `attnkit.cpu.emulated_bf16`);
    float32 otherwise."""
    if dtype == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def available_memory(device: torch.device) -> int | None:
    """Bytes this process could still allocate on `device` (free GPU memory; MemAvailable on a Linux host)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux); None where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_mb() -> float | None:
    """This process's highest resident memory so far in MiB (getrusage); None where there is no `resource`."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
