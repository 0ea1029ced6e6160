"""Attention with float32 products on half-precision inputs (attnkit.cpu.float32_attention) against the naive
reference, and its use by `cpu_training_attention` in bf16 training on a CPU (which the training scope picks where
kernel builds are costly)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import attnkit.cpu.attention as cpu_attention_module
import attnkit.cpu.training as cpu_training_module
from attnkit.cpu import training_scope
from attnkit.cpu.attention import cpu_attention, cpu_training_attention
from attnkit.cpu.dropout import keep_mask
from attnkit.cpu.float32_attention import attend_float32
from attnkit.nn import MultiHeadAttention
from attnkit.nn.attention import scaled_dot_product
from attnkit.nn.masks import causal_mask

B, H, T, S, DH = 2, 3, 5, 7, 8


def _inputs(dtype: torch.dtype, t: int = T, s: int = S) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    shapes = [(B, H, t, DH), (B, H, s, DH), (B, H, s, DH)]
    return tuple(torch.randn(shape, dtype=torch.float64).to(dtype).requires_grad_() for shape in shapes)


def _padding(s: int = S) -> torch.Tensor:
    mask = torch.ones(B, 1, 1, s, dtype=torch.bool)
    mask[1, ..., s - 2 :] = False  # the second sentence's last two keys are padding
    return mask


def _reference(q, k, v, mask, causal: bool, scale: float, keep: torch.Tensor | None = None, p: float = 0.0):
    """softmax(mask(q k^T * scale)) v, dropout by `keep`, in float64 through autograd."""
    q, k, v = (x.double() for x in (q, k, v))
    allowed = mask if mask is not None else torch.ones(1, dtype=torch.bool)
    if causal:
        allowed = allowed & causal_mask(q.size(2), k.size(2))
    weights = scaled_dot_product(q * (scale * DH**0.5), k, v, allowed)[1]  # the reference scales by 1/sqrt(Dh)
    if keep is not None:
        weights = weights * keep / (1 - p)
    return weights @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [T, S])  # fewer queries than keys: a causal mask aligned at the right
def test_gradients_pass_gradcheck_in_float64(causal, t):
    q, k, v = _inputs(torch.float64, t=t)
    assert torch.autograd.gradcheck(
        lambda q, k, v: attend_float32(q, k, v, mask=_padding(), causal=causal, scale=0.3), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_equals_the_naive_reference(causal):
    q, k, v = _inputs(torch.float64, t=T)
    out = attend_float32(q, k, v, mask=_padding(), causal=causal, scale=DH**-0.5)
    ref = _reference(q, k, v, _padding(), causal, DH**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((out * ref.detach()).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * ref.detach()).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_multiplied_in_float32_and_returned_in_their_dtype(dtype):
    """Against float64 on the same half-precision values: the output and gradients are off only by their rounding
    to `dtype`, and the float32 products make them as close as a float32 computation is (bf16 products are not)."""
    q, k, v = _inputs(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast must not narrow the products again
        out = attend_float32(q, k, v, mask=_padding(), causal=True, scale=DH**-0.5)
    assert out.dtype == dtype
    ref = _reference(q, k, v, _padding(), True, DH**-0.5)
    upcast = [x.detach().float() for x in (q, k, v)]  # the same values, for the float32 computation's own result
    exact = attend_float32(*upcast, mask=_padding(), causal=True, scale=DH**-0.5)
    assert torch.equal(out, exact.to(dtype))  # autocast changed nothing: float32 products, one rounding at the end
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    upstream = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * upstream).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), r.double(), rtol=2e-2, atol=2e-2)


def test_dropout_drops_the_weights_with_nn_dropout_s_keep_masks():
    q, k, v = _inputs(torch.float64)
    p = 0.25
    torch.manual_seed(7)
    out = attend_float32(q, k, v, mask=_padding(), causal=False, scale=DH**-0.5, dropout=p)
    torch.manual_seed(7)
    keep = keep_mask(torch.Size((B, H, T, S)), p, torch.device("cpu"))
    assert 0 < keep.float().mean() < 1
    ref = _reference(q, k, v, _padding(), False, DH**-0.5, keep, p)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def _counting_float32_products(monkeypatch) -> list[torch.dtype]:
    """Records the query dtype of every call cpu_training_attention makes to attend_float32."""
    calls, real = [], attend_float32

    def spy(q, *args, **kwargs):
        calls.append(q.dtype)
        return real(q, *args, **kwargs)
    monkeypatch.setattr(cpu_attention_module, "attend_float32", spy)
    return calls


def test_multi_head_attention_trains_bf16_through_cpu_training_attention(monkeypatch):
    """In training under bf16 autocast, cpu_training_attention multiplies short self-attention in float32; it matches
    the module in float64 within bf16's rounding of the projections, and the gradients reach every weight. In
    evaluation, or in float32, it leaves the products to cpu_attention."""
    calls = _counting_float32_products(monkeypatch)
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).train()
    attn.attention_function = cpu_training_attention
    x = torch.randn(B, T, 16)
    mask = _padding(T)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x, mask=mask, causal=True)
    assert calls == [torch.bfloat16]
    wide = MultiHeadAttention(16, 2).double().train()
    wide.load_state_dict(attn.state_dict())
    ref, _ = wide(x.double(), mask=mask, causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())
    attn(x, mask=mask, causal=True)  # float32: nothing to widen
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        attn.eval()(x, mask=mask, causal=True)  # evaluation: no kernels for a backward to build
        attn.train()(x, mask=mask, causal=True, need_weights=True)  # the weights asked for: the explicit path
    assert calls == [torch.bfloat16]


@pytest.mark.parametrize("costly", [False, True])
def test_the_training_scope_takes_float32_products_for_bf16_where_kernel_builds_are_costly(costly, monkeypatch):
    """training_scope(cpu) sets cpu_training_attention (float32 products for bf16) where kernel builds are costly,
    cpu_attention (bf16 products) elsewhere; both equal the plain module's output in bf16."""
    monkeypatch.setattr(cpu_training_module, "kernel_builds_costly", lambda device, dtype: costly)
    calls = _counting_float32_products(monkeypatch)
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).train()
    x = torch.randn(B, T, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, _ = attn(x, mask=_padding(T), causal=True)
        with training_scope(torch.device("cpu"), max_tokens=64).applied(attn):
            assert attn.attention_function is (cpu_training_attention if costly else cpu_attention)
            scoped, _ = attn(x, mask=_padding(T), causal=True)
    assert "attention_function" not in attn.__dict__  # the class's default again
    assert calls == ([torch.bfloat16] if costly else [])
    torch.testing.assert_close(scoped.float(), plain.float(), rtol=0.03, atol=0.03)


BATCHED_BUILDS = """
import sys, torch
from attnkit.nn import MultiHeadAttention
from attnkit.cpu.attention import cpu_attention, cpu_training_attention
attn = MultiHeadAttention(64, 2).train()
attn.attention_function = cpu_training_attention if sys.argv[1] == "float32" else cpu_attention
for b, t in ((8, 9), (7, 12), (9, 10), (6, 14), (8, 11)):  # new lengths each step, as token-budget batches give
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(torch.randn(b, t, 64), causal=True)
    out.float().sum().backward()
"""


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                    reason="no bfloat16 oneDNN kernels on this CPU")
def test_bf16_training_with_float32_products_builds_no_batched_kernel_for_new_lengths():
    """What it is for: in bf16 on a CPU, every new (B * H, T, S) makes oneDNN build batched-product kernels, forward
    and backward. With cpu_attention's bf16 products the five steps build them; with cpu_training_attention's float32
    ones, none (ONEDNN_VERBOSE counts 3-D matmul builds)."""
    def batched_builds(mode: str) -> int:
        env = {**os.environ, "ONEDNN_VERBOSE": "profile_create", "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", BATCHED_BUILDS, mode], env=env, capture_output=True, text=True,
                             check=True).stdout
        rows = [line for line in out.splitlines() if ",create:cache_miss," in line and ",matmul," in line]
        return sum(line.split(",")[-2].split(":")[0].count("x") == 2 for line in rows)  # (batch x rows x cols)
    assert batched_builds("bf16") >= 20
    assert batched_builds("float32") == 0
