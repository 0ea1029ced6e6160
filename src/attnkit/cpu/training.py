"""`training_scope(device, max_tokens)`: what a training run on a CPU swaps into its model while it trains.

Inside `scope.applied(model)`, on a CPU: every nn.Dropout is attnkit.cpu.dropout's (masks from 16-bit slices of
random words), a time-major nn.LSTM runs a layer at a time (attnkit.cpu.lstm), every attention calls
`cpu_attention` (written-out products for small blocks and for dropout on the weights; with float32 products for
half precision where oneDNN's kernel builds are costly), an adaptive softmax's tail rows are bucketed, and where
kernel builds are costly every linear map pads its rows to the token budget (attnkit.cpu.rows), the budget set per
precision by `scope.precision(dtype)`, which the loss reads too (`scope.row_multiple`). On leaving, the model's own
modules are back. Elsewhere (CUDA, MPS) nothing is swapped. The Parameters are the model's own throughout: an
optimizer, DDP and checkpoints see no difference. tests/test_cpu_training.py checks training through the scope
against plain training; `attnkit bench --workloads mt-train` measures it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from attnkit.cpu.attention import cpu_attention, cpu_training_attention
from attnkit.cpu.dropout import Dropout
from attnkit.cpu.lstm import LayerwiseLSTM
from attnkit.cpu.modules import restore, sharing, swap_modules
from attnkit.cpu.process import kernel_builds_costly
from attnkit.cpu.rows import ADAPTIVE_ROWS, RowRule, RowsLinear, RowsStackedLinear
from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import MultiHeadAttention, StackedLinear


class TrainingScope:
    """The CPU room's part in one training run on `device` whose batches hold up to `max_tokens` tokens."""

    def __init__(self, device: torch.device, max_tokens: int = 0):
        self.device, self.max_tokens = device, max_tokens
        self.rule = RowRule()  # shared by the RowsLinear modules swapped in

    @property
    def row_multiple(self) -> int:
        """What the products' rows are padded to now (0: as they are): the projected loss's chunks too."""
        return self.rule.multiple

    @contextlib.contextmanager
    def precision(self, dtype: str) -> Iterator[None]:
        """Products in `dtype` inside the block: their rows padded to the token budget where that precision's
        kernel builds are costly here."""
        kept = self.rule.multiple
        self.rule.multiple = self.max_tokens if kernel_builds_costly(self.device, dtype) else 0
        try:
            yield
        finally:
            self.rule.multiple = kept

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """`model` with the CPU room's training modules in place inside the block (module docstring)."""
        if self.device.type != "cpu":
            yield model
            return
        costly = kernel_builds_costly(self.device, "bfloat16")
        swapped = swap_modules(model, lambda m: self._swap(m, costly))
        attention = cpu_training_attention if costly else cpu_attention
        attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        chosen = {m: m.__dict__.get("attention_function") for m in attentions}
        clustered = (AdaptiveEmbedding, AdaptiveLogSoftmax)
        adaptive = {m: m.row_multiple for m in model.modules() if isinstance(m, clustered)}
        for m in chosen:
            m.attention_function = attention
        for m in adaptive:
            m.row_multiple = ADAPTIVE_ROWS
        try:
            yield model
        finally:
            restore(swapped)
            for m, fn in chosen.items():
                if fn is None:
                    del m.attention_function
                else:
                    m.attention_function = fn
            for m, multiple in adaptive.items():
                m.row_multiple = multiple

    def _swap(self, m: nn.Module, costly: bool) -> nn.Module | None:
        if type(m) is nn.Dropout:
            return sharing(Dropout, m)
        if type(m) is nn.LSTM and not (m.bidirectional or m.batch_first or m.proj_size):
            return LayerwiseLSTM.sharing(m)
        if costly and type(m) is StackedLinear:
            return sharing(RowsStackedLinear, m, rule=self.rule)
        if costly and type(m) is nn.Linear:
            return sharing(RowsLinear, m, rule=self.rule)
        return None


def training_scope(device: torch.device, max_tokens: int = 0) -> TrainingScope:
    """The CPU room's part in a training run (module docstring): `with scope.applied(model):` around the training,
    `with scope.precision(dtype):` around each forward and backward."""
    return TrainingScope(device, max_tokens)
