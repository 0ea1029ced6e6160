"""Data-parallel training through PyTorch's own engine: `torchrun` + DistributedDataParallel.

`torchrun --nproc_per_node N -m attnkit train ...` starts N processes with RANK / WORLD_SIZE /
LOCAL_RANK in their environment; `Distributed.from_env()` joins them into one process group (gloo on
CPU, NCCL on CUDA). A plain `attnkit train` is world size 1 and never touches torch.distributed.

What the trainers do with it: each rank reads its own share of the batches, DDP averages gradients once
per update (accumulation steps run under `no_sync`), the few scalars every rank must agree on (token
counts, the loss that decides a skipped update, "out of budget", "a stop signal came") are summed
across ranks, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnkit.errors import ConfigError


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this object initialised the process group (and destroys it)

    @classmethod
    def from_env(cls, device_type: str) -> Distributed:
        """World size 1, or the process group torchrun described in the environment."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        owns = not dist.is_initialized()
        if owns:
            if device_type == "cuda":
                torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
        return cls(rank, world, local_rank, owns)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes files."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """One GPU per process: cuda:LOCAL_RANK; CPU ranks share the CPU."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" and self.world > 1 else device

    def wrap(self, module: nn.Module) -> nn.Module:
        """DDP around `module` (which DDP makes identical on every rank, broadcasting rank 0's weights)."""
        if self.world == 1:
            return module
        device_ids = [self.local_rank] if next(module.parameters()).is_cuda else None
        return DistributedDataParallel(module, device_ids=device_ids)

    def no_sync(self, module: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """Skip DDP's gradient all-reduce on every backward of an update but the last."""
        if sync or not isinstance(module, DistributedDataParallel):
            return contextlib.nullcontext()
        return module.no_sync()

    def sum(self, *values: float) -> list[float]:
        """Sum scalars over ranks (float64, one all-reduce)."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any rank."""
        return self.sum(float(flag))[0] > 0

    def shard(self, n: int) -> slice:
        """This rank's rows of a global batch of `n` rows (n must divide evenly)."""
        if n % self.world:
            raise ConfigError(f"train.batch_size {n} does not split evenly over {self.world} processes")
        per = n // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def barrier(self) -> None:
        """Wait until every rank gets here (world size 1: at once)."""
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False

    def _comm_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


class TrainingForward(nn.Module):
    """Calls `fn(model, *inputs)` as this module's forward, so DDP sees a training objective other than
    `model.forward` (the loss of `features` and `output_layer`, hard attention's REINFORCE term) and still syncs its
    gradients."""

    def __init__(self, model: nn.Module, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *inputs):
        return self.fn(self.model, *inputs)
