"""Linear maps that keep a prepacked copy of their weights for CPU inference.

Called through `F.linear`, oneDNN repacks the weight into its blocked layout on every call, which at a decoder
step's few rows costs about as much as the product; keeping the packed copy ("prepacking", as inductor's freezing
pass does) avoids it. The modules here (`PackedLinear`, `PackedStackedLinear`, `PackedLogits`, `PackedFeedForward`)
are the nn modules they replace (`attnkit.cpu.for_inference` swaps them in) and take that path when it is safe:
CPU, no gradient, no autocast, float32 (or bf16 where oneDNN has it), a Parameter weight; anywhere else they are
the modules they replace. The `PackedWeights` cache rebuilds a copy when the weight's version counter or storage
changes; a fused optimiser step or a write through `.data` does not bump the counter, so a cache belongs to weights
fixed while it lives (a search's, a `Translator`'s). Results agree with `F.linear` to float32 rounding; the price is
one more copy of each weight. tests/test_linear.py checks the equivalence; `attnkit bench --workloads mt-greedy
mt-beam5` measures the gain.

`PackedWeights(int8=True)` keeps int8 copies instead: weight rows quantised symmetrically with a scale each, the
input to uint8 with one scale per call, through PyTorch's dynamic quantisation kernels (fbgemm / oneDNN: AVX2,
AVX-512, VNNI), accumulated in int32. With VNNI or AMX a u8 x s8 product goes straight into int32 (inputs 0..255,
weights -127..127); without it (AVX2, AVX-512F/BW) `vpmaddubsw` adds pairs of products in 16 bits with saturation:
2 x 255 x 127 = 64,770 clips to 32,767. Those kernels are exact with 7-bit weights (2 x 255 x 64 = 32,640, what
attnkit uses) or 7-bit inputs (`reduce_range`: 2 x 127 x 127 = 32,258, the "inputs" scheme), so `int8_scheme()` asks
the kernels once per engine which ranges they sum exactly and refuses one exact in none (tests/test_int8.py; error
and speed per kernel family: benchmarks/int8_families.py).
"""

from __future__ import annotations

import functools
import platform
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.nn.attention import StackedLinear
from attnkit.nn.layers import ACTIVATIONS, FeedForward
from attnkit.nn.outputs import Logits

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
SATURATING = "weights"  # where the kernels add pairs in 16 bits: 7-bit weights (less error, module docstring)


def int8_scheme(saturating: str = SATURATING) -> Int8Scheme | None:
    """The quantisation the int8 kernels of the current quantized engine sum exactly: 8-bit inputs and weights where
    they accumulate in 32 bits (VNNI, AMX), else 7-bit weights (or, with saturating="inputs", 7-bit inputs),
    None where none is exact. Measured on the kernels, once per engine (module docstring)."""
    exact = _probe_schemes(torch.backends.quantized.engine)
    return next((INT8_SCHEMES[name] for name in ("full", saturating, "weights", "inputs") if name in exact), None)


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


def int8_kernels(saturating: str = SATURATING) -> str:
    """The int8 path this process takes (with that 7-bit side), in words (for reports): engine and quantisation."""
    scheme = int8_scheme(saturating)
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
    """Prepacked copies of weights that stay fixed while this cache lives, shared by a model's packed modules.

    id(Parameter) -> (weak reference to it, {rows: ((version, data_ptr), packed)}). A plain dict checked
    through the weak reference: a decoding step makes 19 products, and WeakIdKeyDictionary's lookup (a new
    weak reference per call) cost more than the checks themselves.
    """

    def __init__(self, int8: bool = False, saturating: str = SATURATING) -> None:
        self.int8 = int8  # int8 copies (with their bias) instead of float ones
        if int8 and (why := int8_unavailable()):
            raise ValueError(f"int8 products: {why}")
        # the ranges these kernels sum exactly, fixed for the cache's life
        self.scheme = int8_scheme(saturating) if int8 else None
        self._entries: dict[int, tuple[weakref.ref, dict]] = {}

    def __len__(self) -> int:
        return len(self._entries)

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


def _forget(cache: weakref.ref, key: int, _dead: weakref.ref) -> None:
    """Drop a Parameter's packed copies when it is collected (if the cache itself still lives)."""
    entries = getattr(cache(), "_entries", {})
    if key in entries and entries[key][0]() is None:
        del entries[key]


def packable(x: torch.Tensor, weight: torch.Tensor, cache: PackedWeights) -> bool:
    """Whether a product of x with `weight` takes the prepacked path (float32 only for int8 copies)."""
    return (
        not torch.is_grad_enabled()
        and x.is_cpu
        and isinstance(weight, nn.Parameter)
        and x.dtype == weight.dtype
        and x.dtype in ((torch.float32,) if cache.int8 else _PACKABLE)
        and not torch.is_autocast_enabled("cpu")
    )


# oneDNN's post-op algorithm per activation: GELU's erf form ("none", not "tanh"), none for the others
_POINTWISE_ALGORITHM = {"relu": "", "gelu": "none", "swish": ""}
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default if _PACKABLE else None  # resolved once
# PyTorch's dynamic int8 kernels fuse ReLU only; GELU and swish are applied to their float32 output
_linear_int8 = {None: torch.ops.quantized.linear_dynamic.default,  # (x, packed, reduce_range) -> float32
                "relu": torch.ops.quantized.linear_relu_dynamic.default}


def packed_linear(cache: PackedWeights, x: torch.Tensor, weight: nn.Parameter, bias: torch.Tensor | None,
                  rows: tuple[int, int] | None = None, activation: str | None = None) -> torch.Tensor:
    """act(x weight[a:b]^T + bias[a:b]) for rows=(a, b) (all rows for None) through the cache's packed copy:
    (..., K) -> (..., N). `activation` ("relu", "gelu", "swish" or None) is fused into the product where the
    kernels can. The caller checked `packable`."""
    if rows is not None and bias is not None:
        bias = bias[rows[0] : rows[1]]
    if cache.int8:
        kernel = _linear_int8.get(activation, _linear_int8[None])
        y = kernel(x, cache.get(weight, rows, bias), cache.scheme.reduce_range)  # (..., N)
        return y if activation in _linear_int8 else ACTIVATIONS[activation](y)
    packed = cache.get(weight, rows)
    if activation is None:
        return _linear_pointwise(x, packed, bias, "none", [], "")
    return _linear_pointwise(x, packed, bias, activation, [], _POINTWISE_ALGORITHM[activation])


def linear(cache: PackedWeights, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x weight^T + bias: through the cache's packed copy where `packable`, else F.linear."""
    if not packable(x, weight, cache):
        return F.linear(x, weight, bias)
    return packed_linear(cache, x, weight, bias)


class PackedLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose CPU inference reads the packed weight."""

    cache: PackedWeights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.cache, x, self.weight, self.bias)


class PackedStackedLinear(PackedLinear, StackedLinear):
    """StackedLinear whose CPU inference reads packed copies of the whole weight and of each part's rows."""

    def part(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if not packable(x, self.weight, self.cache):
            return super().part(x, start, stop)
        return packed_linear(self.cache, x, self.weight, self.bias, rows=(start, stop))


class PackedFeedForward(FeedForward):
    """FeedForward whose first product carries its activation fused (one pass fewer over the (B, T, F) hidden layer)
    where the product is packed; its w1 and w2 are PackedLinear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1 = self.w1
        if not (isinstance(w1, PackedLinear) and packable(x, w1.weight, w1.cache)):
            return super().forward(x)
        hidden = packed_linear(w1.cache, x, w1.weight, w1.bias, activation=self.activation)  # (B, T, F)
        return self.w2(self.dropout(hidden))


class PackedLogits(Logits):
    """Logits through the packed output weight; a step's log-probabilities normalised in place."""

    cache: PackedWeights

    def forward(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(self.cache, h, weight, bias)

    def log_probs(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """(N, D) -> float32 log-probabilities (N, V). Fresh contiguous float32 logits are normalised in place
        (`_log_softmax` with the input as its `out`; each row is read in full before it is written, and the result
        equals `log_softmax`'s bit for bit, which tests/test_linear.py checks): a step then does not allocate and
        fill a second (N, V) tensor (`attnkit bench --workloads mt-greedy`)."""
        logits = self(h, weight, bias)  # (N, V)
        if logits.dtype == torch.float32 and logits.is_contiguous() and not logits.requires_grad:
            return torch._log_softmax(logits, -1, False, out=logits)
        return logits.float().log_softmax(dim=-1)
