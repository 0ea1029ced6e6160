"""`for_inference(model)`: the model with the CPU room's inference modules in place of nn's.

nn.Linear -> PackedLinear, StackedLinear -> PackedStackedLinear, FeedForward -> PackedFeedForward (the activation
fused into the first product), Logits -> PackedLogits (one PackedWeights cache shared by all: attnkit.cpu.packed),
every attention calling `cpu_attention` (attnkit.cpu.attention), an adaptive softmax's tail rows bucketed
(attnkit.cpu.rows). The result is a structural copy that shares the model's Parameters, so the model itself is left
as it was and the copy follows its weights (a packed copy is rebuilt when a weight's version changes).
tests/test_cpu_inference.py checks a model and its inference copy agree; `attnkit bench` measures the gain.
"""

from __future__ import annotations

from torch import nn

from attnkit.cpu.attention import cpu_attention
from attnkit.cpu.modules import sharing, structural_copy, swap_modules
from attnkit.cpu.packed import (
    SATURATING,
    PackedFeedForward,
    PackedLinear,
    PackedLogits,
    PackedStackedLinear,
    PackedWeights,
)
from attnkit.cpu.rows import ADAPTIVE_ROWS
from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import StackedLinear, set_attention_function
from attnkit.nn.layers import FeedForward
from attnkit.nn.outputs import Logits


def _on_cpu(model: nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


def for_inference(model: nn.Module, *, int8: bool = False, saturating: str = SATURATING) -> nn.Module:
    """`model` for CPU inference (module docstring); `int8`: int8 copies of the products' weights (PackedWeights;
    `saturating`: the scheme where the kernels add pairs in 16 bits). A model off the CPU, or one already made by
    this function with the same `int8`, is returned as it is."""
    if getattr(model, "_cpu_inference", None) == int8 or not _on_cpu(model):
        return model
    cache = PackedWeights(int8=int8, saturating=saturating)
    fast = structural_copy(model)

    def swap(m: nn.Module) -> nn.Module | None:
        if isinstance(m, StackedLinear):
            return sharing(PackedStackedLinear, m, cache=cache)
        if isinstance(m, nn.Linear):
            return sharing(PackedLinear, m, cache=cache)
        if isinstance(m, Logits):
            return sharing(PackedLogits, m, cache=cache)
        if isinstance(m, FeedForward):
            return sharing(PackedFeedForward, m)  # after its w1 and w2 (swap_modules)
        return None

    swap_modules(fast, swap)
    set_attention_function(fast, cpu_attention)
    for m in fast.modules():
        if isinstance(m, (AdaptiveEmbedding, AdaptiveLogSoftmax)):
            m.row_multiple = ADAPTIVE_ROWS
    fast._cpu_inference = int8
    return fast
