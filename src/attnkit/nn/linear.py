"""Linear maps that keep a prepacked copy of their weights for CPU inference.

Called through `F.linear`, oneDNN repacks the weight into its blocked layout on every call, which at a decoder
step's few rows costs about as much as the product; keeping the packed copy ("prepacking", as inductor's freezing
pass does) avoids it. `linear` takes that path inside a `prepacked()` scope when it is safe: CPU, no gradient, no
autocast, float32 (or bf16 where oneDNN has it), a Parameter weight. The `PackedWeights` cache rebuilds a copy when
the weight's version counter or storage changes; a fused optimiser step or a write through `.data` does not bump the
counter, so a cache belongs to weights fixed while it lives (a search's, a `Translator`'s). Results agree with
`F.linear` to float32 rounding; the price is one more copy of each weight. tests/test_linear.py checks the
equivalence; `attnkit bench --workloads mt-greedy mt-beam5` measures the gain.

`PackedWeights(int8=True)` keeps int8 copies instead: weight rows quantised symmetrically with a scale each, the
input to uint8 with one scale per call, through PyTorch's dynamic quantisation kernels (fbgemm / oneDNN: AVX2,
AVX-512, VNNI), accumulated in int32. With VNNI or AMX a u8 x s8 product goes straight into int32 (inputs 0..255,
weights -127..127); without it (AVX2, AVX-512F/BW) `vpmaddubsw` adds pairs of products in 16 bits with saturation:
2 x 255 x 127 = 64,770 clips to 32,767. Those kernels are exact with 7-bit weights (2 x 255 x 64 = 32,640, what
attnkit uses) or 7-bit inputs (`reduce_range`: 2 x 127 x 127 = 32,258, the `SATURATING` setting), so
`int8_scheme()` asks the kernels once per engine which ranges they sum exactly and refuses one exact in none
(tests/test_int8.py; error and speed per kernel family: benchmarks/int8_families.py).

In training, `stable_rows(multiple)` pads each product's rows with zero rows up to a multiple of the token budget:
under bf16 autocast oneDNN builds a kernel for every new product shape (costly where it runs AMX), token-budget
batches bring new row counts each step, and padded shapes repeat. The zero rows add nothing to the gradient; their
work is the price (tests/test_linear.py; builds counted by benchmarks/kernel_builds.sh).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

_ROWS_HINT = 64  # the batch size oneDNN picks its layout for; one layout serves decoding's and the encoder's rows


def _dtypes() -> tuple[torch.dtype, ...]:
    if not torch.backends.mkldnn.is_available():
        return ()
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


_PACKABLE = _dtypes()
_FAST_INT8_ENGINES = ("x86", "fbgemm", "onednn")  # PyTorch's int8 backends with AVX2 / AVX-512 / VNNI kernels


def int8_unavailable() -> str:
    """Why int8 products would not be fast and exact here ("" when they are): they need an x86 CPU with AVX2 or
    better, one of PyTorch's x86 int8 backends, and kernels that compute the quantised product exactly."""
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine().lower() not in ("x86_64", "amd64") or capability not in ("AVX2", "AVX512"):
        return f"this CPU ({platform.machine()}, {capability}) has no fast int8 kernels in PyTorch (AVX2 or better)"
    engine = torch.backends.quantized.engine
    if engine not in _FAST_INT8_ENGINES:
        return f"the quantized engine is {engine!r}, not one of {_FAST_INT8_ENGINES}"
    if int8_scheme() is None:
        return f"the {engine!r} int8 kernels here miss the exact quantised product even with 7-bit inputs or weights"
    return ""


@dataclass(frozen=True)
class Int8Scheme:
    """How a product is quantised for the int8 kernels: its input to 0..input_top (uint8, one affine scale per
    call), each weight row to -weight_top..weight_top (int8, a symmetric scale per row)."""

    name: str
    input_top: int  # 255, or 127 (PyTorch's `reduce_range`)
    weight_top: int  # 127, or 64
    words: str  # for reports and /health

    @property
    def reduce_range(self) -> bool:
        return self.input_top == 127


INT8_SCHEMES = {s.name: s for s in (
    Int8Scheme("full", 255, 127, "8-bit inputs (32-bit sums)"),
    Int8Scheme("weights", 255, 64, "8-bit inputs, 7-bit weights (the kernels add pairs in 16 bits)"),
    Int8Scheme("inputs", 127, 127, "7-bit inputs (the kernels add pairs in 16 bits)"),
)}
# Where the kernels add pairs in 16 bits: "weights" (less error, module docstring) or "inputs". Library code only
# reads it; an entry point that measures the other sets it before any int8 copy is made
# (attnkit.bench.int8_families.apply_engine, from ATTNKIT_INT8_SATURATING).
SATURATING = "weights"


def int8_scheme() -> Int8Scheme | None:
    """The quantisation the int8 kernels of the current quantized engine sum exactly: 8-bit inputs and weights where
    they accumulate in 32 bits (VNNI, AMX), else 7-bit weights (or, with SATURATING = "inputs", 7-bit inputs),
    None where none is exact. Measured on the kernels, once per engine (module docstring)."""
    exact = _probe_schemes(torch.backends.quantized.engine)
    return next((INT8_SCHEMES[name] for name in ("full", SATURATING, "weights", "inputs") if name in exact), None)


@functools.cache
def _probe_schemes(engine: str) -> frozenset[str]:
    """The schemes whose products the kernels sum exactly. Run on ones: every input quantises to its top value and
    every weight to +-weight_top, so each pair of products is +-2 * input_top * weight_top (64,770 for 8 + 8 bits,
    over int16's 32,767; 32,640 with 7-bit weights) and every output should be +-K exactly."""
    k = 64
    x = torch.ones(3, k)  # (M, K)
    w = torch.ones(4, k)  # (N, K), rows of +1 and -1
    w[1::2] = -1
    exact = x @ w.T  # (M, N): +-64
    found = set()
    with torch.inference_mode(False), torch.no_grad():
        for scheme in INT8_SCHEMES.values():
            packed = _quantize_rows(w, None, scheme.weight_top)
            y = torch.ops.quantized.linear_dynamic(x, packed, scheme.reduce_range)  # (M, N)
            if torch.allclose(y, exact, rtol=1e-4, atol=0):
                found.add(scheme.name)
    return frozenset(found)


def int8_kernels() -> str:
    """The int8 path this process takes, in words (for reports): engine and quantisation."""
    scheme = int8_scheme()
    return f"{torch.backends.quantized.engine} engine, {scheme.words if scheme else 'no exact kernels'}"


def _quantize_rows(w: torch.Tensor, bias: torch.Tensor | None, top: int) -> torch.ScriptObject:
    """(N, K) float weight -> the int8 kernels' packed form: w[n] ~ scale[n] * q[n], q in [-top, top]."""
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / top  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-top, top).to(torch.int8)  # (N, K)
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
        if int8 and (why := int8_unavailable()):
            raise ValueError(f"int8 products: {why}")
        # the ranges these kernels sum exactly, fixed for the cache's life
        self.scheme = int8_scheme() if int8 else None
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
            if self.int8:
                packed = _quantize_rows(w, bias, self.scheme.weight_top)
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(w, _ROWS_HINT)
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


# swish is SiLU, x * sigmoid(x) (Marian's and Hugging Face's name for it; oneDNN's `swish` with its alpha of 1)
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}
# oneDNN's post-op algorithm per activation: GELU's erf form ("none", not "tanh"), none for the others
_POINTWISE_ALGORITHM = {"relu": "", "gelu": "none", "swish": ""}
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default if _PACKABLE else None  # resolved once
# PyTorch's dynamic int8 kernels fuse ReLU only; GELU and swish are applied to their float32 output
_linear_int8 = {None: torch.ops.quantized.linear_dynamic.default,  # (x, packed, reduce_range) -> float32
                "relu": torch.ops.quantized.linear_relu_dynamic.default}


_ROW_MULTIPLE: contextvars.ContextVar[int] = contextvars.ContextVar("attnkit_row_multiple", default=0)


@contextlib.contextmanager
def stable_rows(multiple: int) -> Iterator[None]:
    """A scope in which `linear`'s products run on a row count rounded up to a multiple of `multiple` (0: as is)."""
    token = _ROW_MULTIPLE.set(multiple)
    try:
        yield
    finally:
        _ROW_MULTIPLE.reset(token)


def row_multiple() -> int:
    """The multiple the current `stable_rows` scope rounds product rows up to (0 outside one)."""
    return _ROW_MULTIPLE.get()


def _linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, on x's rows padded with zero rows to the scope's multiple (stable_rows): (..., K) -> (..., N)."""
    multiple = row_multiple()
    n = x.numel() // max(x.size(-1), 1)
    extra = -n % multiple if multiple else 0
    if not extra:
        return F.linear(x, weight, bias)
    rows = F.pad(x.reshape(n, x.size(-1)), (0, 0, 0, extra))  # (n + extra, K)
    return F.linear(rows, weight, bias)[:n].view(*x.shape[:-1], -1)  # (n + extra, N) -> (..., N)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    rows: tuple[int, int] | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """act(F.linear(x, weight[a:b], bias[a:b])) for rows=(a, b) (all rows for None): (..., K) -> (..., N).

    `activation` ("relu", "gelu", "swish" or None) is fused into the product on the prepacked path.
    """
    if rows is not None and bias is not None:
        bias = bias[rows[0] : rows[1]]
    cache = _SCOPE.get()
    if not _packable(x, weight, cache):
        y = _linear_rows(x, weight if rows is None else weight[rows[0] : rows[1]], bias)
        return y if activation is None else _ACTIVATIONS[activation](y)
    if cache.int8:
        kernel = _linear_int8.get(activation, _linear_int8[None])
        y = kernel(x, cache.get(weight, rows, bias), cache.scheme.reduce_range)  # (..., N)
        return y if activation in _linear_int8 else _ACTIVATIONS[activation](y)
    packed = cache.get(weight, rows)
    if activation is None:
        return _linear_pointwise(x, packed, bias, "none", [], "")
    return _linear_pointwise(x, packed, bias, activation, [], _POINTWISE_ALGORITHM[activation])


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose inference on CPU uses the prepacked weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
