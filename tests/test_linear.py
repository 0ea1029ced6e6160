"""Prepacked linear maps (attnkit.nn.linear) against F.linear."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import FeedForward, Linear, linear
from attnkit.nn.linear import PackedWeights, packable, prepacked, stable_rows
from conftest import linear_rows

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built in")
ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu}


@needs_mkldnn
@pytest.mark.parametrize("rows", [None, (3, 11)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16), (0, 16)])
def test_packed_linear_equals_f_linear(rows, activation, shape):
    torch.manual_seed(0)
    lin = Linear(16, 24)
    x = torch.randn(shape)
    w, b = (lin.weight, lin.bias) if rows is None else (lin.weight[rows[0] : rows[1]], lin.bias[rows[0] : rows[1]])
    with torch.no_grad(), prepacked():
        assert packable(x, lin.weight)
        out = linear(x, lin.weight, lin.bias, rows=rows, activation=activation)
        ref = ACTIVATIONS[activation](F.linear(x, w, b))
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@needs_mkldnn
def test_packed_weights_follow_every_change_of_the_weight_the_version_counter_sees():
    torch.manual_seed(1)
    lin, x, cache = Linear(8, 6), torch.randn(4, 8), PackedWeights()
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    with torch.no_grad(), prepacked(cache):
        before = lin(x)
    lin(x).square().sum().backward()
    opt.step()  # in place: the version counter moves
    with torch.no_grad(), prepacked(cache):
        after = lin(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias))
        lin.load_state_dict({"weight": torch.ones(6, 8), "bias": torch.zeros(6)})
        torch.testing.assert_close(lin(x), x.sum(1, keepdim=True).expand(4, 6))
        lin.weight.data = torch.full((6, 8), 2.0)  # new storage
        torch.testing.assert_close(lin(x), 2 * x.sum(1, keepdim=True).expand(4, 6))


@needs_mkldnn
def test_a_fused_optimizer_step_never_meets_an_old_packed_copy():
    """Fused AdamW updates the weights without moving their version counter: a cache kept across the step
    would serve the old weights. Inference outside a scope, and every new scope, sees the new ones."""
    torch.manual_seed(5)
    lin, x = Linear(8, 6), torch.randn(4, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.5, fused=True)
    with torch.no_grad(), prepacked():
        lin(x)
    version = lin.weight._version
    lin(x).square().sum().backward()
    opt.step()
    assert lin.weight._version == version  # the reason caches must not outlive fixed weights
    reference = F.linear(x, lin.weight, lin.bias)
    with torch.no_grad():
        assert not packable(x, lin.weight)  # no scope: F.linear
        torch.testing.assert_close(lin(x), reference)
        with prepacked():
            torch.testing.assert_close(lin(x), reference)


@needs_mkldnn
def test_packed_copies_go_with_their_weights_and_their_scope():
    lin, cache = Linear(8, 6), PackedWeights()
    with torch.no_grad(), prepacked(cache) as inner:
        assert inner is cache
        with prepacked() as nested:
            assert nested is cache  # an open scope is reused
            lin(torch.randn(2, 8))
    assert len(cache) == 1
    del lin
    gc.collect()
    assert len(cache) == 0  # no copy outlives its Parameter
    with torch.no_grad():
        assert not packable(torch.randn(2, 8), Linear(8, 6).weight)  # the scope has ended


def test_linear_records_gradients_and_leaves_autocast_alone():
    torch.manual_seed(2)
    lin, x = Linear(8, 6), torch.randn(4, 8, requires_grad=True)
    assert not packable(x, lin.weight)  # gradients on: F.linear
    linear(x, lin.weight, lin.bias, activation="relu").sum().backward()
    ref_x = x.detach().clone().requires_grad_()
    F.relu(F.linear(ref_x, lin.weight, lin.bias)).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not packable(x, lin.weight)
        assert lin(x).dtype == torch.bfloat16  # autocast's cast, not the packed float32 product
    with torch.no_grad(), prepacked():
        assert not packable(x.double(), lin.weight)  # dtypes differ: F.linear raises as usual
        assert not packable(x, lin.weight * 1.0)  # not a Parameter: nothing to cache


def test_feed_forward_is_the_same_function_in_training_and_inference():
    torch.manual_seed(3)
    ffn, x = FeedForward(8, 32, activation="gelu").eval(), torch.randn(2, 3, 8)
    with torch.no_grad(), prepacked():
        inference = ffn(x)
    torch.testing.assert_close(ffn(x), inference, atol=1e-5, rtol=1e-5)
    ref = F.linear(F.gelu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), ffn.w2.weight, ffn.w2.bias)
    torch.testing.assert_close(inference, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                    reason="no bfloat16 oneDNN kernels on this CPU")
def test_packed_linear_in_bfloat16():
    torch.manual_seed(4)
    lin = Linear(32, 16).to(torch.bfloat16)
    x = torch.randn(6, 32, dtype=torch.bfloat16)
    with torch.no_grad(), prepacked():
        assert packable(x, lin.weight)
        out = lin(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), lin.weight.float(), lin.bias.float()),
                               atol=0.05, rtol=0.02)


# --- stable_rows: products on a stable row count in training (oneDNN builds a kernel per product shape) --------------
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("shape, multiple", [((2, 7, 16), 8), ((5, 16), 32), ((3, 4, 16), 12), ((0, 16), 8)])
def test_stable_rows_pads_the_products_and_gives_f_linear_s_values_and_gradients(monkeypatch, autocast, shape,
                                                                                  multiple):
    torch.manual_seed(6)
    lin, x = Linear(16, 24), torch.randn(shape)
    outs = {}
    for scoped in (False, True):
        lin.zero_grad()
        xi = x.clone().requires_grad_()
        seen = linear_rows(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), stable_rows(multiple if scoped else 0):
            y = linear(xi, lin.weight, lin.bias, activation="relu")
        y.float().square().sum().backward()
        outs[scoped] = y, xi.grad, lin.weight.grad.clone(), lin.bias.grad.clone()
        n = x.numel() // x.size(-1)
        assert seen == [-(-n // multiple) * multiple if scoped else n]  # rounded up to the multiple, or as they were
        monkeypatch.undo()
    assert outs[True][0].shape == (*shape[:-1], 24)
    tolerance = dict(atol=2e-2, rtol=2e-2) if autocast else {}
    for plain, padded in zip(outs[False], outs[True]):
        torch.testing.assert_close(padded, plain, **tolerance)


def test_stable_rows_ends_with_its_scope_and_nests(monkeypatch):
    lin, x = Linear(4, 3), torch.randn(5, 4)
    seen = linear_rows(monkeypatch)
    with stable_rows(8):
        linear(x, lin.weight)
        with stable_rows(0):
            linear(x, lin.weight)
        linear(x, lin.weight)
    linear(x, lin.weight)
    assert seen == [8, 5, 8, 5]


ONEDNN_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
BUILDS = """
import sys, torch, torch.nn.functional as F
from attnkit.nn.linear import linear, stable_rows
w = torch.randn(64, 32, requires_grad=True)
with stable_rows(int(sys.argv[1])):
    for n in (200, 203, 190, 256, 211):  # a new row count each step, as token-budget batches give
        x = torch.randn(n, 32, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x, w)
        y.float().sum().backward()
"""


@pytest.mark.skipif(not ONEDNN_BF16, reason="no bfloat16 oneDNN kernels on this CPU")
def test_stable_rows_lets_onednn_build_each_product_s_kernel_once():
    """What the scope is for: five steps of new row counts build a forward, an input-gradient and a weight-gradient
    kernel each without it (15), and the three once with it (ONEDNN_VERBOSE counts the builds)."""
    import os
    import subprocess
    import sys

    def builds(multiple: int) -> int:
        env = {**os.environ, "ONEDNN_VERBOSE": "profile_create", "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", BUILDS, str(multiple)], env=env, capture_output=True, text=True,
                             check=True).stdout
        return sum(",create:cache_miss," in line and ",matmul," in line for line in out.splitlines())
    assert builds(0) == 15
    assert builds(256) == 3
