"""Attention, masks and positions against naive references."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.cpu.attention import cpu_attention, cpu_training_attention
from attnkit.cpu.dropout import Dropout, dropout, keep_mask
from attnkit.nn import MultiHeadAttention, causal_mask, key_padding_to_attn_mask, scaled_dot_product, sinusoid_table
from attnkit.nn.attention import KVCache, eager_attention, sdpa_attention

# every attention function, the plain ones and the CPU room's: each must equal the written-out reference
ATTENTION_FUNCTIONS = [sdpa_attention, eager_attention, cpu_attention, cpu_training_attention]


def explicit_mha(mha: MultiHeadAttention, x: torch.Tensor, mem: torch.Tensor, keep: torch.Tensor | None):
    """softmax(QK^T / sqrt(d)) V written out head by head with plain loops."""
    d, h, dh = mha.d_model, mha.n_heads, mha.head_dim
    w, b = mha.in_proj.weight, mha.in_proj.bias
    q = x @ w[:d].T + b[:d]
    k = mem @ w[d : 2 * d].T + b[d : 2 * d]
    v = mem @ w[2 * d :].T + b[2 * d :]
    out = torch.zeros_like(q)
    for bi in range(x.size(0)):
        for hi in range(h):
            sl = slice(hi * dh, (hi + 1) * dh)
            scores = q[bi, :, sl] @ k[bi, :, sl].T / math.sqrt(dh)  # (T, S)
            if keep is not None:
                scores = scores.masked_fill(~keep[bi], float("-inf"))
            out[bi, :, sl] = torch.softmax(scores, -1) @ v[bi, :, sl]
    return out @ mha.out_proj.weight.T + mha.out_proj.bias


def attention(d_model: int, n_heads: int, fn) -> MultiHeadAttention:
    mha = MultiHeadAttention(d_model, n_heads).eval()
    mha.attention_function = fn
    return mha


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_with_padding_equals_explicit(need_weights, fn):
    torch.manual_seed(0)
    mha = attention(16, 4, fn)
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    out, weights = mha(x, mask=key_padding_to_attn_mask(pad), need_weights=need_weights)
    keep = (~pad)[:, None, :].expand(3, 5, 5)
    torch.testing.assert_close(out, explicit_mha(mha, x, x, keep), atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (3, 4, 5, 5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 5))
        assert weights.masked_select(pad[:, None, None, :].expand_as(weights)).abs().max() == 0


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_cross_and_prefix_masks_equal_explicit(need_weights, fn):
    torch.manual_seed(1)
    mha = attention(12, 3, fn)
    x = torch.randn(2, 4, 12)
    out, _ = mha(x, causal=True, need_weights=need_weights)
    keep = causal_mask(4)[None].expand(2, 4, 4)
    torch.testing.assert_close(out, explicit_mha(mha, x, x, keep), atol=1e-5, rtol=1e-5)
    # cross-attention to a memory with padding
    mem = torch.randn(2, 6, 12)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    out, _ = mha(x, mem, mask=key_padding_to_attn_mask(pad), need_weights=need_weights)
    keep = (~pad)[:, None, :].expand(2, 4, 6)
    torch.testing.assert_close(out, explicit_mha(mha, x, mem, keep), atol=1e-5, rtol=1e-5)


def test_scaled_dot_product_reference_and_causal_mask():
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    out, w = scaled_dot_product(q, k, v, causal_mask(3, 5))
    # with 2 prefix keys, query i sees keys 0..i+2
    assert causal_mask(3, 5).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert (w[0, 0, 0, 3:] == 0).all() and torch.allclose(out, w @ v)


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS, ids=lambda f: f.__name__)
def test_attention_gradients_match_finite_differences(fn):
    torch.manual_seed(2)
    mha = attention(8, 2, fn).double()
    x = torch.randn(2, 3, 8, dtype=torch.double, requires_grad=True)
    mask = key_padding_to_attn_mask(torch.tensor([[0, 0, 1], [0, 0, 0]], dtype=torch.bool))
    # The explicit path is exact in float64; each function's own path is checked against its gradients.
    assert torch.autograd.gradcheck(lambda t: mha(t, mask=mask, causal=True, need_weights=True)[0], (x,))
    fused = torch.autograd.grad(mha(x, mask=mask, causal=True)[0].sum(), x)[0]
    explicit = torch.autograd.grad(mha(x, mask=mask, causal=True, need_weights=True)[0].sum(), x)[0]
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    reference = attention(8, 2, eager_attention).double()
    reference.load_state_dict(mha.state_dict())
    plain = torch.autograd.grad(reference(x, mask=mask, causal=True)[0].sum(), x)[0]
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-5)


def test_sinusoid_table_follows_the_formula():
    table = sinusoid_table(50, 8)
    for pos in (0, 1, 17, 49):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


# --- dropout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_drops_each_element_with_probability_p_independently(p):
    torch.manual_seed(0)
    n = 400_003  # not a multiple of 4: the last 64-bit draw is partly used
    keep = keep_mask(torch.Size([n]), p, torch.device("cpu"))
    rate = 1.0 - keep.float().mean().item()
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n)  # 5 standard errors
    lanes = keep[: n // 4 * 4].view(-1, 4).float()  # the four 16-bit slices of each 64-bit draw
    for lane in range(4):
        assert abs(1.0 - lanes[:, lane].mean().item() - p) < 0.01
    for a, b in [(0, 1), (1, 2), (2, 3), (0, 3)]:  # slices of one draw are independent
        assert abs((lanes[:, a] * lanes[:, b]).mean().item() - (1 - p) ** 2) < 0.01
    torch.manual_seed(0)
    assert torch.equal(keep_mask(torch.Size([n]), p, torch.device("cpu")), keep)  # the seed reproduces it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dropout_keeps_the_same_elements_in_every_dtype(dtype):
    """Narrow floats round the keep scores, but never across zero."""
    torch.manual_seed(5)
    reference = keep_mask(torch.Size([50_000]), 0.3, torch.device("cpu"))
    torch.manual_seed(5)
    out = dropout(torch.ones(50_000, dtype=dtype), 0.3, training=True)
    assert out.dtype == dtype
    assert torch.equal(out.ne(0), reference)
    torch.testing.assert_close(out[reference], torch.full_like(out[reference], 1 / 0.7), atol=0, rtol=0.01)


def test_dropout_gradient_flows_through_the_kept_elements_only():
    torch.manual_seed(2)
    x = torch.randn(3000, dtype=torch.float64, requires_grad=True)
    out = dropout(x, 0.4, training=True)
    g = torch.randn(3000, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out, x, g)
    kept = out.ne(0)
    torch.testing.assert_close(grad, torch.where(kept, g / 0.6, 0.0))


def test_dropout_scales_the_kept_elements_and_keeps_the_expectation():
    torch.manual_seed(1)
    x = torch.rand(64, 1000) + 0.5
    out = dropout(x, 0.25, training=True)
    kept = out.ne(0)
    torch.testing.assert_close(out[kept], x[kept] / 0.75)
    assert abs(out.mean().item() / x.mean().item() - 1) < 0.01
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0, training=True) is x
    assert dropout(x, 1.0, training=True).eq(0).all()  # p = 1 drops everything (F.dropout's rule)


@pytest.mark.parametrize("p", [0.1, 0.4])
def test_dropout_module_is_nn_dropout_with_the_cpu_masks(p):
    """Dropout (what the CPU training scope swaps in for nn.Dropout) is an nn.Dropout of the same rate whose
    training forward is `dropout`'s, mask for mask, and whose evaluation forward is the identity."""
    module = Dropout(p)
    assert isinstance(module, nn.Dropout) and module.p == p
    x = torch.randn(200, 300)
    torch.manual_seed(9)
    out = module.train()(x)
    torch.manual_seed(9)
    assert torch.equal(out, dropout(x, p, training=True))
    rate = out.eq(0).float().mean().item()
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / x.numel())
    torch.testing.assert_close(out[out.ne(0)], x[out.ne(0)] / (1 - p))
    assert module.eval()(x) is x


def test_feed_forward_drops_its_hidden_layer_with_the_module_s_dropout():
    """Plain, FeedForward is W2 F.dropout(relu(W1 x)); inside the CPU training scope its nn.Dropout is the CPU
    room's, so the same function with `dropout`'s masks."""
    from attnkit.cpu import training_scope
    from attnkit.nn.layers import FeedForward

    torch.manual_seed(0)
    ffn = FeedForward(8, 32, dropout=0.3).double().train()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    for drop_hidden, scope in ((F.dropout, contextlib.nullcontext()),
                               (dropout, training_scope(torch.device("cpu")).applied(ffn))):
        with scope:
            torch.manual_seed(3)
            out = ffn(x)
        torch.manual_seed(3)  # the same mask: dropout, then W2
        torch.testing.assert_close(out, ffn.w2(drop_hidden(torch.relu(ffn.w1(x)), 0.3, training=True)))
        assert out.ne(ffn.eval()(x)).any()  # dropout really acted
        ffn.train()


# --- key/value cache ------------------------------------------------------------------------------
def test_kv_cache_grows_in_place_and_equals_concatenation():
    torch.manual_seed(0)
    steps = [torch.randn(2, 3, 1, 4) for _ in range(40)]  # past the first buffer's 33 positions
    cache, kept = KVCache(torch.empty(2, 3, 0, 4), torch.empty(2, 3, 0, 4)), []
    for i, step in enumerate(steps):
        cache = cache.append(step, -step, spare=32)
        kept.append(cache)
        expected = torch.cat(steps[: i + 1], dim=2)
        torch.testing.assert_close(cache.k, expected)
        torch.testing.assert_close(cache.v, -expected)
    assert kept[5].k.data_ptr() == kept[20].k.data_ptr()  # one buffer, no copy per step
    # time-major: the filled positions are one block without gaps, whatever room is left after them
    assert kept[20].k.permute(2, 0, 1, 3).is_contiguous() and kept[20].room.k.size(0) > 21
    torch.testing.assert_close(kept[9].k, torch.cat(steps[:10], dim=2))  # older caches stay valid
    plain = KVCache(steps[0], steps[0]).append(steps[1], steps[1])  # no spare room: contiguous concatenation
    assert plain.room is None and plain.k.is_contiguous()
    torch.testing.assert_close(plain.k, torch.cat(steps[:2], dim=2))


def test_kv_cache_branches_and_reorders_without_overwriting():
    torch.manual_seed(1)
    base = KVCache(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)).append(torch.randn(3, 2, 1, 4),
                                                                            torch.randn(3, 2, 1, 4), spare=8)
    snapshot = base.k.clone()
    a, b = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    left, right = base.append(a, a, spare=8), base.append(b, b, spare=8)  # two branches from one cache
    torch.testing.assert_close(left.k[:, :, -1:], a)
    torch.testing.assert_close(right.k[:, :, -1:], b)
    torch.testing.assert_close(base.k, snapshot)
    rows = torch.tensor([2, 0, 0])
    moved = left.reorder(rows)
    torch.testing.assert_close(moved.k, left.k[rows])
    grown = moved.append(b[:3], b[:3], spare=8)
    torch.testing.assert_close(grown.k, torch.cat([left.k[rows], b[:3]], dim=2))
    torch.testing.assert_close(left.k[:, :, -1:], a)  # the reordered copy did not write into left's buffer


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS, ids=lambda f: f.__name__)
def test_sdpa_and_explicit_paths_agree_on_long_inputs(fn):
    """T * S above the CPU explicit path's limit: the output comes from SDPA unless weights are asked for."""
    torch.manual_seed(2)
    mha = attention(16, 4, fn)
    x, mem = torch.randn(2, 70, 16), torch.randn(2, 90, 16)
    pad = torch.zeros(2, 90, dtype=torch.bool)
    pad[0, 80:] = True
    fused, none = mha(x, mem, mask=key_padding_to_attn_mask(pad))
    explicit, weights = mha(x, mem, mask=key_padding_to_attn_mask(pad), need_weights=True)
    assert none is None and weights.shape == (2, 4, 70, 90)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    causal, _ = mha(x, causal=True)
    torch.testing.assert_close(causal, explicit_mha(mha, x, x, causal_mask(70)[None].expand(2, 70, 70)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_query_path_equals_explicit_with_padding(dtype, fn):
    """A decoding step's single query (cpu_attention: batched products on CPU) against the loop reference."""
    torch.manual_seed(3)
    mha = attention(16, 4, fn)
    x, mem = torch.randn(3, 1, 16), torch.randn(3, 6, 16)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 2:] = True
    pad[2, 5:] = True
    with torch.no_grad():
        out, weights = mha.to(dtype)(x.to(dtype), mem.to(dtype), mask=key_padding_to_attn_mask(pad))
    assert weights is None and out.dtype == dtype
    ref = explicit_mha(mha.float(), x, mem, (~pad)[:, None, :])
    tol = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
