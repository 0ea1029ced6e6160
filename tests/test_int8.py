"""int8 products (`PackedWeights(int8=True)`, attnkit.cpu.packed) exact to their quantisation on every kernel family.

Which int8 kernels run is decided inside fbgemm and oneDNN from the CPU, `FBGEMM_ENABLE_INSTRUCTIONS` and
`ONEDNN_MAX_CPU_ISA`, read once per process. So `test_every_kernel_family_this_cpu_can_run` runs this file and
tests/test_quantize.py again in a fresh process per family the CPU can run, forcing it through those variables:
AVX2 and AVX-512 without VNNI add pairs of u8 x s8 products in 16 bits and saturate on full-range inputs and weights,
which gave wrong products (12.80 came out 6.48) until attnkit quantised inputs to 0..127 on them; it now quantises
weights to -64..64 there instead (less error), and each such family also runs with 7-bit inputs
(ATTNKIT_INT8_SATURATING=inputs), the other exact choice.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.bench.int8_families import FAMILIES, environment, saturating_side, unavailable
from attnkit.cpu import for_inference, int8_kernels, int8_scheme, int8_unavailable
from attnkit.cpu.modules import sharing
from attnkit.cpu.packed import INT8_SCHEMES, Int8Scheme, PackedLinear, PackedWeights, packable, packed_linear

needs_int8 = pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu}
FAMILY = os.environ.get("ATTNKIT_TEST_INT8_FAMILY")  # set in the processes the family test starts
SIDE = saturating_side()  # the 7-bit side on saturating kernels: the family's, else the default


def int8_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, scheme: Int8Scheme) -> torch.Tensor:
    """What the int8 path must compute, in float64: w rows quantised symmetrically (scale = max|row| / weight_top),
    x quantised to 0..input_top with one affine scale over the whole tensor (range widened to hold 0), exact
    products."""
    w64, x64, top = w.double(), x.double(), scheme.input_top
    w_scale = w64.abs().amax(1).clamp_min(1e-12) / scheme.weight_top  # (N,)
    qw = torch.round(w64 / w_scale[:, None]).clamp(-scheme.weight_top, scheme.weight_top)  # (N, K)
    lo, hi = min(x64.min().item(), 0.0), max(x64.max().item(), 0.0)
    x_scale = (hi - lo) / top or 1.0
    zero = min(max(round(-lo / x_scale), 0), top)
    qx = (torch.round(x64 / x_scale) + zero).clamp(0, top) - zero  # (..., K)
    y = (qx @ qw.T) * x_scale * w_scale  # (..., N)
    return y if b is None else y + b.double()


def int8_linear(lin: nn.Linear) -> PackedLinear:
    """A PackedLinear with int8 copies holding lin's own Parameters, as for_inference(int8=True) swaps one in."""
    return sharing(PackedLinear, lin, cache=PackedWeights(int8=True, saturating=SIDE))


def inputs(kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    """normal: both signs, the zero point mid-range; relu: what the FFN's second product reads, all >= 0, so large
    inputs quantise near the top of the range (where 16-bit pair sums overflow); ones: every input at the top."""
    x = torch.randn(shape)
    return {"normal": x, "relu": F.relu(x) * 4, "ones": torch.ones(shape)}[kind]


@needs_int8
@pytest.mark.parametrize("kind", ["normal", "relu", "ones"])
@pytest.mark.parametrize("rows", [None, (3, 11)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_int8_linear_is_the_quantised_product(kind, rows, activation):
    torch.manual_seed(0)
    lin, x = nn.Linear(64, 24), inputs(kind, (2, 7, 64))
    w, b = (lin.weight, lin.bias) if rows is None else (lin.weight[rows[0] : rows[1]], lin.bias[rows[0] : rows[1]])
    with torch.no_grad():
        cache = PackedWeights(int8=True, saturating=SIDE)
        out = packed_linear(cache, x, lin.weight, lin.bias, rows=rows, activation=activation)
        exact = ACTIVATIONS[activation](F.linear(x, w, b))
    ref = ACTIVATIONS[activation](int8_reference(x, w, b, int8_scheme(SIDE))).float()
    assert out.shape == exact.shape and out.dtype == torch.float32
    scale = exact.abs().max().item()
    assert (out - ref).abs().max().item() < 1e-3 * scale  # the kernel computes the quantised product...
    assert (out - exact).abs().max().item() > 1e-6 * scale  # ...which is not the float one (int8 really ran)
    assert (out - exact).abs().max().item() < 0.03 * scale  # ...but close to it


@needs_int8
@pytest.mark.parametrize("k", [16, 512, 2048])
def test_int8_products_at_model_widths_are_exact_on_large_inputs(k):
    """The FFN's widths: every pair of products at the top of the input range, in both signs."""
    torch.manual_seed(1)
    w = torch.randn(32, k)
    x = F.relu(torch.randn(64, k)) + torch.ones(64, k)  # (M, K), all well inside the top half of the range
    lin = int8_linear(nn.Linear(k, 32, bias=False))
    with torch.no_grad():
        lin.weight.copy_(w)
        out = lin(x)  # (M, N)
    assert len(lin.cache) == 1  # the int8 path ran
    ref = int8_reference(x, w, None, int8_scheme(SIDE)).float()
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def kernel_is_exact(input_top: int, weight_top: int) -> bool:
    """Whether the engine's kernel sums ones quantised to input_top times +-weight_top exactly (pairs of 2 x input_top
    x weight_top), asked through PyTorch's own quantisation calls rather than attnkit's."""
    x, w = torch.ones(2, 32), torch.ones(3, 32)
    w[1] = -1
    with torch.no_grad():
        packed = torch.ops.quantized.linear_prepack(torch.quantize_per_tensor(w, 1 / weight_top, 0, torch.qint8), None)
        y = torch.ops.quantized.linear_dynamic(x, packed, input_top == 127)
    return torch.allclose(y, x @ w.T, rtol=1e-4)


@needs_int8
def test_the_scheme_is_one_the_kernels_sum_exactly():
    """The probe's choice: 8 + 8 bits only where the full range is exact; else 7-bit weights (7-bit inputs where the
    measurement asks for them), which the kernels of this family sum exactly."""
    scheme, full_is_exact = int8_scheme(SIDE), kernel_is_exact(255, 127)
    assert (scheme.name == "full") == full_is_exact
    assert kernel_is_exact(scheme.input_top, scheme.weight_top)
    assert PackedWeights(int8=True, saturating=SIDE).scheme == scheme
    assert int8_kernels(SIDE) == f"{torch.backends.quantized.engine} engine, {scheme.words}"
    if FAMILY:
        assert scheme.name == os.environ["ATTNKIT_TEST_INT8_SCHEME"], (FAMILY, int8_kernels(SIDE))


@needs_int8
@pytest.mark.skipif(getattr(int8_scheme(SIDE), "name", None) != "weights", reason="kernels with 7-bit weights only")
def test_saturating_kernels_get_8_bit_inputs_and_7_bit_weights():
    """On kernels that add pairs in 16 bits: packed weights in -64..64, inputs in 0..255, and an FFN-like product
    (ReLU inputs, K 512) nearer the float64 one than with 7-bit inputs."""
    torch.manual_seed(3)
    lin, x = int8_linear(nn.Linear(512, 64, bias=False)), F.relu(torch.randn(32, 512))  # (M, K)
    cache = lin.cache
    with torch.no_grad():
        out = lin(x)  # (M, N)
        packed = cache.get(lin.weight, None)
        exact = F.linear(x.double(), lin.weight.double())
    q = torch.ops.quantized.linear_unpack(packed)[0].int_repr()  # (N, K) int8
    assert q.abs().max().item() == 64 and not cache.scheme.reduce_range
    ref = int8_reference(x, lin.weight.detach(), None, INT8_SCHEMES["weights"])
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    seven_bit_inputs = int8_reference(x, lin.weight.detach(), None, INT8_SCHEMES["inputs"])
    error = (out.double() - exact).norm() / exact.norm()
    assert error < 0.95 * (seven_bit_inputs - exact).norm() / exact.norm()  # 0.0086 against 0.0101


@pytest.mark.skipif(bool(FAMILY), reason="inside a family's own run")
@needs_int8
def test_a_saturating_family_runs_8_bit_inputs_and_7_bit_weights():
    """The test above in a process of its own on fbgemm's AVX2 kernels (or the first 16-bit family the CPU has)."""
    family = next((f for f in sorted(FAMILIES) if FAMILIES[f].pairs_in_16_bits and not unavailable(f)), None)
    if family is None:
        pytest.skip("this CPU runs no kernels that add pairs in 16 bits")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          f"{__file__}::test_saturating_kernels_get_8_bit_inputs_and_7_bit_weights"],
                         env=environment(family) | {"ATTNKIT_TEST_INT8_FAMILY": family}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "1 passed" in run.stdout, f"{family}:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"


@needs_int8
def test_int8_copies_serve_float32_inputs_of_their_module_only():
    torch.manual_seed(2)
    lin, x = nn.Linear(32, 16), torch.randn(5, 32)
    fast = int8_linear(lin)
    cache = fast.cache
    with torch.no_grad():
        plain = F.linear(x, lin.weight, lin.bias)
        assert packable(x, lin.weight, cache) and not packable(x.bfloat16(), lin.weight.bfloat16(), cache)
        quantised = fast(x)
        assert len(cache) == 1
        torch.testing.assert_close(lin(x), plain)  # the module the copy shares its weights with: float32
    assert not torch.equal(quantised, plain)


def test_int8_copies_are_refused_with_the_reason_where_int8_does_not_run(monkeypatch):
    linear_module = sys.modules["attnkit.cpu.packed"]
    monkeypatch.setattr(linear_module, "int8_unavailable", lambda: "the kernels here saturate")
    with pytest.raises(ValueError, match="int8 products: the kernels here saturate"):
        PackedWeights(int8=True, saturating=SIDE)
    with pytest.raises(ValueError, match="int8 products: the kernels here saturate"):
        for_inference(nn.Sequential(nn.Linear(4, 4)), int8=True)
    assert not PackedWeights().int8  # float copies need no int8 kernels
    assert isinstance(for_inference(nn.Sequential(nn.Linear(4, 4)))[0], PackedLinear)


# --- every kernel family this CPU can run, each in its own process ---------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(bool(FAMILY), reason="inside a family's own run")
@pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
@pytest.mark.parametrize("family, saturating", [(f, side) for f in sorted(FAMILIES)
                                                 for side in (("weights", "inputs") if FAMILIES[f].pairs_in_16_bits
                                                              else ("weights",))])
def test_every_kernel_family_this_cpu_can_run(family, saturating, trained):
    if why := unavailable(family):
        pytest.skip(why)
    here = Path(__file__).parent
    scheme = saturating if FAMILIES[family].pairs_in_16_bits else "full"
    env = environment(family, saturating) | {
        "ATTNKIT_TEST_INT8_FAMILY": family, "ATTNKIT_TEST_INT8_SCHEME": scheme,
        "ATTNKIT_TEST_INT8_CHECKPOINT": str(trained[1] / "checkpoints" / "best.safetensors")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow",
                          str(here / "test_int8.py"), str(here / "test_quantize.py")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{family}, {saturating}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    # every test ran but the one that starts a process itself and, on other kernels, the one for 7-bit weights
    last = run.stdout.splitlines()[-1]
    assert " passed" in last and re.search(rf"\b{1 if scheme == 'weights' else 2} skipped", last), run.stdout[-2000:]
