"""The encoder-decoder Transformer: padding, causality, cached decoding, tied weights, greedy search."""

from __future__ import annotations

import pytest
import torch

from attnkit.data import BOS_ID, EOS_ID, PAD_ID
from attnkit.decode import greedy_search
from attnkit.models import Transformer
from conftest import tiny_model_config


def model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(**kw)).eval()


def ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_never_changes_real_positions(norm_first):
    m = model(norm_first=norm_first)
    src, tgt = ids(1, 6), ids(1, 4, 1)
    ref = m(src, tgt)
    padded_src = torch.cat([src, torch.full((1, 5), PAD_ID)], 1)
    padded_tgt = torch.cat([tgt, torch.full((1, 3), PAD_ID)], 1)
    out = m(padded_src, padded_tgt)
    torch.testing.assert_close(out[:, :4], ref, atol=1e-5, rtol=1e-5)
    # batched with a longer sentence: the short one's outputs are unchanged too
    batch_src = torch.cat([padded_src, ids(1, 11, 2)])
    batch_tgt = torch.cat([padded_tgt, ids(1, 7, 3)])
    torch.testing.assert_close(m(batch_src, batch_tgt)[:1, :4], ref, atol=1e-5, rtol=1e-5)


def test_changing_a_future_target_token_never_changes_earlier_outputs():
    m = model()
    src, tgt = ids(2, 5), ids(2, 6, 1)
    ref = m(src, tgt)
    for k in range(1, 6):
        changed = tgt.clone()
        changed[:, k:] = (changed[:, k:] + 7) % 36 + 4
        out = m(src, changed)
        torch.testing.assert_close(out[:, :k], ref[:, :k], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, k], ref[:, k])  # and the change is seen where it may be


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "relu"), (False, "gelu"), (True, "gelu")])
def test_cached_incremental_decoding_equals_full_recomputation(norm_first, activation):
    """DecoderLayer.step (one position over the cache) is the same layer as its teacher-forced forward."""
    m = model(norm_first=norm_first, activation=activation)
    src = torch.cat([ids(2, 7), torch.cat([ids(1, 4, 5), torch.full((1, 3), PAD_ID)], 1)])
    tgt = ids(3, 6, 1)
    full = m(src, tgt).log_softmax(-1)  # (B, T, V)
    state = m.init_state(m.encode(src))
    for t in range(tgt.size(1)):
        logp, state, _ = m.step(tgt[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=1e-5)
    # reordering the state reorders the continuation
    perm = torch.tensor([2, 0, 1])
    nxt = ids(3, 1, 9)[:, 0]
    a, _, _ = m.step(nxt, state)
    b, _, _ = m.step(nxt[perm], state.reorder(perm))
    torch.testing.assert_close(b, a[perm])


def test_beams_attend_to_one_copy_of_their_source_like_to_their_own_copies():
    """state.expand(K) keeps one source per sentence and attends with its K rows as one query block."""
    m, k = model(), 3
    src = torch.cat([ids(2, 7), torch.cat([ids(1, 4, 5), torch.full((1, 3), PAD_ID)], 1)])
    enc = m.encode(src)
    grouped = m.init_state(enc).expand(k)
    copied = m.init_state(enc).reorder(torch.arange(3).repeat_interleave(k))
    assert grouped.memory_kv[0].k.size(0) == 3 and copied.memory_kv[0].k.size(0) == 9
    tokens = ids(9, 4, 2)
    for t in range(tokens.size(1)):
        a, grouped, wa = m.step(tokens[:, t], grouped, need_weights=True)
        b, copied, wb = m.step(tokens[:, t], copied, need_weights=True)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        for x, y in zip(wa, wb):  # cross-attention weights (9, H, S), row by row
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)
    keep = torch.tensor([6, 8, 7, 0, 0, 1])  # sentences 2 and 0 survive, their beams shuffled
    a, _, _ = m.step(tokens[keep, 0], grouped.reorder(keep))
    b, _, _ = m.step(tokens[keep, 0], copied.reorder(keep))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_tied_embeddings_are_one_tensor():
    m = model()
    assert m.src_embed.weight is m.tgt_embed.weight
    keys = [k for k in m.state_dict() if "embed" in k or k == "out_proj.weight"]
    assert keys == ["src_embed.weight"]
    h = torch.randn(2, 3, 16)
    torch.testing.assert_close(m.project(h), h @ m.src_embed.weight.T)
    untied = model(share_embeddings=False, tie_output=False)
    assert untied.src_embed.weight is not untied.tgt_embed.weight and untied.out_proj is not None


def test_embeddings_are_scaled_and_positions_added():
    m = model()
    x = ids(1, 3)
    expected = m.src_embed(x) * 4.0 + m.positions.table[:3]  # sqrt(16) = 4
    torch.testing.assert_close(m.embed(m.src_embed, x), expected)


def test_attention_maps_are_distributions_and_match_forward():
    m = model()
    src = torch.cat([ids(1, 5), torch.full((1, 2), PAD_ID)], 1)
    tgt = ids(1, 4, 1)
    logits, att = m.attention(src, tgt)
    torch.testing.assert_close(logits, m(src, tgt), atol=1e-5, rtol=1e-5)
    assert [len(att[k]) for k in ("encoder", "decoder", "cross")] == [2, 2, 2]
    assert att["cross"][0].shape == (1, 2, 4, 7)
    assert att["cross"][1][..., 5:].abs().max() == 0  # no weight on padding
    assert att["decoder"][0][0, 0].triu(1).abs().max() == 0  # causal
    torch.testing.assert_close(att["encoder"][0].sum(-1), torch.ones(1, 2, 7))


def _greedy_by_recomputation(m: Transformer, src: torch.Tensor, steps: int) -> list[int]:
    out = [BOS_ID]
    for _ in range(steps):
        nxt = int(m(src, torch.tensor([out]))[0, -1].argmax())
        out.append(nxt)
        if nxt == EOS_ID:
            break
    return [t for t in out[1:] if t != EOS_ID]


def test_greedy_with_cache_equals_recomputation_and_batching():
    m = model()
    srcs = [ids(1, n, n) for n in (3, 6, 4)]
    batch = torch.full((3, 6), PAD_ID)
    for i, s in enumerate(srcs):
        batch[i, : s.size(1)] = s
    hyps = greedy_search(m, batch, max_len_a=0.0, max_len_b=8)
    for i, s in enumerate(srcs):
        single = greedy_search(m, s, max_len_a=0.0, max_len_b=8)[0][0]
        assert hyps[i][0].tokens == single.tokens == _greedy_by_recomputation(m, s, 8)
        assert hyps[i][0].score == pytest.approx(single.score, abs=1e-4)


def test_greedy_respects_length_limits():
    m = model()
    src = ids(2, 5)
    hyps = greedy_search(m, src, max_len_a=0.0, max_len_b=3)
    assert all(len(h[0].tokens) <= 3 for h in hyps)
    hyps = greedy_search(m, src, max_len_a=0.0, max_len_b=6, min_len=4)
    assert all(len(h[0].tokens) >= 4 for h in hyps)
