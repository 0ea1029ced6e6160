"""The process settings of attnkit.cpu (attnkit/cpu/process.py): glibc's malloc, the kernels training runs on,
the CPU's flags and what they say about bf16 and kernel builds."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from attnkit.cpu import keep_freed_memory, process, training_kernels

glibc = sys.platform == "linux" and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not glibc, reason="mallopt is glibc's")
def test_keep_freed_memory_sets_glibc_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv("ATTNKIT_SYSTEM_MALLOC", raising=False)
    assert keep_freed_memory.__wrapped__() is True
    monkeypatch.setenv("ATTNKIT_SYSTEM_MALLOC", "1")
    assert keep_freed_memory.__wrapped__() is False


_TRIM = """
import sys, torch
from attnkit import cpu
if sys.argv[1] == "keep":
    cpu.keep_freed_memory()
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [torch.ones(1 << 20) for _ in range(200)]  # 800 MiB in 4 MiB blocks, under the 32 MiB mmap threshold
del blocks[:-1]  # all freed but the last: glibc cannot shrink its heap from the top
before = rss_mb()
released = cpu.release_kept_memory()
print(released, before - rss_mb())
"""


@pytest.mark.skipif(not glibc, reason="malloc_trim is glibc's")
def test_release_kept_memory_hands_the_free_heap_back_only_after_the_process_kept_it():
    kept = subprocess.run([sys.executable, "-c", _TRIM, "keep"], capture_output=True, text=True, check=True)
    released, freed_mb = kept.stdout.split()
    assert released == "True" and float(freed_mb) > 600, kept.stdout  # ~800 MiB of free heap back to the kernel
    plain = subprocess.run([sys.executable, "-c", _TRIM, "system"], capture_output=True, text=True, check=True)
    assert plain.stdout.split()[0] == "False", plain.stdout  # the system's malloc is left to itself


def _kernel_switches() -> tuple[bool, ...]:
    b = torch.backends
    return (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cuda.cudnn_sdp_enabled(), b.cuda.flash_sdp_enabled(),
            b.cuda.mem_efficient_sdp_enabled(), b.cuda.math_sdp_enabled())


def _set_kernel_switches(tf32: bool, cudnn_tf32: bool, *sdp: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32, cudnn_tf32
    for enable, on in zip((torch.backends.cuda.enable_cudnn_sdp, torch.backends.cuda.enable_flash_sdp,
                           torch.backends.cuda.enable_mem_efficient_sdp, torch.backends.cuda.enable_math_sdp), sdp):
        enable(on)


@pytest.mark.parametrize("host_tf32", [False, True])
def test_training_kernels_switch_on_cuda_only_and_give_the_host_its_switches_back(host_tf32):
    """The switches are process-wide flags (settable without a GPU): TF32 on, cuDNN's per-shape attention plans off,
    the planless attention kernels on, inside the block on CUDA; the host's own settings after it, even after an
    error; on the CPU the block touches nothing."""
    before = _kernel_switches()
    host = (host_tf32, host_tf32, True, False, True, True)  # flash off: a host's choice the block overrides
    _set_kernel_switches(*host)
    try:
        with training_kernels(torch.device("cpu")):
            assert _kernel_switches() == host
        with pytest.raises(KeyError), training_kernels(torch.device("cuda")):
            assert _kernel_switches() == (True, True, False, True, True, True)
            raise KeyError("an error inside the block")
        assert _kernel_switches() == host
    finally:
        _set_kernel_switches(*before)


@pytest.mark.parametrize("flags, dtype, device, warns", [
    ({"avx2", "fma"}, "bfloat16", "cpu", True),  # AVX2 only: emulated
    ({"avx512f", "avx512bw", "avx512_vnni"}, "bfloat16", "cpu", True),  # AVX-512 without its BF16 extension
    ({"avx512f", "avx512_bf16"}, "bfloat16", "cpu", False),
    ({"amx_tile", "amx_bf16"}, "bfloat16", "cpu", False),
    ({"fp", "asimd", "bf16"}, "bfloat16", "cpu", False),  # Arm with BF16
    (set(), "bfloat16", "cpu", False),  # flags unknown (not Linux): no guess
    ({"avx2"}, "float32", "cpu", False),
    ({"avx2"}, "bfloat16", "cuda", False),  # the GPU's bf16, not the CPU's
])
def test_bf16_autocast_warns_only_where_the_cpu_lacks_bf16_instructions(monkeypatch, flags, dtype, device, warns):
    monkeypatch.setattr(process, "cpu_flags", lambda: flags)
    message = process.emulated_bf16(torch.device(device), dtype)
    assert bool(message) == warns
    assert "\n" not in message


def test_this_machines_flags_are_read():
    flags = process.cpu_flags()
    assert not flags or {"avx2", "avx512f", "sse2", "fp", "asimd"} & flags  # x86 or Arm names, when Linux lists them


@pytest.mark.parametrize("flags, isa, device, dtype, costly", [
    ({"amx_tile", "amx_bf16", "avx512_bf16"}, None, "cpu", "bfloat16", True),
    ({"amx_tile", "amx_bf16", "avx512_bf16"}, "AVX10_1_512_AMX", "cpu", "bfloat16", True),
    ({"amx_tile", "amx_bf16", "avx512_bf16"}, "avx512_core_bf16", "cpu", "bfloat16", False),  # oneDNN told not to
    ({"amx_tile", "amx_bf16", "avx512_bf16"}, None, "cpu", "float32", False),  # float32 products build nothing
    ({"amx_tile", "amx_bf16"}, None, "cuda", "bfloat16", False),
    ({"avx512f", "avx512_bf16"}, None, "cpu", "bfloat16", False),  # no AMX: padding measured slower there
])
def test_kernel_builds_are_costly_where_onednn_runs_amx(monkeypatch, flags, isa, device, dtype, costly):
    monkeypatch.setattr(process, "cpu_flags", lambda: flags)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert process.kernel_builds_costly(torch.device(device), dtype) is costly


@pytest.mark.parametrize("kind, preset", [("translation", None), ("lm", None), ("lm", "7")])
def test_kernel_caches_are_bounded_by_what_is_trained_and_a_value_in_the_environment_wins(monkeypatch, kind, preset):
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    if preset is None:
        monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", preset)
    process.bound_kernel_caches(kind)
    expected = preset or str(process.KERNEL_CACHE[kind])
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == expected
    assert os.environ["LRU_CACHE_CAPACITY"] == "1"  # ideep's own cache off
