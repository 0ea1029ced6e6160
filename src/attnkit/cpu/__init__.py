"""CPU speed, in one room: prepacked and int8 products, attention kernels, dropout masks, stable row counts,
process settings, the fused optimizer. The rest of attnkit uses plain nn modules and reaches in only through this
face (an import-linter contract in pyproject.toml keeps it so):

- `for_inference(model, int8=...)`: a copy of the model (sharing its weights) with packed products and CPU attention;
- `training_scope(device, max_tokens)`: what a training run swaps into its model while it trains;
- the process settings a command makes once at start-up (process.py) and the fused AdamW (optim.py).
"""

from attnkit.cpu.inference import for_inference
from attnkit.cpu.optim import FusedAdamW
from attnkit.cpu.packed import int8_kernels, int8_scheme, int8_unavailable
from attnkit.cpu.process import (
    BF16_FLAGS,
    KERNEL_CACHE,
    bound_kernel_caches,
    cpu_flags,
    emulated_bf16,
    keep_freed_memory,
    kernel_builds_costly,
    release_kept_memory,
    training_kernels,
)
from attnkit.cpu.training import TrainingScope, training_scope

__all__ = [
    "BF16_FLAGS",
    "KERNEL_CACHE",
    "FusedAdamW",
    "TrainingScope",
    "bound_kernel_caches",
    "cpu_flags",
    "emulated_bf16",
    "for_inference",
    "int8_kernels",
    "int8_scheme",
    "int8_unavailable",
    "keep_freed_memory",
    "kernel_builds_costly",
    "release_kept_memory",
    "training_kernels",
    "training_scope",
]
