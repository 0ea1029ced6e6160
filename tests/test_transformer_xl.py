"""Transformer-XL and the vanilla LM against naive references: relative scores, causality through memory,
stop-gradient memory, segment recurrence vs full context, same_length / clamp_len, stream alignment,
sliding-window evaluation, sampling with memory."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.config import TransformerXLConfig
from attnkit.data.lm import LMStreams
from attnkit.decode.lm import ContextRule, generate
from attnkit.eval.lm import evaluate_segments, evaluate_sliding_window
from attnkit.models import build_model
from attnkit.models.transformer_xl import TransformerXL
from attnkit.nn import sinusoid_table
from attnkit.nn.relative import RelativeMultiHeadAttention, add_rel_shifted, rel_shift

V = 11


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(kind: str = "transformer-xl", **kw):
    base = dict(kind=kind, vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)
    torch.manual_seed(0)
    return build_model(kind, TransformerXLConfig(**{**base, **kw})).double().eval()


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# --- relative attention -------------------------------------------------------------------------
def test_rel_shift_moves_every_row_to_its_distances():
    b, h, t, s = 2, 3, 4, 7
    x = torch.randn(b, h, t, s, dtype=torch.float64)
    shifted = rel_shift(x)
    m = s - t
    for i in range(t):
        for j in range(m + i + 1):  # past and present keys; the future is masked anyway
            assert torch.equal(shifted[:, :, i, j], x[:, :, i, t - 1 - i + j])  # column c holds distance S-1-c


@pytest.mark.parametrize("mem", [0, 5])
def test_relative_attention_equals_explicit_double_loop(mem):
    torch.manual_seed(0)
    d, n_heads, t, b = 12, 3, 4, 2
    attn = RelativeMultiHeadAttention(d, n_heads).double().eval()
    with torch.no_grad():  # non-trivial biases, so a swapped u / v shows
        attn.r_w_bias.normal_()
        attn.r_r_bias.normal_()
    x = torch.randn(b, t, d, dtype=torch.float64)
    memory = torch.randn(b, mem, d, dtype=torch.float64) if mem else None
    s = mem + t
    pos = torch.randn(s, d, dtype=torch.float64)  # row c: the "sinusoid" of distance S-1-c
    mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=mem)
    out, weights, kv = attn(x, memory, attn.position_keys(pos), mask=mask, need_weights=True)

    dh = d // n_heads
    context = x if memory is None else torch.cat([memory, x], 1)
    wq, wk, wv = attn.in_proj.weight.chunk(3, dim=0)
    q = (x @ wq.T).view(b, t, n_heads, dh)
    k = (context @ wk.T).view(b, s, n_heads, dh)
    v = (context @ wv.T).view(b, s, n_heads, dh)
    r = (pos @ attn.pos_proj.weight.T).view(s, n_heads, dh)
    u, vb = attn.r_w_bias, attn.r_r_bias
    scores = torch.full((b, n_heads, t, s), float("-inf"), dtype=torch.float64)
    for i in range(t):
        for j in range(mem + i + 1):
            dist = mem + i - j
            r_ij = r[s - 1 - dist]  # (H, Dh): W_{k,R} R_{i-j}
            scores[:, :, i, j] = (((q[:, i] + u) * k[:, j]).sum(-1) + ((q[:, i] + vb) * r_ij).sum(-1)) / math.sqrt(dh)
    ref_weights = scores.softmax(-1)
    ref_out = torch.einsum("bhts,bshd->bthd", ref_weights, v).reshape(b, t, d) @ attn.out_proj.weight.T
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(out, ref_out)
    assert torch.equal(kv.k, k.transpose(1, 2)) or torch.allclose(kv.k, k.transpose(1, 2))
    # the fused path (no autograd: evaluation) and the cached memory keys/values give the same output
    with torch.no_grad():
        fused, none, _ = attn(x, memory, attn.position_keys(pos), mask=mask)
        assert none is None
        torch.testing.assert_close(fused, ref_out)
        if mem:
            cached = attn.project_kv(memory)
            torch.testing.assert_close(attn(x, None, attn.position_keys(pos), mask=mask, memory_kv=cached)[0], ref_out)


def reference_rel_shift(x: torch.Tensor) -> torch.Tensor:
    """The paper's pad-and-reshape (appendix B), with its copies: the shift the strided view replaces."""
    b, h, t, s = x.shape
    padded = torch.cat([x.new_zeros(b, h, t, 1), x], dim=-1).view(b, h, s + 1, t)
    return padded[:, :, 1:].reshape(b, h, t, s)


@pytest.mark.parametrize("t,s", [(1, 1), (1, 6), (4, 4), (4, 9), (7, 10)])
def test_add_rel_shifted_matches_the_papers_shift_in_values_and_gradients(t, s):
    gen = torch.Generator().manual_seed(t * 100 + s)
    content = torch.randn(2, 3, t, s, dtype=torch.float64, generator=gen, requires_grad=True)
    raw = torch.randn(3, 2, t, s, dtype=torch.float64, generator=gen)  # a permuted layout, as einsum returns
    position = raw.permute(1, 0, 2, 3).requires_grad_()
    keep = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
    upstream = torch.randn(2, 3, t, s, dtype=torch.float64, generator=gen)

    def loss(fn):
        scores = fn(content, position)
        weights = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        return (weights * upstream).sum() + (scores.masked_fill(~keep, 0.0) * upstream).sum()

    ours = loss(add_rel_shifted)
    grads = torch.autograd.grad(ours, (content, position))
    ref = loss(lambda c, p: c + reference_rel_shift(p))
    ref_grads = torch.autograd.grad(ref, (content, position))
    torch.testing.assert_close(ours, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert grads[1].abs().sum() > 0


def test_relative_positions_and_clamp_len():
    model = tiny()
    s, d = 9, 16
    table = sinusoid_table(s, d).double()
    for clamp in (0, 3):
        pos = model.relative_positions(s, clamp, torch.device("cpu"))
        for c in range(s):
            dist = s - 1 - c
            expected = table[min(dist, clamp) if clamp else dist]
            torch.testing.assert_close(pos[c].double(), expected)
    x = tokens(1, 8)
    full = model(x)[0]
    torch.testing.assert_close(model(x, clamp_len=7)[0], full)  # clamp at the longest distance: no change
    assert not torch.allclose(model(x, clamp_len=2)[0], full)


def test_same_length_keeps_mem_len_keys_per_query():
    model = tiny(same_length=True)
    t, mem_len = 5, 3
    _, mems = model(tokens(1, 6, seed=2), mem_len=mem_len)
    _, _, weights = model(tokens(1, t), mems, mem_len=mem_len, need_weights=True)
    for w in weights:  # (1, H, T, S), S = 3 + 5
        for i in range(t):
            for j in range(mem_len + t):
                dist = mem_len + i - j
                visible = 0 <= dist < mem_len
                assert bool((w[0, :, i, j] > 0).all()) == visible, (i, j)
    plain = tiny(same_length=False)
    _, _, weights = plain(tokens(1, t), mems, mem_len=mem_len, need_weights=True)
    assert bool((weights[0][0, :, -1] > 0).all())  # without same_length the last query sees every key


# --- segment recurrence -------------------------------------------------------------------------
@pytest.mark.parametrize("n_layers", [1, 2])
def test_segments_with_enough_memory_equal_the_whole_sequence(n_layers):
    model = tiny(n_layers=n_layers)
    x = tokens(2, 12)
    whole = model(x)[0].log_softmax(-1)
    mems, parts = None, []
    for start in range(0, 12, 4):
        logits, mems = model(x[:, start : start + 4], mems, mem_len=8)
        parts.append(logits.log_softmax(-1))
    torch.testing.assert_close(torch.cat(parts, 1), whole)
    # the evaluator does the same over an ordered stream
    scores = evaluate_segments(model, x[0], tgt_len=4, mem_len=12, batch_size=1)
    expected = -whole[0, :-1].gather(1, x[0, 1:, None]).sum().item()
    assert scores.tokens == 11 and math.isclose(scores.nll, expected, rel_tol=1e-9)
    # too short a memory loses context, so the comparison above is not vacuous
    mems, parts = None, []
    for start in range(0, 12, 4):
        logits, mems = model(x[:, start : start + 4], mems, mem_len=2)
        parts.append(logits.log_softmax(-1))
    assert not torch.allclose(torch.cat(parts, 1), whole)


def test_cached_memory_keys_and_position_keys_equal_recomputing_them():
    """Without autograd the memory carries its keys/values and the position keys are kept: the same log-probs
    as recomputing everything, and a change of the weights is noticed."""
    model = tiny(n_layers=2, norm_first=True)  # pre-LN: the memory is normalised before its projection
    x = tokens(2, 15)

    def segments(mems=None):
        parts = []
        for start in range(0, 15, 5):
            logits, mems = model(x[:, start : start + 5], mems, mem_len=7)
            parts.append(logits)
        return torch.cat(parts, 1), mems

    recomputed, plain = segments()  # autograd on: nothing is cached
    assert plain.kv is None
    with torch.no_grad():
        cached, mems = segments()
        assert mems.kv is not None and mems.kv[0].k.shape == (2, 2, 7, 8)
        torch.testing.assert_close(cached, recomputed)
        with torch.no_grad():
            model.layers[0].attn.in_proj.weight.mul_(1.5)  # in place: the cached keys/values are stale now
            model.layers[1].attn.pos_proj.weight.mul_(0.5)
        after_kv, _ = model(x[:, :5], mems, mem_len=7)
    with torch.enable_grad():
        expected, _ = model(x[:, :5], list(mems), mem_len=7)
    torch.testing.assert_close(after_kv, expected)


def test_the_module_keeps_no_cache_between_calls():
    """The position keys live in the `Memory` a call returns, not on the module: two readers of different lengths
    interleaved on one model each reuse their own (computed once per attention length) and read what recomputing
    everything reads; a call without memory computes them; no module's __dict__ gains an entry in a forward."""
    model = tiny(n_layers=2)
    lengths = []  # the attention lengths S whose position keys were computed
    model.layers[0].attn.pos_proj.register_forward_hook(lambda mod, args, out: lengths.append(args[0].size(0)))
    attributes = {name: set(vars(module)) for name, module in model.named_modules()}
    readers = {"a": (tokens(2, 12, seed=5), 4, 4), "b": (tokens(2, 12, seed=6), 3, 6)}  # x, segment, mem_len

    def read(reuse_keys: bool) -> dict[str, torch.Tensor]:
        mems, parts = {"a": None, "b": None}, {"a": [], "b": []}
        for step in range(4):  # a: S = 4, 8, 8; b: S = 3, 6, 9, 9, interleaved
            for name, (x, t, mem_len) in readers.items():
                if step * t < x.size(1):
                    logits, mems[name] = model(x[:, step * t : (step + 1) * t], mems[name], mem_len=mem_len,
                                               reuse_keys=reuse_keys)
                    parts[name].append(logits)
        return {name: torch.cat(p, 1) for name, p in parts.items()}

    with torch.no_grad():
        cached = read(True)
        assert lengths == [4, 3, 8, 6, 9]  # a's second S = 8 and b's second S = 9 come from their own memories
        recomputed = read(False)
        for name in readers:
            torch.testing.assert_close(cached[name], recomputed[name])
        lengths.clear()
        model(readers["a"][0][:, :4])
        model(readers["a"][0][:, :4])
        assert lengths == [4, 4]  # without a memory passed back, nothing is reused
    assert {name: set(vars(module)) for name, module in model.named_modules()} == attributes


def test_no_position_sees_the_future_even_through_memory():
    model = tiny(n_layers=2)
    first, second = tokens(1, 6, seed=3), tokens(1, 6, seed=4)
    _, mems = model(first, mem_len=6)
    logits, new_mems = model(second, mems, mem_len=8)
    for k in range(6):
        changed = second.clone()
        changed[0, k] = (changed[0, k] + 1) % V
        logits2, new_mems2 = model(changed, mems, mem_len=8)
        torch.testing.assert_close(logits2[:, :k], logits[:, :k])
        assert not torch.allclose(logits2[:, k:], logits[:, k:])
        for m, m2 in zip(new_mems, new_mems2):  # memory positions 0, 1 are the old memory, 2 .. 7 this segment
            torch.testing.assert_close(m2[:, : 2 + k], m[:, : 2 + k])
    # a change in the previous segment reaches every position of the next one through the memory
    changed = first.clone()
    changed[0, -1] = (changed[0, -1] + 1) % V
    _, mems2 = model(changed, mem_len=6)
    assert not torch.allclose(model(second, mems2, mem_len=8)[0][:, 0], logits[:, 0])


def test_no_gradient_flows_into_the_memory():
    model = tiny(tie_output=False).float().train()
    first = torch.arange(0, 5).repeat(2, 2)[:, :8]  # tokens 0 .. 4 only
    second = torch.arange(5, 10).repeat(2, 2)[:, :8]  # tokens 5 .. 9 only
    _, mems = model(first, mem_len=8)
    assert all(not m.requires_grad and m.grad_fn is None for m in mems)
    logits, _ = model(second, mems, mem_len=8)
    logits.logsumexp(-1).sum().backward()
    grad = model.embed.weight.grad
    assert grad[:5].abs().max() == 0  # segment 1's embeddings reach the loss only through the memory
    assert (grad[5:10].abs().sum(-1) > 0).all()


def test_memory_keeps_the_last_mem_len_layer_inputs():
    model = tiny()
    a, b = tokens(2, 5, seed=5), tokens(2, 5, seed=6)
    _, mems = model(a, mem_len=7)
    assert [tuple(m.shape) for m in mems] == [(2, 5, 16)] * 2
    _, mems2 = model(b, mems, mem_len=7)
    assert [tuple(m.shape) for m in mems2] == [(2, 7, 16)] * 2
    torch.testing.assert_close(mems2[0][:, :2], mems[0][:, 3:])  # the oldest positions drop out first
    torch.testing.assert_close(mems2[0][:, 2:], model.embed_tokens(b))  # layer 0's input: the embeddings
    assert model(b, mems, mem_len=0)[1] == []


# --- ordered streams ------------------------------------------------------------------------------
def test_ordered_batches_are_stream_aligned_and_so_is_the_memory():
    n, b, t = 103, 4, 6
    ids = torch.arange(n)
    streams = LMStreams(ids, b, t)
    per_stream = n // b
    assert len(streams) == math.ceil((per_stream - 1) / t)
    seen = []
    for tau, (x, y) in enumerate(streams):
        start = tau * t
        for row in range(b):
            expected = torch.arange(row * per_stream + start, row * per_stream + start + x.size(1))
            assert torch.equal(x[row], expected)
            assert torch.equal(y[row], expected + 1)
        seen.append(x)
    for prev, nxt in zip(seen, seen[1:]):
        assert torch.equal(nxt[:, 0], prev[:, -1] + 1)  # segment tau + 1 of row b continues segment tau of row b
    assert sum(x.numel() for x in seen) == streams.n_tokens

    model = tiny(vocab_size=n)
    stream_ids = torch.randint(n, (n,), generator=torch.Generator().manual_seed(0))
    streams, mems, previous = LMStreams(stream_ids, b, t), None, None
    for x, _ in streams:
        if previous is not None:  # the memory row b holds segment tau of stream b (layer 0: its embeddings)
            torch.testing.assert_close(mems[0], model.embed_tokens(previous))
        _, mems = model(x, mems, mem_len=t)
        previous = x


# --- vanilla LM ---------------------------------------------------------------------------------
def test_vanilla_sliding_window_equals_the_per_token_loop():
    model = tiny("vanilla-lm")
    ids = tokens(30, seed=7)
    window = 8
    scores = evaluate_sliding_window(model, ids, window=window, batch_size=5)
    nll = 0.0
    for p in range(1, ids.numel()):
        context = ids[max(0, p - window) : p]
        nll -= model(context[None])[0][0, -1].log_softmax(-1)[ids[p]].item()
    assert scores.tokens == 29
    assert math.isclose(scores.nll, nll, rel_tol=1e-9)
    capped = evaluate_sliding_window(model, ids, window=window, batch_size=3, max_tokens=12)
    assert capped.tokens == 12


def test_vanilla_is_causal_and_memoryless():
    model = tiny("vanilla-lm")
    x = tokens(1, 9, seed=8)
    logits, mems = model(x)
    assert mems == []
    changed = x.clone()
    changed[0, 5] = (changed[0, 5] + 1) % V
    torch.testing.assert_close(model(changed)[0][:, :5], logits[:, :5])
    assert not torch.allclose(model(changed)[0][:, 5:], logits[:, 5:])


# --- sampling -------------------------------------------------------------------------------------
def test_sampling_with_memory_equals_sampling_with_recomputation():
    model = tiny()
    prompt = tokens(1, 4, seed=9)
    n_new = 10
    fast = generate(model, prompt, n_new, ContextRule(segment=4, memory=32), top_k=5,
                    generator=torch.Generator().manual_seed(3))
    g, context = torch.Generator().manual_seed(3), prompt
    from attnkit.decode.search import filter_logits

    for _ in range(n_new):  # the whole context every step
        logits = model(context)[0][:, -1]
        probs = filter_logits(logits.float(), 5, 1.0).softmax(-1)
        context = torch.cat([context, torch.multinomial(probs, 1, generator=g)], 1)
    assert torch.equal(fast, context[:, 4:])


def test_pre_ln_variant_runs_and_differs():
    post, pre = tiny(), tiny(norm_first=True)
    x = tokens(2, 5)
    assert isinstance(pre, TransformerXL) and isinstance(pre.final_norm, torch.nn.LayerNorm)
    _, mems = pre(x, mem_len=5)
    logits, _ = pre(x, mems, mem_len=5)
    assert logits.shape == (2, 5, V) and torch.isfinite(logits).all()
    assert not torch.allclose(post(x)[0], pre(x)[0])


# --- extended context (the reference's ext_len) ---------------------------------------------------
@pytest.mark.parametrize("ext_len", [0, 2, 5])
def test_extended_context_batches_are_the_reference_iterators(ext_len):
    """LMOrderedIterator.get_batch: data[i - ext_len : i + T] as input, data[i + 1 : i + 1 + T] as target."""
    n, b, t = 103, 3, 4
    streams = LMStreams(torch.arange(n), b, t, ext_len)
    data = torch.arange(n // b * b).view(b, -1)
    for tau, (x, y) in enumerate(streams):
        i = tau * t
        seq_len = min(t, data.size(1) - 1 - i)
        assert torch.equal(x, data[:, max(0, i - ext_len) : i + seq_len])
        assert torch.equal(y, data[:, i + 1 : i + 1 + seq_len])
        assert torch.equal(x[:, -y.size(1) :] + 1, y)  # the last T inputs are the ones predicted


@pytest.mark.parametrize("ext_len,mem_len", [(2, 5), (3, 2), (4, 0)])
def test_extended_context_memory_ends_where_the_next_input_begins(ext_len, mem_len):
    """After an input ending (exclusive) at position e, the memory holds positions [e - E - M, e - E): the M tokens
    right before the next input, which starts at e - E. Layer 0's memory is the embeddings, so it names them."""
    model = tiny(vocab_size=50)
    data = torch.randint(50, (2, 31), generator=torch.Generator().manual_seed(4))
    streams, mems, t = LMStreams(data.flatten(), 2, 4, ext_len), None, 4  # row b of the streams = data[b]
    for tau, (x, y) in enumerate(streams):
        nll, mems = model(x, mems, targets=y, mem_len=mem_len, ext_len=ext_len)
        assert nll.shape == y.shape
        end = tau * t + y.size(1)  # exclusive end of this input
        if mem_len == 0:
            assert mems == []
            continue
        expected = data[:, max(0, end - ext_len - mem_len) : end - ext_len]
        torch.testing.assert_close(mems[0], model.embed_tokens(expected))


def test_extended_context_with_enough_memory_equals_the_whole_sequence():
    """Segments read with ext_len and a memory long enough for everything score every token exactly as one pass
    over the whole text: nothing is lost, and nothing is seen twice (a memory that also kept the E re-read tokens
    would put them twice into the context)."""
    model = tiny()
    ids = tokens(25, seed=11)
    whole = model(ids[None, :-1], targets=ids[None, 1:])[0]  # (1, 24) NLL
    for ext_len in (1, 3):
        scores = evaluate_segments(model, ids, tgt_len=5, mem_len=40, ext_len=ext_len)
        assert scores.tokens == 24 and math.isclose(scores.nll, whole.sum().item(), rel_tol=1e-9)
    mems, doubled = None, 0.0  # the context seen twice: the reference's memory update without ext_len
    for x, y in LMStreams(ids, 1, 5, ext_len=3):
        nll, mems = model(x, mems, targets=y, mem_len=40)
        doubled += nll.sum().item()
    assert not math.isclose(doubled, whole.sum().item(), rel_tol=1e-6)


def test_targets_shorter_than_the_input_score_its_last_positions():
    model = tiny()
    x = tokens(2, 9, seed=12)
    full = model(x[:, :-1], targets=x[:, 1:])[0]  # (2, 8)
    torch.testing.assert_close(model(x[:, :-1], targets=x[:, 4:])[0], full[:, 3:])
    with pytest.raises(ValueError):
        model(x[:, :3], targets=x[:, :5])


# --- u and v: one pair per layer or one shared -------------------------------------------------------
def shared_copy(per_layer: TransformerXL) -> TransformerXL:
    """A share_uv model with every other weight of `per_layer`, its (u, v) = layer 0's."""
    shared = tiny(share_uv=True)
    state = {k: v for k, v in per_layer.state_dict().items() if "r_w_bias" not in k and "r_r_bias" not in k}
    missing, unexpected = shared.load_state_dict(state, strict=False)
    assert sorted(missing) == ["r_r_bias", "r_w_bias"] and not unexpected
    with torch.no_grad():
        shared.r_w_bias.copy_(per_layer.layers[0].attn.r_w_bias)
        shared.r_r_bias.copy_(per_layer.layers[0].attn.r_r_bias)
    return shared


def test_shared_uv_equals_per_layer_pairs_set_equal():
    per_layer = tiny()
    assert not hasattr(per_layer, "r_w_bias") and "layers.1.attn.r_r_bias" in per_layer.state_dict()
    with torch.no_grad():
        u, v = torch.randn(2, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
        for layer in per_layer.layers:
            layer.attn.r_w_bias.copy_(u)
            layer.attn.r_r_bias.copy_(v)
    shared = shared_copy(per_layer)
    assert not any("attn.r_" in k for k in shared.state_dict())
    first, second = tokens(2, 6, seed=13), tokens(2, 5, seed=14)
    for model_out in zip(*(run_two_segments(m, first, second) for m in (per_layer, shared))):
        torch.testing.assert_close(*model_out, rtol=0, atol=0)
    per_layer.layers[1].attn.r_r_bias.data.add_(1.0)  # pairs that differ give other outputs
    assert not torch.allclose(run_two_segments(per_layer, first, second)[0], run_two_segments(shared, first, second)[0])


def run_two_segments(model: TransformerXL, first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, ...]:
    _, mems = model(first, mem_len=6)
    logits, new_mems, weights = model(second, mems, mem_len=6, need_weights=True)
    return logits, *new_mems, *weights


def layer_reruns(model: TransformerXL, x: torch.Tensor):
    """Records every layer's inputs in one pass; the returned function runs each layer again on exactly those."""
    calls = []
    hooks = [layer.register_forward_hook(lambda mod, args, kwargs, out: calls.append((mod, args, kwargs)),
                                         with_kwargs=True) for layer in model.layers]
    model(x)
    for h in hooks:
        h.remove()
    return lambda: [mod(*args, **kwargs)[0] for mod, args, kwargs in calls]


@pytest.mark.parametrize("share_uv", [True, False])
def test_a_shared_u_reaches_every_layer_a_per_layer_u_only_its_own(share_uv):
    model = tiny(n_layers=3, share_uv=share_uv)
    rerun = layer_reruns(model, tokens(2, 7, seed=15))
    before = rerun()
    with torch.no_grad():
        (model.r_w_bias if share_uv else model.layers[0].attn.r_w_bias).add_(0.5)
    changed = [not torch.allclose(a, b) for a, b in zip(before, rerun())]  # each layer on its own, same inputs
    assert changed == ([True] * 3 if share_uv else [True, False, False])


def test_share_uv_checkpoints_round_trip_and_old_configs_read_as_per_layer(tmp_path):
    from attnkit import config as cfgmod
    from attnkit.checkpoint import LM_VOCAB, Checkpoint, load_lm_checkpoint, save_checkpoint

    old = {"model": {"kind": "transformer-xl", "vocab_size": V, "d_model": 16, "n_heads": 2, "d_ff": 32}}
    assert cfgmod.from_dict(cfgmod.LMRunConfig, old).model.share_uv is False  # written before the switch existed
    model = tiny(share_uv=True).float()
    cfg = cfgmod.LMRunConfig(model=model.config)
    vocab = b'{"level": "char", "tokens": ["<unk>", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]}'
    save_checkpoint(tmp_path / "xl.safetensors", Checkpoint(model.kind, cfg, model.state_dict(), {LM_VOCAB: vocab}))
    loaded, _, loaded_cfg = load_lm_checkpoint(tmp_path / "xl.safetensors")
    assert loaded_cfg.model.share_uv and torch.equal(loaded.r_w_bias, model.r_w_bias)
    x = tokens(1, 5, seed=16)
    torch.testing.assert_close(loaded(x)[0], model(x)[0])
