"""Linear maps that keep a prepacked copy of their weights for CPU inference.

A decoder step multiplies few rows by many weights: (64, 256) @ (256, 8000) for the output projection.
Called through `F.linear`, the BLAS library repacks the weight matrix into its blocked layout on every
call, which costs about as much as the product itself at such shapes. oneDNN can keep the weight in that
layout ("prepacking", what inductor's freezing pass does for CPU inference): measured on 2 threads, one
MT decoder step's 19 products took 3.4 ms instead of 6.5 ms, and the encoder's (1536, 256) products are
10-15% faster too.

`linear` takes the prepacked path inside a `prepacked()` scope whenever it is safe, i.e. on CPU, with no
gradient being recorded, no autocast, float32 (or bfloat16 where oneDNN supports it) and a weight that is a
Parameter. The packed copies live in the scope's `PackedWeights` cache, one per Parameter (and row range),
and are rebuilt when the weight's version counter or storage changes (`load_state_dict`, most optimiser
steps, `.to()`). The version counter does not see every change: a fused optimiser step
(`torch.optim.AdamW(fused=True)`) and writes through `.data` leave it alone. So a cache belongs to weights
that stay fixed while it lives: a search opens a fresh one for its own length, a `Translator` keeps one
for its frozen model, and a training loop's evaluation (a new `Translator` each time) never sees the
packed copy of an earlier step. Outside a scope, training and CUDA, `F.linear` runs unchanged. Results
agree with `F.linear` to float32 rounding (the summation order differs). The cost is memory: one more
copy of every weight used in inference, kept while the cache lives.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_ROWS_HINT = 64  # the batch size oneDNN picks its layout for; measured as good from 5 to 1536 rows


def _dtypes() -> tuple[torch.dtype, ...]:
    if not torch.backends.mkldnn.is_available():
        return ()
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


_PACKABLE = _dtypes()


class PackedWeights:
    """Prepacked copies of weights that stay fixed while this cache lives; `with cache.active():` uses it.

    id(Parameter) -> (weak reference to it, {rows: ((version, data_ptr), packed)}). A plain dict checked
    through the weak reference: a decoding step makes 19 products, and WeakIdKeyDictionary's lookup (a new
    weak reference per call) cost more than the checks themselves.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, dict]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def active(self) -> Iterator[PackedWeights]:
        """`linear` packs into (and reads from) this cache in the current context until the block ends."""
        token = _SCOPE.set(self)
        try:
            yield self
        finally:
            _SCOPE.reset(token)

    def get(self, weight: nn.Parameter, rows: tuple[int, int] | None) -> torch.Tensor:
        """oneDNN's blocked copy of weight[rows] (N, K), made once per version of the weight."""
        key = id(weight)
        entry = self._entries.get(key)
        if entry is None or entry[0]() is not weight:  # new, or another Parameter that had the same id
            forget = functools.partial(_forget, weakref.ref(self), key)
            entry = self._entries[key] = (weakref.ref(weight, forget), {})
        per_rows = entry[1]
        stamp = (weight._version, weight.data_ptr())
        hit = per_rows.get(rows)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        w = weight if rows is None else weight[rows[0] : rows[1]]
        with torch.inference_mode(False):  # a normal tensor, usable after an inference_mode block ends
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), _ROWS_HINT)
        per_rows[rows] = (stamp, packed)
        return packed


_SCOPE: contextvars.ContextVar[PackedWeights | None] = contextvars.ContextVar("attnkit_packed_weights",
                                                                               default=None)


def _forget(cache: weakref.ref, key: int, _dead: weakref.ref) -> None:
    """Drop a Parameter's packed copies when it is collected (if the cache itself still lives)."""
    entries = getattr(cache(), "_entries", {})
    if key in entries and entries[key][0]() is None:
        del entries[key]


@contextlib.contextmanager
def prepacked(cache: PackedWeights | None = None) -> Iterator[PackedWeights]:
    """A scope in which `linear` uses prepacked weights: `cache`, else the scope already open, else a new
    cache that lives until the block ends (weights must not change inside it)."""
    if cache is None:
        cache = _SCOPE.get()
    if cache is None:
        cache = PackedWeights()
    with cache.active():
        yield cache


def packable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` takes the prepacked path."""
    return (
        not torch.is_grad_enabled()
        and x.is_cpu
        and isinstance(weight, nn.Parameter)
        and x.dtype == weight.dtype
        and x.dtype in _PACKABLE
        and not torch.is_autocast_enabled("cpu")
        and _SCOPE.get() is not None
    )


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default if _PACKABLE else None  # resolved once


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    rows: tuple[int, int] | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """act(F.linear(x, weight[a:b], bias[a:b])) for rows=(a, b) (all rows for None): (..., K) -> (..., N).

    `activation` ("relu", "gelu" or None) is fused into the product on the prepacked path.
    """
    if rows is not None and bias is not None:
        bias = bias[rows[0] : rows[1]]
    if not packable(x, weight):
        y = F.linear(x, weight if rows is None else weight[rows[0] : rows[1]], bias)
        return y if activation is None else _ACTIVATIONS[activation](y)
    packed = _SCOPE.get().get(weight, rows)
    if activation is None:
        return _linear_pointwise(x, packed, bias, "none", [], "")
    return _linear_pointwise(x, packed, bias, activation, [], "none" if activation == "gelu" else "")


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose inference on CPU uses the prepacked weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
