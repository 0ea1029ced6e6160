"""The private torch APIs that attnkit's CPU room (attnkit/cpu/, and nn/outputs.py's in-place log-softmax) calls,
each called as attnkit calls it and checked against a public reference. Private APIs may change in any torch release
without notice; a failure here names the API and the attnkit code that needs attention after an upgrade."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.cpu.process import BF16_FLAGS, cpu_flags

pytestmark = pytest.mark.usefixtures("one_thread")


@contextlib.contextmanager
def calling(api: str, user: str) -> Iterator[None]:
    """An error from `api` turned into one failure that names it and its caller in attnkit."""
    try:
        yield
    except (RuntimeError, TypeError, AttributeError, ValueError) as e:
        pytest.fail(f"{api}, as {user} calls it, failed after a torch upgrade: {type(e).__name__}: {e}")


def same(got: torch.Tensor, expected: torch.Tensor, api: str, user: str, **tolerance: float) -> None:
    """assert_close with a message naming the private API and its user in attnkit."""
    torch.testing.assert_close(got, expected, **tolerance,
                               msg=lambda m: f"{api} no longer matches its public reference ({user}): {m}")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- torch._fused_adamw_ (attnkit.cpu.optim.FusedAdamW) ------------------------------------------------------------
def test_fused_adamw_updates_as_torch_optim_adamw():
    api, user = "torch._fused_adamw_", "attnkit.cpu.optim.FusedAdamW.step"
    params = [torch.randn(5, 3, generator=gen(0)), torch.randn(7, generator=gen(1))]
    grads = [torch.randn(p.shape, generator=gen(2 + i)) for i, p in enumerate(params)]
    hyper = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    reference = [nn.Parameter(p.clone()) for p in params]
    for r, g in zip(reference, grads, strict=True):
        r.grad = g.clone()
    opt = torch.optim.AdamW(reference, fused=False, foreach=False, **hyper)
    opt.step()
    avgs, squares = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.zeros((), dtype=torch.float32) for _ in params]
    with calling(api, user), torch.no_grad():
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(params, grads, avgs, squares, [], steps, amsgrad=False, lr=hyper["lr"],
                            beta1=hyper["betas"][0], beta2=hyper["betas"][1], weight_decay=hyper["weight_decay"],
                            eps=hyper["eps"], maximize=False)
    for p, r, avg, square in zip(params, reference, avgs, squares, strict=True):
        same(p, r.detach(), api, user, rtol=1e-6, atol=1e-7)
        same(avg, opt.state[r]["exp_avg"], api, user, rtol=1e-6, atol=1e-8)
        same(square, opt.state[r]["exp_avg_sq"], api, user, rtol=1e-6, atol=1e-10)
    assert all(s.item() == 1 for s in steps), f"{api}: the step counts were changed by the kernel ({user})"


# --- torch.lstm with positional flags (attnkit.cpu.lstm.LayerwiseLSTM) ----------------------------------------------
@pytest.mark.parametrize("train", [False, True])
def test_lstm_a_layer_at_a_time_with_positional_flags_equals_nn_lstm(train):
    api, user = "torch.lstm", "attnkit.cpu.lstm.LayerwiseLSTM.forward"
    torch.manual_seed(0)
    ref = nn.LSTM(6, 8, 2).train(train)  # time-major, 2 layers, no dropout
    x = torch.randn(5, 3, 6, generator=gen(1))  # (T, B, I) with T != B: a batch-first reading would differ
    h0, c0 = torch.randn(2, 3, 8, generator=gen(2)), torch.randn(2, 3, 8, generator=gen(3))  # (L, B, H)
    out, finals = x, []
    with calling(api, user):
        for i, weights in enumerate(ref.all_weights):
            # biases, 1 layer, no dropout, train, one direction, time-major
            out, h_n, c_n = torch.lstm(out, (h0[i : i + 1], c0[i : i + 1]), weights, True, 1, 0.0, train, False, False)
            finals.append((h_n, c_n))
    expected, (ref_h, ref_c) = ref(x, (h0, c0))
    assert out.shape == (5, 3, 8) and all(h.shape == (1, 3, 8) for h, _ in finals), \
        f"{api}: outputs of shapes {out.shape}, {[tuple(h.shape) for h, _ in finals]} ({user})"
    same(out, expected, api, user, rtol=0, atol=1e-6)
    same(torch.cat([h for h, _ in finals]), ref_h, api, user, rtol=0, atol=1e-6)
    same(torch.cat([c for _, c in finals]), ref_c, api, user, rtol=0, atol=1e-6)


# --- oneDNN's prepacked linear maps (attnkit.cpu.packed) ------------------------------------------------------------
mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
_ACTIVATIONS = {"none": lambda y: y, "relu": F.relu, "gelu": F.gelu, "swish": F.silu}
_ALGORITHM = {"none": "", "relu": "", "gelu": "none", "swish": ""}  # oneDNN's post-op algorithm: GELU's erf form


def packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, activation: str) -> torch.Tensor:
    """The prepacked product as attnkit.cpu.packed makes it: the weight reordered for 64 rows, then one fused call."""
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)
    return torch.ops.mkldnn._linear_pointwise.default(x, packed, b, activation, [], _ALGORITHM[activation])


@mkldnn
@pytest.mark.parametrize("activation", list(_ACTIVATIONS))
@pytest.mark.parametrize("rows", [1, 5, 64, 100])
def test_mkldnn_prepacked_linear_pointwise_equals_f_linear(activation, rows):
    api = "torch.ops.mkldnn._reorder_linear_weight + _linear_pointwise"
    user = "attnkit.cpu.packed.packed_linear"
    w, b = torch.randn(24, 40, generator=gen(0)), torch.randn(24, generator=gen(1))  # (N, K), (N,)
    x = torch.randn(3, rows, 40, generator=gen(2))  # (..., K)
    with torch.no_grad(), calling(api, user):
        got = packed_linear(x, w, b, activation)
        without_bias = packed_linear(x, w, None, activation)
    same(got, _ACTIVATIONS[activation](F.linear(x, w, b)), api, user, rtol=1e-5, atol=1e-5)
    same(without_bias, _ACTIVATIONS[activation](F.linear(x, w)), api, user, rtol=1e-5, atol=1e-5)


@mkldnn
def test_mkldnn_bf16_support_is_a_bool_that_holds_its_promise():
    api, user = "torch.ops.mkldnn._is_mkldnn_bf16_supported", "attnkit.cpu.packed (the dtypes it prepacks)"
    with calling(api, user):
        supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert isinstance(supported, bool), f"{api} returned {supported!r}, not a bool ({user})"
    if cpu_flags() & BF16_FLAGS and "avx512bw" in cpu_flags():  # x86 with bf16 instructions: oneDNN runs bf16
        assert supported, f"{api} says no on a CPU with {sorted(cpu_flags() & BF16_FLAGS)} ({user})"
    if not supported:
        return
    w = torch.randn(24, 40, generator=gen(0)).bfloat16()
    x = torch.randn(5, 40, generator=gen(1)).bfloat16()
    with torch.no_grad(), calling(api, user):
        got = packed_linear(x, w, None, "none")
    assert got.dtype == torch.bfloat16, f"{api}: a bf16 product came back in {got.dtype} ({user})"
    same(got.float(), F.linear(x.float(), w.float()), api, user, rtol=2e-2, atol=5e-2)  # bf16's 8-bit mantissa


# --- PyTorch's dynamic int8 kernels (attnkit.cpu.packed's int8 copies) ----------------------------------------------
INT8_ENGINES = ("x86", "fbgemm", "onednn")  # the engines whose kernels attnkit.cpu.packed uses for int8


def quantized_rows(w: torch.Tensor, b: torch.Tensor, top: int) -> tuple[torch.ScriptObject, torch.Tensor]:
    """As attnkit.cpu.packed quantises a weight: rows to [-top, top] with a scale each, per-channel, prepacked; and the
    float weights they stand for."""
    scale = w.abs().amax(dim=1) / top  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-top, top).to(torch.int8)  # (N, K)
    with warnings.catch_warnings():  # quantized tensors are marked deprecated
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(qw, b), q.float() * scale[:, None]


@pytest.mark.skipif(torch.backends.quantized.engine not in INT8_ENGINES,
                    reason=f"the quantized engine {torch.backends.quantized.engine!r} is not one attnkit uses")
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("input_top, weight_top, reduce_range", [(255, 64, False), (127, 127, True)])
def test_dynamic_int8_linear_equals_the_float_product_of_its_dequantised_weights(relu, input_top, weight_top,
                                                                                 reduce_range):
    """Exact up to the input's own quantisation (uint8 over [min, max], one scale per call): each output may differ
    by half an input step times the sum of its row's |weights|. The ranges are those attnkit sums exactly."""
    api = ("torch._make_per_channel_quantized_tensor + torch.ops.quantized.linear_prepack + "
           f"linear{'_relu' if relu else ''}_dynamic")
    user = "attnkit.cpu.packed (PackedWeights(int8=True), linear)"
    w, b = torch.randn(24, 40, generator=gen(0)), torch.randn(24, generator=gen(1))  # (N, K), (N,)
    x = torch.randn(6, 40, generator=gen(2))  # (M, K)
    kernel = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
    with torch.no_grad(), calling(api, user):
        packed, dequantised = quantized_rows(w, b, weight_top)
        got = kernel(x, packed, reduce_range)  # (M, N), float32
    expected = F.linear(x, dequantised, b)
    expected = F.relu(expected) if relu else expected
    step = (x.max().clamp_min(0) - x.min().clamp_max(0)) / input_top  # the input's quantisation step
    bound = step / 2 * dequantised.abs().sum(dim=1) + 1e-4  # (N,)
    error = (got - expected).abs()
    assert got.shape == expected.shape and bool((error <= bound).all()), \
        f"{api} is off the float product by up to {error.max().item():.3g}, over the input's rounding ({user})"


# --- the softmax's backward (attnkit.cpu.float32_attention) --------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_backward_data_equals_autograd_of_softmax(dtype):
    api, user = "torch._softmax_backward_data", "attnkit.cpu.float32_attention (its backward)"
    scores = torch.randn(2, 3, 5, 7, dtype=dtype, generator=gen(0), requires_grad=True)  # (B, H, T, S)
    weights = scores.softmax(dim=-1)
    grad = torch.randn(weights.shape, dtype=dtype, generator=gen(1))
    (expected,) = torch.autograd.grad(weights, scores, grad)
    with calling(api, user):
        got = torch._softmax_backward_data(grad, weights.detach(), -1, dtype)
    same(got, expected, api, user)


# --- dropout's selection (attnkit.cpu.dropout) ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_threshold_backward_keeps_x_where_the_scores_are_positive(dtype):
    api, user = "torch.ops.aten.threshold_backward", "attnkit.cpu.dropout.drop"
    x = torch.randn(4, 33, generator=gen(0)).to(dtype)
    scores = torch.randn(4, 33, generator=gen(1)).to(dtype)
    scores[0, :5] = 0.0  # on the threshold: dropped
    with calling(api, user):
        got = torch.ops.aten.threshold_backward(x, scores, 0.0)
    expected = torch.where(scores > 0, x, torch.zeros((), dtype=dtype))
    assert got.dtype == dtype and torch.equal(got, expected), f"{api} no longer keeps x where scores > 0 ({user})"


# --- the in-place log-softmax of a decoding step (attnkit.nn.outputs.step_log_probs) -------------------------------
@pytest.mark.parametrize("shape", [(1, 7), (5, 1000), (3, 32003)])
def test_log_softmax_in_place_equals_log_softmax_bit_for_bit(shape):
    api, user = "torch._log_softmax(x, -1, False, out=x)", "attnkit.nn.outputs.step_log_probs"
    logits = torch.randn(*shape, generator=gen(0)) * 8  # (N, V)
    expected = logits.log_softmax(dim=-1)
    with torch.inference_mode(), calling(api, user):
        x = logits.clone()
        got = torch._log_softmax(x, -1, False, out=x)
    assert got.data_ptr() == x.data_ptr(), f"{api} no longer writes into its input ({user})"
    assert torch.equal(got, expected), f"{api} no longer equals log_softmax bit for bit ({user})"
