"""`attnkit.cpu.for_inference(model)` against the plain model it copies: the same logits, the same searches, int8
products close to them, and the model itself left as it was (its modules, its Parameters, its state dict)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.config import PAD_ID, RNNConfig, TransformerXLConfig
from attnkit.cpu import for_inference, int8_unavailable
from attnkit.cpu.attention import cpu_attention
from attnkit.cpu.packed import PackedFeedForward, PackedLinear, PackedLogits, PackedStackedLinear
from attnkit.cpu.rows import ADAPTIVE_ROWS
from attnkit.decode import beam_search, greedy_search
from attnkit.models import build_model
from attnkit.nn import AdaptiveLogSoftmax, FeedForward, MultiHeadAttention, StackedLinear
from attnkit.nn.outputs import Logits
from conftest import tiny_model_config

needs_int8 = pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
TIGHT = dict(atol=1e-5, rtol=1e-5)  # float32 rounding: oneDNN's packed products sum in another order than F.linear's


def transformer(seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("transformer", tiny_model_config(**kw)).eval()


def batch(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources (4, 7) with padded rows and teacher-forcing targets (4, 6)."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(4, 40, (4, 7), generator=g), torch.randint(4, 40, (4, 6), generator=g)
    src[1, 5:] = PAD_ID
    src[3, 3:] = PAD_ID
    return src, tgt


def tokens(hyps) -> list[list[list[int]]]:
    return [[h.tokens for h in sentence] for sentence in hyps]


@pytest.mark.parametrize("variant", [dict(), dict(norm_first=True, activation="gelu"),
                                     dict(share_embeddings=False, tie_output=False, output_bias=True)],
                         ids=["post-ln", "pre-ln-gelu", "untied-bias"])
def test_the_inference_copy_gives_the_plain_model_s_logits_and_attention(variant):
    m = transformer(**variant)
    fast = for_inference(m)
    src, tgt = batch()
    with torch.inference_mode():
        logits, maps = m.attention(src, tgt)
        fast_logits, fast_maps = fast.attention(src, tgt)
        torch.testing.assert_close(fast(src, tgt), m(src, tgt), **TIGHT)
    torch.testing.assert_close(fast_logits, logits, **TIGHT)
    for part in ("encoder", "decoder", "cross"):
        for ours, theirs in zip(fast_maps[part], maps[part], strict=True):
            torch.testing.assert_close(ours, theirs, **TIGHT)


def test_the_inference_copy_s_cached_steps_equal_teacher_forcing_by_the_plain_model():
    m = transformer()
    fast = for_inference(m)
    src, tgt = batch()
    with torch.inference_mode():
        full = m(src, tgt).log_softmax(-1)  # (B, T, V)
        state = fast.init_state(fast.encode(src))
        for t in range(tgt.size(1)):
            logp, state, _ = fast.step(tgt[:, t], state)
            torch.testing.assert_close(logp, full[:, t], **TIGHT)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_searches_on_the_inference_copy_equal_those_on_the_plain_model(search):
    m = transformer(seed=0)
    src, _ = batch()
    run = {"greedy": lambda model: greedy_search(model, src, max_len_a=0.0, max_len_b=8),
           "beam": lambda model: beam_search(model, src, beam=4, nbest=3, max_len_a=0.0, max_len_b=8)}[search]
    plain, fast = run(m), run(for_inference(m))
    assert tokens(fast) == tokens(plain)
    assert len({tuple(s[0].tokens) for s in plain}) > 1  # the sentences differ: the check has something to compare
    for ours, theirs in zip(fast, plain):
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-4)


@needs_int8
def test_int8_inference_stays_close_to_the_plain_model():
    m = transformer(seed=0)
    fast = for_inference(m, int8=True)
    src, tgt = batch()
    with torch.inference_mode():
        exact, quantised = m(src, tgt), fast(src, tgt)
    assert not torch.equal(quantised, exact)  # int8 products ran
    error = (quantised - exact).abs().max() / exact.abs().max()
    assert error < 0.05
    assert (quantised.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9
    plain = greedy_search(m, src, max_len_a=0.0, max_len_b=8)
    ours = greedy_search(fast, src, max_len_a=0.0, max_len_b=8)
    assert len({tuple(s[0].tokens) for s in plain}) > 1  # the sentences differ: the check has something to compare
    first = [(a[0].tokens[:3], b[0].tokens[:3]) for a, b in zip(plain, ours)]
    assert sum(a == b for a, b in first) >= len(first) - 1  # the searches agree on (nearly) every opening


def test_the_copy_shares_the_parameters_and_leaves_the_model_as_it_was():
    m = transformer(output_bias=True)
    before = {name: type(module) for name, module in m.named_modules()}
    keys = list(m.state_dict())
    fast = for_inference(m)
    # the model: the same module types, no cache, its attention the class default
    assert {name: type(module) for name, module in m.named_modules()} == before
    assert not any(type(module).__module__.startswith("attnkit.cpu") for module in m.modules())
    assert all("attention_function" not in a.__dict__ for a in m.modules() if isinstance(a, MultiHeadAttention))
    assert list(m.state_dict()) == keys
    # the copy: the packed modules and CPU attention in their places
    swapped = {name: type(module) for name, module in fast.named_modules()}
    assert swapped.keys() == before.keys()
    expected = {StackedLinear: PackedStackedLinear, nn.Linear: PackedLinear, Logits: PackedLogits,
                FeedForward: PackedFeedForward}
    assert swapped == {name: expected.get(cls, cls) for name, cls in before.items()}
    assert {a.attention_function for a in fast.modules() if isinstance(a, MultiHeadAttention)} == {cpu_attention}
    assert len({m.cache for m in fast.modules() if hasattr(m, "cache")}) == 1  # one cache for the whole copy
    # the same Parameters and buffers, so the same state dict
    assert list(fast.state_dict()) == keys
    plain_tensors, fast_tensors = m.state_dict(), fast.state_dict()
    assert all(fast_tensors[k].data_ptr() == plain_tensors[k].data_ptr() for k in keys)
    for (name, p), (fast_name, q) in zip(m.named_parameters(), fast.named_parameters(), strict=True):
        assert name == fast_name and p is q
    assert for_inference(fast) is fast  # already made: returned as it is


def test_the_copy_follows_the_model_s_weights():
    """A packed copy is rebuilt when a shared Parameter changes in place (its version counter moves)."""
    m = transformer()
    fast = for_inference(m)
    src, tgt = batch()
    with torch.inference_mode():
        before = fast(src, tgt)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.5)
    with torch.inference_mode():
        after, plain = fast(src, tgt), m(src, tgt)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, plain, **TIGHT)


def test_the_copy_runs_the_model_s_hooks_even_those_holding_what_cannot_be_copied():
    """The model's hooks are the copy's own (not copies): one holding a lock, registered before or after the copy."""
    import threading

    m = transformer()
    lock, calls = threading.Lock(), []
    m.register_forward_pre_hook(lambda module, args: calls.append(("before", lock.locked())))
    fast = for_inference(m)
    m.encoder[0].register_forward_hook(lambda module, args, out: calls.append(("after", lock.locked())))
    src, tgt = batch()
    with torch.inference_mode():
        fast(src, tgt)
    assert calls == [("before", False), ("after", False)]


@pytest.mark.parametrize("adaptive", [dict(), dict(cutoffs=[10, 20], div_val=2)], ids=["full", "adaptive"])
def test_transformer_xl_through_the_inference_copy_equals_its_plain_forward(adaptive):
    torch.manual_seed(4)
    cfg = TransformerXLConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, **adaptive)
    m = build_model("transformer-xl", cfg).eval()
    fast = for_inference(m)
    if adaptive:
        softmax = [s for s in fast.modules() if isinstance(s, AdaptiveLogSoftmax)]
        assert softmax and all(s.row_multiple == ADAPTIVE_ROWS for s in softmax)
        assert all(s.row_multiple == 0 for s in m.modules() if isinstance(s, AdaptiveLogSoftmax))
    x = torch.randint(40, (2, 15), generator=torch.Generator().manual_seed(5))
    mems = {"plain": None, "fast": None}
    with torch.inference_mode():
        for segment in x.split(5, dim=1):  # three segments, each attending to the memory of the ones before
            out, mems["plain"] = m(segment, mems["plain"], mem_len=8)
            fast_out, mems["fast"] = fast(segment, mems["fast"], mem_len=8)
            torch.testing.assert_close(fast_out, out, **TIGHT)
            for ours, theirs in zip(mems["fast"], mems["plain"], strict=True):
                torch.testing.assert_close(ours, theirs, **TIGHT)


@pytest.mark.parametrize("kind, cell", [("rnn-bahdanau", "gru"), ("rnn-luong", "lstm")])
def test_an_rnn_through_the_inference_copy_equals_its_plain_forward(kind, cell):
    torch.manual_seed(6)
    cfg = RNNConfig(kind=kind, cell=cell, src_vocab_size=40, tgt_vocab_size=40, embed_dim=12, hidden=16, dropout=0.0)
    m = build_model(kind, cfg).eval()
    fast = for_inference(m)
    assert type(fast.out_proj) is PackedLinear and type(m.out_proj) is nn.Linear
    src, tgt = batch()
    with torch.inference_mode():
        torch.testing.assert_close(fast(src, tgt), m(src, tgt), **TIGHT)
    plain = beam_search(m, src, beam=3, nbest=2, max_len_a=0.0, max_len_b=6)
    assert tokens(beam_search(fast, src, beam=3, nbest=2, max_len_a=0.0, max_len_b=6)) == tokens(plain)
