"""int8 products (`PackedWeights(int8=True)`, attnkit.nn.linear) exact to their quantisation on every kernel family.

Which int8 kernels run is decided inside fbgemm and oneDNN from the CPU, `FBGEMM_ENABLE_INSTRUCTIONS` and
`ONEDNN_MAX_CPU_ISA`, read once per process. So `test_every_kernel_family_this_cpu_can_run` runs this file and
tests/test_quantize.py again in a fresh process per family the CPU can run, forcing it through those variables:
AVX2 and AVX-512 without VNNI add pairs of u8 x s8 products in 16 bits and saturate on full-range inputs, which
gave wrong products (12.80 came out 6.48) until attnkit quantised inputs to 0..127 on them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit.bench.int8_families import FAMILIES, environment, unavailable
from attnkit.nn import Linear, linear
from attnkit.nn.linear import PackedWeights, int8_input_range, int8_kernels, int8_unavailable, packable, prepacked

needs_int8 = pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu}
FAMILY = os.environ.get("ATTNKIT_TEST_INT8_FAMILY")  # set in the processes the family test starts


def int8_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, top: int) -> torch.Tensor:
    """What the int8 path must compute, in float64: w rows quantised symmetrically (scale = max|row| / 127), x
    quantised to 0..top with one affine scale over the whole tensor (range widened to hold 0), exact products."""
    w64, x64 = w.double(), x.double()
    w_scale = w64.abs().amax(1).clamp_min(1e-12) / 127  # (N,)
    qw = torch.round(w64 / w_scale[:, None]).clamp(-127, 127)  # (N, K)
    lo, hi = min(x64.min().item(), 0.0), max(x64.max().item(), 0.0)
    x_scale = (hi - lo) / top or 1.0
    zero = min(max(round(-lo / x_scale), 0), top)
    qx = (torch.round(x64 / x_scale) + zero).clamp(0, top) - zero  # (..., K)
    y = (qx @ qw.T) * x_scale * w_scale  # (..., N)
    return y if b is None else y + b.double()


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
    lin, x = Linear(64, 24), inputs(kind, (2, 7, 64))
    w, b = (lin.weight, lin.bias) if rows is None else (lin.weight[rows[0] : rows[1]], lin.bias[rows[0] : rows[1]])
    with torch.no_grad(), prepacked(PackedWeights(int8=True)):
        out = linear(x, lin.weight, lin.bias, rows=rows, activation=activation)
        exact = ACTIVATIONS[activation](F.linear(x, w, b))
    ref = ACTIVATIONS[activation](int8_reference(x, w, b, int8_input_range())).float()
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
    lin = Linear(k, 32, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
        with prepacked(PackedWeights(int8=True)):
            out = lin(x)  # (M, N)
    ref = int8_reference(x, w, None, int8_input_range()).float()
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


@needs_int8
def test_the_input_range_is_the_one_the_kernels_sum_exactly():
    """The probe's choice: 255 only where the full range is exact; the range used by the kernels of this family."""
    assert int8_input_range() in (127, 255)
    x, w = torch.ones(2, 32), torch.ones(3, 32)
    with torch.no_grad():
        full = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(
            torch.quantize_per_tensor(w, 1 / 127, 0, torch.qint8), None), False)
    full_is_exact = torch.allclose(full, x @ w.T, rtol=1e-4)
    assert (int8_input_range() == 255) == full_is_exact
    assert PackedWeights(int8=True).reduce_range == (not full_is_exact)
    assert int8_kernels().startswith(torch.backends.quantized.engine)
    if FAMILY:
        assert int8_input_range() == int(os.environ["ATTNKIT_TEST_INT8_TOP"]), (FAMILY, int8_kernels())


@needs_int8
def test_int8_copies_serve_float32_inputs_in_their_scope_only():
    torch.manual_seed(2)
    lin, x = Linear(32, 16), torch.randn(5, 32)
    with torch.no_grad():
        plain = F.linear(x, lin.weight, lin.bias)
        with prepacked(PackedWeights(int8=True)) as cache:
            assert packable(x, lin.weight) and not packable(x.bfloat16(), lin.weight.bfloat16())
            quantised = lin(x)
            assert len(cache) == 1
        torch.testing.assert_close(lin(x), plain)  # outside the scope: float32 again
    assert not torch.equal(quantised, plain)


def test_int8_copies_are_refused_with_the_reason_where_int8_does_not_run(monkeypatch):
    linear_module = sys.modules["attnkit.nn.linear"]
    monkeypatch.setattr(linear_module, "int8_unavailable", lambda: "the kernels here saturate")
    with pytest.raises(ValueError, match="int8 products: the kernels here saturate"):
        PackedWeights(int8=True)
    assert not PackedWeights().int8  # float copies need no int8 kernels


# --- every kernel family this CPU can run, each in its own process ---------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(bool(FAMILY), reason="inside a family's own run")
@pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_kernel_family_this_cpu_can_run(family, trained):
    if why := unavailable(family):
        pytest.skip(why)
    here = Path(__file__).parent
    env = environment(family) | {"ATTNKIT_TEST_INT8_FAMILY": family,
                                 "ATTNKIT_TEST_INT8_TOP": str(FAMILIES[family].input_range),
                                 "ATTNKIT_TEST_INT8_CHECKPOINT": str(trained[1] / "checkpoints" / "best.safetensors")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow",
                          str(here / "test_int8.py"), str(here / "test_quantize.py")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{family}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert " passed" in run.stdout and " skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
