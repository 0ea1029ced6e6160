"""Shaw et al. (2018) relative position representations (`positions: shaw`, nn/shaw.py) against the paper's
equations written out per query and key, in the encoder-decoder and the vanilla LM."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.config import BOS_ID, PAD_ID, TransformerXLConfig
from attnkit.decode import beam_search, greedy_search
from attnkit.errors import ConfigError
from attnkit.models import Transformer, build_model
from attnkit.nn.shaw import ShawAttention, relative_distances
from conftest import tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")
CLIP = 3


def attention(seed: int = 0, **kw) -> ShawAttention:
    torch.manual_seed(seed)
    return ShawAttention(16, 2, clip=CLIP, **kw).double().eval()


def written_out(a: ShawAttention, q, k, v, keep) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 3-5 per (batch, head, query i, key j), the queries the last T of the S positions; keep (B, T, S)."""
    b, h, t, dh = q.shape
    s = k.size(2)
    weights, out = torch.zeros(b, h, t, s, dtype=q.dtype), torch.zeros(b, h, t, dh, dtype=q.dtype)
    for n in range(b):
        for head in range(h):
            for i in range(t):
                pos_i = s - t + i
                dist = [max(-CLIP, min(CLIP, j - pos_i)) + CLIP for j in range(s)]
                e = torch.stack([q[n, head, i] @ (k[n, head, j] + a.rel_keys[dist[j]]) for j in range(s)])
                e = (e / math.sqrt(dh)).masked_fill(~keep[n, i], float("-inf"))
                alpha = e.softmax(-1)
                weights[n, head, i] = alpha
                out[n, head, i] = sum(alpha[j] * (v[n, head, j] + a.rel_values[dist[j]]) for j in range(s))
    return out.transpose(1, 2).reshape(b, t, h * dh), weights


def test_distances_are_clipped_offsets_of_the_last_queries():
    for t, s in ((5, 5), (1, 6), (3, 8)):
        d = relative_distances(t, s, CLIP)
        assert d.tolist() == [[max(-CLIP, min(CLIP, j - (s - t + i))) + CLIP for j in range(s)] for i in range(t)]


@pytest.mark.parametrize("case", ["encoder-padding", "causal", "one-query-step", "causal-over-a-prefix"])
def test_attention_is_the_papers_equations_written_out(case):
    a, gen = attention(), torch.Generator().manual_seed(1)
    t, s = {"encoder-padding": (7, 7), "causal": (6, 6), "one-query-step": (1, 8), "causal-over-a-prefix": (3, 8)}[case]
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen, dtype=torch.double) for n in (t, s, s))
    mask, causal = None, case.startswith("causal")
    keep = torch.ones(2, t, s, dtype=torch.bool)
    if case == "encoder-padding":
        mask = torch.ones(2, 1, 1, s, dtype=torch.bool)
        mask[1, ..., 5:] = False  # the second sentence has 5 tokens
        keep &= mask[:, 0]
    if causal:
        keep &= torch.ones(t, s, dtype=torch.bool).tril(s - t)
    expected, weights = written_out(a, q, k, v, keep)
    for need_weights in (False, True):
        out, w = a.attend(q, k, v, mask=mask, causal=causal, need_weights=need_weights)
        torch.testing.assert_close(out, expected)
        if need_weights:
            torch.testing.assert_close(w, weights)


def test_gradients_are_exact_through_the_inputs_and_the_relative_vectors():
    a = attention()
    x = torch.randn(2, 5, 16, dtype=torch.double, requires_grad=True)
    rel_keys, rel_values = (p.detach().clone().requires_grad_() for p in (a.rel_keys, a.rel_values))

    def causal_self_attention(x, rel_keys, rel_values):
        return torch.func.functional_call(a, {"rel_keys": rel_keys, "rel_values": rel_values}, (x,),
                                          {"causal": True})[0]

    assert torch.autograd.gradcheck(causal_self_attention, (x, rel_keys, rel_values))


def seq2seq(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(positions="shaw", relative_clip=CLIP, **kw)).double().eval()


def ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, (b, t), generator=torch.Generator().manual_seed(seed))


def test_self_attentions_are_relative_and_cross_attentions_are_not():
    m = seq2seq()
    assert all(isinstance(layer.self_attn, ShawAttention) and layer.self_attn.clip == CLIP
               for layer in [*m.encoder, *m.decoder])
    assert not any(isinstance(layer.cross_attn, ShawAttention) for layer in m.decoder)
    tables = {f"{side}.{i}.self_attn.rel_{w}" for side in ("encoder", "decoder") for i in range(2)
              for w in ("keys", "values")}
    assert {k for k in m.state_dict() if "rel_" in k} == tables


def test_left_padding_moves_no_real_token_with_relative_positions_only():
    """Relative positions see distances, not places: the same sentence after three padding tokens (masked) gives the
    same states. Sinusoids, added at the absolute places, give others."""
    src = ids(1, 6)
    shifted = torch.cat([torch.full((1, 3), PAD_ID), src], 1)
    m = seq2seq()
    torch.testing.assert_close(m.encode(shifted).memory[:, 3:], m.encode(src).memory)
    absolute = Transformer(tiny_model_config()).double().eval()
    assert not torch.allclose(absolute.encode(shifted).memory[:, 3:], absolute.encode(src).memory)


def test_decoding_with_the_cache_padding_and_beam_one_agree():
    m = seq2seq()
    src = torch.cat([ids(2, 7), torch.cat([ids(1, 4, 5), torch.full((1, 3), PAD_ID)], 1)])
    tgt = torch.cat([torch.full((3, 1), BOS_ID), ids(3, 8, 1)], 1)  # longer than 2 clip + 1: clipped distances
    full = m(src, tgt).log_softmax(-1)
    state = m.init_state(m.encode(src))
    for t in range(tgt.size(1)):
        logp, state, _ = m.step(tgt[:, t], state)
        torch.testing.assert_close(logp, full[:, t].to(logp.dtype))
    torch.testing.assert_close(m(src[2:, :4], tgt[2:]).log_softmax(-1)[0], full[2])
    m = m.float()
    greedy, beam = greedy_search(m, src, max_len_b=9), beam_search(m, src, beam=1, len_penalty=0.0, max_len_b=9)
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]


@pytest.mark.parametrize("kind", ["vanilla-lm", "recurrent-vanilla-lm"])
def test_the_vanilla_lms_take_relative_positions_and_stay_causal(kind):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(kind=kind, vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                              positions="shaw", relative_clip=CLIP)
    m = build_model(kind, cfg).double().eval()
    assert all(isinstance(layer.self_attn, ShawAttention) for layer in m.layers)
    x = ids(2, 9)
    logits = m(x)[0]
    changed = x.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 36 + 4
    torch.testing.assert_close(m(changed)[0][:, :5], logits[:, :5])
    assert not torch.allclose(m(changed)[0][:, 5:], logits[:, 5:])


def test_one_attention_variant_at_a_time_and_a_positive_clip():
    with pytest.raises(ConfigError, match="shared-qk and model.positions: shaw both change the attention"):
        tiny_model_config(positions="shaw", variant="shared-qk")
    with pytest.raises(ConfigError, match="model.relative_clip must be at least 1, not 0"):
        tiny_model_config(positions="shaw", relative_clip=0)
