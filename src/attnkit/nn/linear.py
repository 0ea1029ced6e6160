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

`PackedWeights(int8=True)` keeps int8 copies instead (`int8_unavailable()` says when the CPU cannot run them
fast): each weight row quantised symmetrically to int8 with its own scale, each product's input quantised
on the fly to uint8 with one scale per call (PyTorch's dynamic quantisation kernels, fbgemm / oneDNN, which
use AVX2, AVX-512 and VNNI instructions), accumulated in int32 and returned in float32. Measured on 2 threads
(AVX-512 VNNI), a (64, 512) x (512, 2048) product took 0.10 ms instead of 0.26 ms, the (64, 512) x (512,
32000) output projection 1.2 ms instead of 4.3 ms. The price is rounding: each output is off by about 1% of
its scale, which the tests and the BLEU figures in docs/speed.md bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
import warnings
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
_FAST_INT8_ENGINES = ("x86", "fbgemm", "onednn")  # PyTorch's int8 backends with AVX2 / AVX-512 / VNNI kernels


def int8_unavailable() -> str:
    """Why int8 products would not be fast here ("" when they are): they need an x86 CPU with AVX2 or better
    and one of PyTorch's x86 int8 backends."""
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine().lower() not in ("x86_64", "amd64") or capability not in ("AVX2", "AVX512"):
        return f"this CPU ({platform.machine()}, {capability}) has no fast int8 kernels in PyTorch (AVX2 or better)"
    if torch.backends.quantized.engine not in _FAST_INT8_ENGINES:
        return f"the quantized engine is {torch.backends.quantized.engine!r}, not one of {_FAST_INT8_ENGINES}"
    return ""


def _quantize_rows(w: torch.Tensor, bias: torch.Tensor | None) -> torch.ScriptObject:
    """(N, K) float weight -> the int8 kernels' packed form: w[n] ~ scale[n] * q[n], q in [-127, 127]."""
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (N, K)
    with warnings.catch_warnings():  # PyTorch marks quantized tensors deprecated (one warning per process)
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.detach().float().contiguous())


class PackedWeights:
    """Prepacked copies of weights that stay fixed while this cache lives; `with cache.active():` uses it.

    id(Parameter) -> (weak reference to it, {rows: ((version, data_ptr), packed)}). A plain dict checked
    through the weak reference: a decoding step makes 19 products, and WeakIdKeyDictionary's lookup (a new
    weak reference per call) cost more than the checks themselves.
    """

    def __init__(self, int8: bool = False) -> None:
        self.int8 = int8  # int8 copies (with their bias) instead of float ones
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

    def get(self, weight: nn.Parameter, rows: tuple[int, int] | None, bias: torch.Tensor | None = None):
        """oneDNN's blocked copy of weight[rows] (N, K), made once per version of the weight (int8: the packed
        int8 rows with `bias`, which must be the same for every call with these rows)."""
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
            w = w.detach().contiguous()
            packed = _quantize_rows(w, bias) if self.int8 else torch.ops.mkldnn._reorder_linear_weight(w, _ROWS_HINT)
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
    """Whether `linear(x, weight)` takes the prepacked path (float32 only for int8 copies)."""
    return _packable(x, weight, _SCOPE.get())


def _packable(x: torch.Tensor, weight: torch.Tensor, cache: PackedWeights | None) -> bool:
    return (
        cache is not None
        and not torch.is_grad_enabled()
        and x.is_cpu
        and isinstance(weight, nn.Parameter)
        and x.dtype == weight.dtype
        and x.dtype in ((torch.float32,) if cache.int8 else _PACKABLE)
        and not torch.is_autocast_enabled("cpu")
    )


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default if _PACKABLE else None  # resolved once
_linear_int8 = {None: torch.ops.quantized.linear_dynamic.default,  # (x, packed, reduce_range) -> float32
                "relu": torch.ops.quantized.linear_relu_dynamic.default}


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
    cache = _SCOPE.get()
    if not _packable(x, weight, cache):
        y = F.linear(x, weight if rows is None else weight[rows[0] : rows[1]], bias)
        return y if activation is None else _ACTIVATIONS[activation](y)
    if cache.int8:
        y = _linear_int8.get(activation, _linear_int8[None])(x, cache.get(weight, rows, bias), False)  # (..., N)
        return y if activation in _linear_int8 else _ACTIVATIONS[activation](y)
    packed = cache.get(weight, rows)
    if activation is None:
        return _linear_pointwise(x, packed, bias, "none", [], "")
    return _linear_pointwise(x, packed, bias, activation, [], "none" if activation == "gelu" else "")


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose inference on CPU uses the prepacked weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
