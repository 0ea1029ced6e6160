"""Prepacked linear maps (attnkit.cpu.packed) and padded rows (attnkit.cpu.rows) against nn.Linear and F.linear."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.cpu import for_inference
from attnkit.cpu.modules import sharing
from attnkit.cpu.packed import (
    PackedFeedForward,
    PackedLinear,
    PackedLogits,
    PackedStackedLinear,
    PackedWeights,
    packable,
    packed_linear,
)
from attnkit.cpu.rows import RowRule, RowsLinear, RowsStackedLinear, padded_linear
from attnkit.nn import FeedForward, StackedLinear
from attnkit.nn.outputs import Logits
from conftest import linear_rows

needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built in")
ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "swish": F.silu}


def packed(lin: nn.Linear, cache: PackedWeights | None = None) -> PackedLinear:
    """A PackedLinear holding lin's own Parameters, as for_inference swaps one in."""
    return sharing(PackedLinear, lin, cache=PackedWeights() if cache is None else cache)


@needs_mkldnn
@pytest.mark.parametrize("rows", [None, (3, 11)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16), (0, 16)])
def test_packed_linear_equals_f_linear(rows, activation, shape):
    torch.manual_seed(0)
    lin, cache = nn.Linear(16, 24), PackedWeights()
    x = torch.randn(shape)
    w, b = (lin.weight, lin.bias) if rows is None else (lin.weight[rows[0] : rows[1]], lin.bias[rows[0] : rows[1]])
    with torch.no_grad():
        assert packable(x, lin.weight, cache)
        out = packed_linear(cache, x, lin.weight, lin.bias, rows=rows, activation=activation)
        ref = ACTIVATIONS[activation](F.linear(x, w, b))
    assert out.shape == ref.shape
    assert len(cache) == 1  # the packed path ran
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@needs_mkldnn
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16)])
def test_packed_linear_module_equals_nn_linear(shape):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)
    fast, x = packed(lin), torch.randn(shape)
    with torch.no_grad():
        out = fast(x)
        assert len(fast.cache) == 1
        torch.testing.assert_close(out, lin(x), atol=1e-5, rtol=1e-5)
    assert fast.weight is lin.weight and fast.bias is lin.bias
    assert fast.state_dict().keys() == lin.state_dict().keys()


@needs_mkldnn
def test_packed_stacked_linear_and_its_parts_equal_stacked_linear():
    """The whole stacked product and each part's rows (queries alone, keys and values together) through packed
    copies, against StackedLinear's F.linear on weight slices."""
    torch.manual_seed(7)
    stacked, x = StackedLinear(16, 48), torch.randn(2, 5, 16)
    fast = sharing(PackedStackedLinear, stacked, cache=PackedWeights())
    with torch.no_grad():
        assert packable(x, fast.weight, fast.cache)
        torch.testing.assert_close(fast(x), stacked(x), atol=1e-5, rtol=1e-5)
        for start, stop in ((0, 16), (16, 48), (5, 11)):
            torch.testing.assert_close(fast.part(x, start, stop), stacked.part(x, start, stop), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(stacked.part(x, start, stop),
                                       F.linear(x, stacked.weight[start:stop], stacked.bias[start:stop]))
    assert len(fast.cache) == 1  # one Parameter...
    assert len(fast.cache._entries[id(stacked.weight)][1]) == 4  # ...with a packed copy of all rows and each part's
    x.requires_grad_()
    fast.part(x, 0, 16).sum().backward()  # with gradients: StackedLinear's own part
    ref_x = x.detach().clone().requires_grad_()
    F.linear(ref_x, stacked.weight[:16], stacked.bias[:16]).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)


@needs_mkldnn
@pytest.mark.parametrize("bias", [False, True])
def test_packed_logits_and_their_in_place_log_softmax_equal_logits(bias):
    """PackedLogits' products equal Logits' F.linear, and its in-place normalisation equals log_softmax bit for bit
    (the output weight is passed in, as a tied embedding's is)."""
    torch.manual_seed(8)
    table = nn.Parameter(torch.randn(50, 16))  # (V, D)
    b = nn.Parameter(torch.randn(50)) if bias else None
    plain, h = Logits(), torch.randn(6, 16)  # (N, D)
    fast = sharing(PackedLogits, plain, cache=PackedWeights())
    with torch.no_grad():
        logits = fast(h, table, b)  # (N, V)
        torch.testing.assert_close(logits, plain(h, table, b), atol=1e-5, rtol=1e-5)
        logp = fast.log_probs(h, table, b)
        assert len(fast.cache) == 1
        assert torch.equal(logp, logits.log_softmax(-1))  # in place, the same numbers as log_softmax's
        torch.testing.assert_close(logp, plain.log_probs(h, table, b), atol=1e-5, rtol=1e-5)
    assert fast.log_probs(h, table, b).requires_grad  # with gradients: log_softmax, not in place


@needs_mkldnn
def test_packed_weights_follow_every_change_of_the_weight_the_version_counter_sees():
    torch.manual_seed(1)
    lin, x = nn.Linear(8, 6), torch.randn(4, 8)
    fast = packed(lin)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    with torch.no_grad():
        before = fast(x)
    lin(x).square().sum().backward()
    opt.step()  # in place: the version counter moves
    with torch.no_grad():
        after = fast(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias))
        lin.load_state_dict({"weight": torch.ones(6, 8), "bias": torch.zeros(6)})
        torch.testing.assert_close(fast(x), x.sum(1, keepdim=True).expand(4, 6))
        lin.weight.data = torch.full((6, 8), 2.0)  # new storage
        torch.testing.assert_close(fast(x), 2 * x.sum(1, keepdim=True).expand(4, 6))


@needs_mkldnn
def test_a_fused_optimizer_step_never_meets_an_old_packed_copy():
    """Fused AdamW updates the weights without moving their version counter: a cache kept across the step would
    serve the old weights, so caches live no longer than fixed weights. The model itself, and every inference copy
    made after the step (a fresh cache), see the new ones."""
    torch.manual_seed(5)
    model, x = nn.Sequential(nn.Linear(8, 6)), torch.randn(4, 8)
    lin = model[0]
    opt = torch.optim.AdamW(lin.parameters(), lr=0.5, fused=True)
    with torch.no_grad():
        before = for_inference(model)(x)
    version = lin.weight._version
    lin(x).square().sum().backward()
    opt.step()
    assert lin.weight._version == version  # the reason caches must not outlive fixed weights
    reference = F.linear(x, lin.weight, lin.bias)
    assert not torch.allclose(before, reference)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), reference)  # nn.Linear: F.linear
        fast = for_inference(model)
        assert isinstance(fast[0], PackedLinear)
        torch.testing.assert_close(fast(x), reference)


@needs_mkldnn
def test_packed_copies_go_with_their_weights_and_their_cache():
    lin, cache = nn.Linear(8, 6), PackedWeights()
    fast, other = packed(lin, cache), packed(nn.Linear(8, 6), cache)
    with torch.no_grad():
        fast(torch.randn(2, 8))
        other(torch.randn(2, 8))
        lin(torch.randn(2, 8))  # the module the copy was made from reads no cache
    assert len(cache) == 2
    assert type(lin) is nn.Linear and "cache" not in lin.__dict__
    del lin, fast
    gc.collect()
    assert len(cache) == 1  # no copy outlives its Parameter
    assert cache._entries[id(other.weight)][0]() is other.weight


def test_packed_linear_records_gradients_and_leaves_autocast_alone():
    torch.manual_seed(2)
    lin, x = nn.Linear(8, 6), torch.randn(4, 8, requires_grad=True)
    fast = packed(lin)
    assert not packable(x, lin.weight, fast.cache)  # gradients on: F.linear
    F.relu(fast(x)).sum().backward()
    ref_x = x.detach().clone().requires_grad_()
    F.relu(F.linear(ref_x, lin.weight, lin.bias)).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    assert len(fast.cache) == 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not packable(x, lin.weight, fast.cache)
        assert fast(x).dtype == torch.bfloat16  # autocast's cast, not the packed float32 product
    with torch.no_grad():
        assert not packable(x.double(), lin.weight, fast.cache)  # dtypes differ: F.linear raises as usual
        assert not packable(x, lin.weight * 1.0, fast.cache)  # not a Parameter: nothing to cache
    assert len(fast.cache) == 0


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_feed_forward_is_the_same_function_in_training_and_inference(activation):
    """for_inference's PackedFeedForward (the activation fused into its first product) against the plain
    FeedForward it was made from, with and without gradients."""
    torch.manual_seed(3)
    ffn, x = FeedForward(8, 32, activation=activation).eval(), torch.randn(2, 3, 8)
    fast = for_inference(nn.Sequential(ffn))[0]
    assert type(fast) is PackedFeedForward and type(fast.w1) is PackedLinear and type(ffn.w1) is nn.Linear
    with torch.no_grad():
        inference = fast(x)
    if torch.backends.mkldnn.is_available():
        assert len(fast.w1.cache) == 2  # both products packed
    torch.testing.assert_close(ffn(x), inference, atol=1e-5, rtol=1e-5)
    act = ACTIVATIONS[activation]
    ref = F.linear(act(F.linear(x, ffn.w1.weight, ffn.w1.bias)), ffn.w2.weight, ffn.w2.bias)
    torch.testing.assert_close(inference, ref, atol=1e-5, rtol=1e-5)
    training = fast(x)  # gradients on: FeedForward's own forward
    assert training.requires_grad
    torch.testing.assert_close(training, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                    reason="no bfloat16 oneDNN kernels on this CPU")
def test_packed_linear_in_bfloat16():
    torch.manual_seed(4)
    lin = nn.Linear(32, 16).to(torch.bfloat16)
    fast, x = packed(lin), torch.randn(6, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        assert packable(x, lin.weight, fast.cache)
        out = fast(x)
    assert out.dtype == torch.bfloat16 and len(fast.cache) == 1
    torch.testing.assert_close(out.float(), F.linear(x.float(), lin.weight.float(), lin.bias.float()),
                               atol=0.05, rtol=0.02)


# --- rows: products on a stable row count in training (oneDNN builds a kernel per product shape) -------------------
def rows_linear(lin: nn.Linear, multiple: int) -> RowsLinear:
    return sharing(RowsLinear, lin, rule=RowRule(multiple))


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("shape, multiple", [((2, 7, 16), 8), ((5, 16), 32), ((3, 4, 16), 12), ((0, 16), 8)])
def test_rows_linear_pads_the_products_and_gives_f_linear_s_values_and_gradients(monkeypatch, autocast, shape,
                                                                                 multiple):
    torch.manual_seed(6)
    lin, x = nn.Linear(16, 24), torch.randn(shape)
    outs = {}
    for padded in (False, True):
        lin.zero_grad()
        xi = x.clone().requires_grad_()
        seen = linear_rows(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = F.relu(rows_linear(lin, multiple)(xi) if padded else lin(xi))
        y.float().square().sum().backward()
        outs[padded] = y, xi.grad, lin.weight.grad.clone(), lin.bias.grad.clone()
        n = x.numel() // x.size(-1)
        assert seen == [-(-n // multiple) * multiple if padded else n]  # rounded up to the multiple, or as they were
        monkeypatch.undo()
    assert outs[True][0].shape == (*shape[:-1], 24)
    tolerance = dict(atol=2e-2, rtol=2e-2) if autocast else {}
    for plain, padded in zip(outs[False], outs[True]):
        torch.testing.assert_close(padded, plain, **tolerance)


def test_rows_stacked_linear_pads_its_parts_too(monkeypatch):
    torch.manual_seed(9)
    stacked, x = StackedLinear(16, 48), torch.randn(2, 5, 16, requires_grad=True)
    padded = sharing(RowsStackedLinear, stacked, rule=RowRule(16))
    seen = linear_rows(monkeypatch)
    whole, part = padded(x), padded.part(x, 16, 48)
    assert seen == [16, 16]
    monkeypatch.undo()
    torch.testing.assert_close(whole, stacked(x))
    torch.testing.assert_close(part, stacked.part(x, 16, 48))
    (whole.square().sum() + part.sum()).backward()
    grads = x.grad.clone(), stacked.weight.grad.clone(), stacked.bias.grad.clone()
    x.grad = None
    stacked.zero_grad()
    (stacked(x).square().sum() + stacked.part(x, 16, 48).sum()).backward()
    for got, want in zip(grads, (x.grad, stacked.weight.grad, stacked.bias.grad)):
        torch.testing.assert_close(got, want)


def test_one_row_rule_steers_every_module_that_shares_it(monkeypatch):
    """The training scope sets its rule's multiple per precision; every RowsLinear made with the rule follows, and
    0 runs the rows as they are."""
    rule, x = RowRule(8), torch.randn(5, 4)
    first, second = (sharing(RowsLinear, nn.Linear(4, 3), rule=rule) for _ in range(2))
    seen = linear_rows(monkeypatch)
    first(x)
    rule.multiple = 0
    second(x)
    rule.multiple = 8
    second(x)
    padded_linear(x, first.weight, None, 0)
    assert seen == [8, 5, 8, 5]


ONEDNN_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
BUILDS = """
import sys, torch, torch.nn.functional as F
from attnkit.cpu.rows import padded_linear
w = torch.randn(64, 32, requires_grad=True)
for n in (200, 203, 190, 256, 211):  # a new row count each step, as token-budget batches give
    x = torch.randn(n, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = padded_linear(x, w, None, int(sys.argv[1]))
    y.float().sum().backward()
"""


@pytest.mark.skipif(not ONEDNN_BF16, reason="no bfloat16 oneDNN kernels on this CPU")
def test_padded_rows_let_onednn_build_each_product_s_kernel_once():
    """What padding is for: five steps of new row counts build a forward, an input-gradient and a weight-gradient
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
