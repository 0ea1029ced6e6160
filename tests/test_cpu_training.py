"""The CPU training scope (attnkit.cpu.training_scope) and its attention functions against plain PyTorch: the modules
it swaps in and puts back, training through it against training without it, `cpu_attention` and
`cpu_training_attention` path by path against `eager_attention` / `sdpa_attention`, and the row multiple that
`scope.precision` sets."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

import attnkit.cpu.training as cpu_training
from attnkit.config import RNNLMConfig
from attnkit.cpu import training_scope
from attnkit.cpu.attention import cpu_attention, cpu_training_attention
from attnkit.cpu.dropout import Dropout
from attnkit.cpu.lstm import LayerwiseLSTM
from attnkit.cpu.rows import ADAPTIVE_ROWS, RowsLinear, RowsStackedLinear
from attnkit.data import PAD_ID
from attnkit.data.batching import Batch
from attnkit.models import Transformer, build_model
from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import MultiHeadAttention, StackedLinear, eager_attention, sdpa_attention
from attnkit.nn.masks import causal_mask
from attnkit.train.trainer import model_losses
from conftest import linear_rows, tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


def builds_costly(monkeypatch, costly: bool) -> None:
    """Where the scope looks up whether bf16 kernel builds are costly (an AMX CPU): `costly` for bf16, else False."""
    monkeypatch.setattr(cpu_training, "kernel_builds_costly", lambda device, dtype: costly and dtype == "bfloat16")


def transformer(dropout: float = 0.1, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_model_config(dropout=dropout))


def lstm_lm() -> nn.Module:
    torch.manual_seed(0)
    return build_model("lstm-lm", RNNLMConfig(vocab_size=30, d_model=16, n_layers=2, dropout=0.2, cutoffs=[10, 20],
                                              div_val=2))


def attention_functions(model: nn.Module) -> dict[str, object]:
    """Each attention module's own choice of function (None: the class default)."""
    return {name: m.__dict__.get("attention_function") for name, m in model.named_modules()
            if isinstance(m, MultiHeadAttention)}


# --- (1) what the scope swaps in, and that it all comes back ----------------------------------------------------------
@pytest.mark.parametrize("costly", [False, True], ids=["bf16-builds-cheap", "bf16-builds-costly"])
@pytest.mark.parametrize("fail", [False, True], ids=["leaves", "raises"])
def test_the_scope_swaps_a_transformers_modules_and_puts_the_very_same_ones_back(costly, fail, monkeypatch):
    builds_costly(monkeypatch, costly)
    model = transformer()
    model.decoder[0].self_attn.attention_function = eager_attention  # a choice of the caller's, kept
    before = dict(model.named_modules())
    params = dict(model.named_parameters())
    chosen = attention_functions(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert any(type(m) is nn.Dropout for m in before.values())

    class Stop(Exception):
        pass

    with (pytest.raises(Stop) if fail else contextlib.nullcontext(),
          training_scope(CPU, max_tokens=64).applied(model) as inside):
        assert inside is model
        now = dict(model.named_modules())
        assert list(now) == list(before)  # the same tree, module for module
        for name, old in before.items():
            new = now[name]
            if type(old) is nn.Dropout:
                assert type(new) is Dropout and new.p == old.p and new.training == old.training
            elif costly and type(old) is StackedLinear:
                assert type(new) is RowsStackedLinear
            elif costly and type(old) is nn.Linear:
                assert type(new) is RowsLinear
            else:  # the rest, the containers of swapped modules included, stay the same objects
                assert new is old
        expected = cpu_training_attention if costly else cpu_attention
        assert all(m.attention_function is expected for m in now.values() if isinstance(m, MultiHeadAttention))
        assert all(p is params[name] for name, p in model.named_parameters())  # the model's own Parameters
        assert list(model.state_dict()) == list(state)
        if fail:
            raise Stop
    after = dict(model.named_modules())
    assert list(after) == list(before) and all(after[name] is m for name, m in before.items())
    assert attention_functions(model) == chosen
    assert model.decoder[0].self_attn.attention_function is eager_attention
    assert model.encoder[0].self_attn.attention_function is sdpa_attention  # the class default again
    assert all(p is params[name] for name, p in model.named_parameters())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("fail", [False, True], ids=["leaves", "raises"])
def test_the_scope_runs_an_lstm_lms_lstm_a_layer_at_a_time_and_buckets_its_adaptive_rows(fail):
    model = lstm_lm().train()
    lstm, params = model.rnn, dict(model.named_parameters())
    dropouts = {name: m for name, m in model.named_modules() if type(m) is nn.Dropout}
    clustered = [m for m in model.modules() if isinstance(m, (AdaptiveEmbedding, AdaptiveLogSoftmax))]
    assert type(lstm) is nn.LSTM and dropouts and len(clustered) == 2
    assert all(m.row_multiple == 0 for m in clustered)
    try:
        with training_scope(CPU, max_tokens=64).applied(model):
            assert type(model.rnn) is LayerwiseLSTM and model.rnn.dropout == lstm.dropout
            assert all(getattr(model.rnn, name) is p for name, p in lstm.named_parameters())
            modules = dict(model.named_modules())
            assert all(type(modules[name]) is Dropout and modules[name].p == m.p for name, m in dropouts.items())
            assert all(m.row_multiple == ADAPTIVE_ROWS for m in clustered)
            assert all(p is params[name] for name, p in model.named_parameters())
            x = torch.randint(30, (3, 8))
            nll, _ = model(x[:, :-1], targets=x[:, 1:])
            nll.mean().backward()  # trains: every Parameter of the model's own gets its gradient
            assert all(p.grad is not None for p in params.values())
            if fail:
                raise RuntimeError("stop")
    except RuntimeError:
        assert fail
    assert model.rnn is lstm
    modules = dict(model.named_modules())
    assert all(modules[name] is m for name, m in dropouts.items())
    assert all(m.row_multiple == 0 for m in clustered)
    assert all(p is params[name] for name, p in model.named_parameters())


def test_off_the_cpu_the_scope_swaps_nothing():
    model = transformer()
    before = dict(model.named_modules())
    scope = training_scope(torch.device("cuda"), max_tokens=64)
    with scope.applied(model), scope.precision("bfloat16"):
        assert all(dict(model.named_modules())[name] is m for name, m in before.items())
        assert attention_functions(model) == {name: None for name in attention_functions(model)}
        assert scope.row_multiple == 0


# --- (2) training through the scope is training without it ------------------------------------------------------------
def batches(n: int) -> list[Batch]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        b, s, t = 3, 6 + i, 5 + 2 * i  # new lengths each step, as token-budget batches give
        src, tgt = torch.randint(4, 40, (b, s), generator=g), torch.randint(4, 40, (b, t + 1), generator=g)
        src[1, s - 2 :], tgt[2, t - 1 :] = PAD_ID, PAD_ID  # padding
        out.append(Batch(src, tgt[:, :-1], tgt[:, 1:], torch.arange(b)))
    return out


def train(model: Transformer, scope, steps: list[Batch]) -> list[float]:
    # SGD, not Adam: the key rows' bias gets a gradient of rounding noise only (softmax ignores a constant), which
    # Adam's normalisation would turn into steps of full size, differing with every rounding
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with scope.applied(model) if scope else contextlib.nullcontext():
        for batch in steps:
            optimiser.zero_grad()
            # float32 values, and bf16's row multiple
            with scope.precision("bfloat16") if scope else contextlib.nullcontext():
                loss, _ = model_losses(model, batch, 0.1, scope.row_multiple if scope else 0)
                loss.backward()
            optimiser.step()
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("costly", [False, True], ids=["bf16-builds-cheap", "bf16-builds-costly"])
def test_a_few_steps_through_the_scope_equal_plain_training(costly, monkeypatch):
    """Dropout 0, float32: the same losses and Parameters after four SGD steps, whether the products run on the rows
    as they come or padded to the token budget (costly builds: RowsLinear, and the loss's chunks)."""
    builds_costly(monkeypatch, costly)
    plain = transformer(dropout=0.0).train()
    scoped = copy.deepcopy(plain)
    steps = batches(4)
    rows = linear_rows(monkeypatch, training_only=True)
    want = train(plain, None, steps)
    rows.clear()
    got = train(scoped, training_scope(CPU, max_tokens=48), steps)
    assert all(r % 48 == 0 for r in rows) == costly  # padded to the budget only where builds are costly
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(scoped.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
    assert not torch.equal(plain.encoder[0].ffn.w1.weight, transformer(dropout=0.0).encoder[0].ffn.w1.weight)  # trained


# --- (3) the CPU attention functions, path by path, against the plain ones --------------------------------------------
B, H, DH = 2, 3, 8

# (queries, keys): short blocks (written-out products), one query (batched products), long blocks (SDPA)
SHAPES = {"short": (5, 7), "short-self": (6, 6), "one-query": (1, 9), "long": (70, 80), "long-self": (72, 72)}


def module(dropout: float = 0.0, dtype: torch.dtype = torch.float64) -> MultiHeadAttention:
    return MultiHeadAttention(H * DH, H, dropout=dropout).to(dtype)


def qkv(t: int, s: int, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(t * 100 + s)
    return [torch.randn(B, H, n, DH, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            for n in (t, s, s)]


def padding(s: int) -> torch.Tensor:
    keep = torch.ones(B, 1, 1, s, dtype=torch.bool)  # (B, 1, 1, S) True-may-attend
    keep[1, ..., s - 3 :] = False
    return keep


def run(fn, attn: MultiHeadAttention, q, k, v, **kw) -> list[torch.Tensor | None]:
    """The output, weights and the gradients of q, k, v for a fixed upstream gradient."""
    out, weights = fn(attn, q, k, v, **kw)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    return [out, weights, *grads]


def same(got: list, want: list, **tol) -> None:
    """Outputs, weights (where both give them: a function may return them unasked, `attend` drops them) and grads."""
    for a, b in zip(got, want, strict=True):
        if a is not None and b is not None:
            torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("fn", [cpu_attention, cpu_training_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "padding-causal"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_cpu_attention_functions_equal_eager_and_sdpa(fn, shape, masking, need_weights, training):
    t, s = SHAPES[shape]
    attn = module().train(training)
    q, k, v = qkv(t, s)
    kw = dict(mask=padding(s) if "padding" in masking else None, causal="causal" in masking,
              need_weights=need_weights)
    got = run(fn, attn, q, k, v, **kw)
    eager = run(eager_attention, attn, q, k, v, **kw)
    sdpa = run(sdpa_attention, attn, q, k, v, **kw)
    if need_weights:
        assert got[1] is not None and got[1].shape == (B, H, t, s)
    same(got, eager, atol=1e-10, rtol=1e-10)
    same(got, sdpa, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fn", [cpu_attention, cpu_training_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", ["short", "long-self"])
def test_cpu_attention_functions_drop_the_weights_as_the_written_out_products_do(fn, shape):
    """Training with dropout on the weights: the written-out products with the module's own dropout, mask for mask
    (the same seed), on short and on long blocks."""
    t, s = SHAPES[shape]
    attn = module(dropout=0.3).train()
    attn.attention_dropout = Dropout(0.3)  # as the training scope swaps it in
    q, k, v = qkv(t, s)
    kw = dict(mask=padding(s), causal=True, need_weights=False)
    torch.manual_seed(11)
    got = run(fn, attn, q, k, v, **kw)
    torch.manual_seed(11)
    want = run(eager_attention, attn, q, k, v, **kw)
    same(got, want, atol=1e-12, rtol=1e-12)
    assert got[0].ne(run(eager_attention, attn.eval(), q, k, v, **kw)[0]).any()  # dropout really acted


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("shape", ["short", "short-self"])
def test_cpu_training_attention_in_bf16_training_equals_the_written_out_products_in_float32(dropout, shape):
    """bf16 training on short blocks: float32 products (attnkit.cpu.float32_attention) of the bf16 values, equal to
    the written-out products in float32 of the same values (dropout: the same keep masks), rounded to bf16 once."""
    t, s = SHAPES[shape]
    attn = module(dropout, torch.bfloat16).train()
    attn.attention_dropout = Dropout(dropout)
    wide = copy.deepcopy(attn).float()
    q, k, v = qkv(t, s, torch.bfloat16)
    kw = dict(mask=padding(s), causal=True, need_weights=False)
    torch.manual_seed(5)
    got = run(cpu_training_attention, attn, q, k, v, **kw)
    torch.manual_seed(5)
    want = run(eager_attention, wide, *(x.detach().float().requires_grad_() for x in (q, k, v)), **kw)
    assert got[0].dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got[2:])
    assert torch.equal(got[0], want[0].to(torch.bfloat16))  # float32 products, one rounding at the end
    same([None if x is None else x.float() for x in got], want, atol=0.02, rtol=0.02)


def test_cpu_attention_on_one_query_equals_sdpa_in_bf16():
    attn = module(dtype=torch.bfloat16).eval()
    q, k, v = (x.detach() for x in qkv(1, 9, torch.bfloat16))
    with torch.no_grad():
        got, _ = cpu_attention(attn, q, k, v, mask=padding(9), causal=False, need_weights=False)
        want, _ = sdpa_attention(attn, q, k, v, mask=padding(9), causal=False, need_weights=False)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=0.02, rtol=0.02)


def test_causal_mask_with_a_prefix_of_keys_is_aligned_at_the_right():
    """A causal block with more keys than queries (the cached prefix): query i sees keys up to i + S - T, on every
    path (the reference spells the mask out)."""
    t, s = 5, 8
    attn = module().eval()
    q, k, v = qkv(t, s)
    want = run(eager_attention, attn, q, k, v, mask=causal_mask(t, s), causal=False, need_weights=False)
    for fn in (cpu_attention, cpu_training_attention, sdpa_attention):
        same(run(fn, attn, q, k, v, mask=None, causal=True, need_weights=False), want, atol=1e-10, rtol=1e-10)


# --- (4) the row multiple a precision sets ----------------------------------------------------------------------------
@pytest.mark.parametrize("costly", [False, True], ids=["bf16-builds-cheap", "bf16-builds-costly"])
def test_precision_sets_the_row_multiple_to_the_budget_only_where_builds_are_costly(costly, monkeypatch):
    builds_costly(monkeypatch, costly)
    scope = training_scope(CPU, max_tokens=40)
    model = transformer(dropout=0.0)
    assert scope.row_multiple == 0
    with scope.applied(model):
        with scope.precision("bfloat16"):
            assert scope.row_multiple == (40 if costly else 0)
            with scope.precision("float32"):
                assert scope.row_multiple == 0
            assert scope.row_multiple == (40 if costly else 0)  # the outer precision's again
            rows = linear_rows(monkeypatch)
            x = torch.randn(3, 7, 16)
            out = model.encoder[0].ffn.w1(x)  # 21 rows
            assert rows == [40 if costly else 21]
            torch.testing.assert_close(out, torch.nn.functional.linear(x, model.encoder[0].ffn.w1.weight,
                                                                       model.encoder[0].ffn.w1.bias))
        assert scope.row_multiple == 0
        with pytest.raises(ValueError), scope.precision("bfloat16"):
            raise ValueError("a failed step")
        assert scope.row_multiple == 0
