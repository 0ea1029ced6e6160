"""Beam search, sampling, constraints and forced scoring against references that are known to be right."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from attnkit.data import BOS_ID, EOS_ID, PAD_ID
from attnkit.decode import beam_search, greedy_search, sample, score_targets
from attnkit.decode.search import filter_logits, row_argmax, row_topk
from attnkit.models import Transformer
from conftest import tiny_model_config


def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config()).eval()


def sources() -> torch.Tensor:
    src = torch.randint(4, 40, (4, 7), generator=torch.Generator().manual_seed(3))
    src[1, 5:] = PAD_ID
    src[3, 3:] = PAD_ID
    return src


# --- a decoder with fixed, hand-set probabilities: a Markov chain over the last token -------------
A, B = 4, 5  # the two "words"; V = 6 with PAD/BOS/EOS/UNK
TABLE = {  # P(next | last)
    BOS_ID: {A: 0.6, B: 0.4},
    A: {EOS_ID: 0.1, A: 0.45, B: 0.45},
    B: {EOS_ID: 0.9, A: 0.05, B: 0.05},
}


@dataclass
class ChainState:
    length: int = 0

    def reorder(self, rows: torch.Tensor, *, within_sentences: bool = False) -> ChainState:
        return self

    def expand(self, beams: int) -> ChainState:
        return self


class ChainModel:
    """encode / init_state / step like a seq2seq model, with probabilities from TABLE."""

    def encode(self, src):
        return src

    def init_state(self, enc):
        return ChainState()

    def step(self, tokens, state, need_weights=False):
        logp = torch.full((tokens.size(0), 6), float("-inf"))
        for row, last in enumerate(tokens.tolist()):
            for nxt, p in TABLE.get(last, {}).items():  # other tokens: a dead beam
                logp[row, nxt] = math.log(p)
        return logp, ChainState(state.length + 1), None


def brute_force(max_len: int) -> list[tuple[float, list[int]]]:
    """Every complete sequence of at most max_len words with its log-probability, best first."""
    out = []
    for n in range(max_len + 1):
        for words in itertools.product([A, B], repeat=n):
            seq, last, lp = list(words) + [EOS_ID], BOS_ID, 0.0
            for tok in seq:
                lp += math.log(TABLE[last].get(tok, 0.0) or 1e-300)
                last = tok
            out.append((lp, list(words)))
    return sorted(out, key=lambda x: -x[0])


def test_beam_search_finds_the_known_best_where_greedy_does_not():
    src = torch.full((1, 3), 7)
    best_lp, best_seq = brute_force(4)[0]
    assert best_seq == [B]  # P = 0.4 * 0.9
    greedy = greedy_search(ChainModel(), src, max_len_a=0, max_len_b=4)[0][0]
    assert greedy.tokens[0] == A and greedy.score < best_lp  # greedy takes the 0.6 and is trapped
    hyps = beam_search(ChainModel(), src, beam=4, nbest=4, len_penalty=0.0, max_len_a=0, max_len_b=4)[0]
    assert hyps[0].tokens == best_seq and hyps[0].score == pytest.approx(best_lp)
    known = {tuple(seq): lp for lp, seq in brute_force(4)}
    scores = [h.norm_score for h in hyps]
    assert scores == sorted(scores, reverse=True)  # sorted
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps) == 4  # distinct
    for h in hyps:
        assert h.score == pytest.approx(known[tuple(h.tokens)])  # and scored right


def test_length_normalisation_changes_the_ranking_as_defined():
    src = torch.full((1, 3), 7)
    hyps = beam_search(ChainModel(), src, beam=4, nbest=4, len_penalty=1.0, max_len_a=0, max_len_b=4)[0]
    for h in hyps:
        assert h.norm_score == pytest.approx(h.score / (len(h.tokens) + 1))
    gnmt = beam_search(ChainModel(), src, beam=4, nbest=4, len_penalty=0.6, len_style="gnmt",
                       max_len_a=0, max_len_b=4)[0]
    for h in gnmt:
        assert h.norm_score == pytest.approx(h.score / ((5 + len(h.tokens) + 1) / 6) ** 0.6)


def test_beam_size_one_is_exactly_greedy():
    # Greedy maximises the raw log-probability one token at a time: beam 1 under the same objective
    # (no length normalisation) must take exactly its path. (With alpha > 0 beam search maximises
    # score / |Y|^alpha and may rightly continue past greedy's EOS; `translate --beam 1` is greedy.)
    m, src = model(), sources()
    greedy = greedy_search(m, src, max_len_a=0, max_len_b=9)
    beam = beam_search(m, src, beam=1, len_penalty=0.0, max_len_a=0, max_len_b=9)
    for g, b in zip(greedy, beam):
        assert b[0].tokens == g[0].tokens
        assert b[0].score == pytest.approx(g[0].score, abs=1e-5)


@dataclass
class UncachedState:
    """Decoder state that keeps only the tokens: every step recomputes the whole prefix."""

    enc: object
    tokens: torch.Tensor  # (N, t)

    def reorder(self, rows, *, within_sentences=False):  # the source side is reordered anyway: always right
        enc = type(self.enc)(self.enc.memory.index_select(0, rows), self.enc.pad_mask.index_select(0, rows))
        return UncachedState(enc, self.tokens.index_select(0, rows))

    def expand(self, beams):
        return self.reorder(torch.arange(self.tokens.size(0), device=self.tokens.device).repeat_interleave(beams))


class Uncached:
    def __init__(self, m):
        self.m = m

    def encode(self, src):
        return self.m.encode(src)

    def init_state(self, enc):
        return UncachedState(enc, torch.empty(enc.memory.size(0), 0, dtype=torch.long, device=enc.memory.device))

    def step(self, tokens, state, need_weights=False):
        seq = torch.cat([state.tokens, tokens[:, None]], 1)
        logits, _ = self.m.decode(seq, state.enc)
        return logits[:, -1].log_softmax(-1), UncachedState(state.enc, seq), None


def test_cached_beam_search_equals_uncached():
    m, src = model(), sources()
    cached = beam_search(m, src, beam=4, nbest=3, max_len_a=0, max_len_b=8)
    uncached = beam_search(Uncached(m), src, beam=4, nbest=3, max_len_a=0, max_len_b=8)
    for c, u in zip(cached, uncached):
        assert [h.tokens for h in c] == [h.tokens for h in u]
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)


def test_beam_never_scores_below_greedy_and_respects_limits():
    m, src = model(), sources()
    greedy = greedy_search(m, src, max_len_a=0, max_len_b=8)
    for b in beam_search(m, src, beam=5, len_penalty=0.0, max_len_a=0, max_len_b=8, min_len=2):
        assert 2 <= len(b[0].tokens) <= 8
    unconstrained = beam_search(m, src, beam=5, len_penalty=0.0, max_len_a=0, max_len_b=8)
    for g, b in zip(greedy, unconstrained):
        assert b[0].score >= g[0].score - 1e-5


def _batch_for(hyp_tokens: list[list[int]]):
    n = max(len(t) for t in hyp_tokens) + 1
    tin = torch.full((len(hyp_tokens), n), PAD_ID)
    tout = torch.full((len(hyp_tokens), n), PAD_ID)
    for i, t in enumerate(hyp_tokens):
        tin[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
        tout[i, : len(t) + 1] = torch.tensor(t + [EOS_ID])
    return tin, tout


def test_forced_decoding_of_the_greedy_output_returns_the_greedy_score():
    m, src = model(), sources()
    greedy = greedy_search(m, src, max_len_a=0, max_len_b=30)  # long enough to end in EOS
    tokens = [g[0].tokens for g in greedy]
    tin, tout = _batch_for(tokens)
    forced = score_targets(m, src, tin, tout)
    torch.testing.assert_close(forced, torch.tensor([g[0].score for g in greedy]), atol=1e-4, rtol=1e-4)


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    m, src = model(), sources()
    greedy = [h[0].tokens for h in greedy_search(m, src, max_len_a=0, max_len_b=8)]
    assert [h[0].tokens for h in sample(m, src, top_k=1, max_len_a=0, max_len_b=8)] == greedy
    assert [h[0].tokens for h in sample(m, src, top_p=1e-6, max_len_a=0, max_len_b=8)] == greedy
    a = sample(m, src, temperature=2.0, generator=torch.Generator().manual_seed(5), max_len_a=0, max_len_b=8)
    b = sample(m, src, temperature=2.0, generator=torch.Generator().manual_seed(5), max_len_a=0, max_len_b=8)
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]


def test_prefix_is_forced_and_no_repeat_ngram_blocks_repeats():
    m, src = model(), sources()
    prefix = torch.tensor([[7, 8], [9, PAD_ID], [PAD_ID, PAD_ID], [5, 5]])
    for search in (greedy_search, lambda *a, **k: beam_search(*a, beam=3, **k)):
        hyps = search(m, src, prefix=prefix, max_len_a=0, max_len_b=6)
        for row, h in zip(prefix.tolist(), hyps):
            want = [t for t in row if t != PAD_ID]
            assert h[0].tokens[: len(want)] == want
        for h in search(m, src, no_repeat_ngram=2, max_len_a=0, max_len_b=12):
            pairs = list(zip(h[0].tokens, h[0].tokens[1:]))
            assert len(pairs) == len(set(pairs))


def test_beam_attention_has_one_row_per_output_token():
    m, src = model(), sources()
    hyps = beam_search(m, src, beam=3, max_len_a=0, max_len_b=6, need_attention=True)
    for h in hyps:
        assert h[0].attention.shape == (len(h[0].tokens) + 1, 2, 7)
        torch.testing.assert_close(h[0].attention.sum(-1), torch.ones(len(h[0].tokens) + 1, 2))


def naive_beam(m: Transformer, src: torch.Tensor, k: int, n: int) -> list[tuple[list[int], float]]:
    """Textbook beam search for one sentence, exactly n tokens then EOS, by full recomputation: every beam
    is extended by every allowed token (never PAD or BOS) and the k best of all candidates are kept."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    enc = m.encode(src[None])
    for t in range(n + 1):
        candidates = []
        for tokens, score in beams:
            logits, _ = m.decode(torch.tensor([[BOS_ID, *tokens]]), enc)
            logp = logits[0, -1].log_softmax(-1).tolist()
            allowed = [EOS_ID] if t == n else [v for v in range(len(logp)) if v not in (EOS_ID, PAD_ID, BOS_ID)]
            candidates += [([*tokens, v], score + logp[v]) for v in allowed]
        beams = sorted(candidates, key=lambda c: -c[1])[:k]
    return [(tokens[:-1], score) for tokens, score in beams]  # EOS scored, not returned


# words that may be produced (V less PAD, BOS, EOS): 37 >= 2K, K <= 5 < 2K, 3 < K
@pytest.mark.parametrize(("vocab", "k"), [(40, 3), (8, 4), (6, 5)])
def test_beam_search_equals_a_textbook_beam_search(vocab, k):
    """The batched search (one row per sentence at the first step, each beam's 2K best ranked before the
    sentence's) finds exactly the textbook search's hypotheses and scores."""
    torch.manual_seed(vocab)
    m = Transformer(tiny_model_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    src = torch.randint(3, vocab, (3, 5), generator=torch.Generator().manual_seed(k))
    found = beam_search(m, src, beam=k, nbest=k, len_penalty=0.0, max_len_a=0, max_len_b=4, min_len=4)
    with torch.no_grad():
        for hyps, row in zip(found, src):
            ref = naive_beam(m, row, k, 4)
            live = [r for r in ref if r[1] > float("-inf")]
            assert [h.tokens for h in hyps] == [tokens for tokens, _ in live]
            assert [h.score for h in hyps] == pytest.approx([score for _, score in live], abs=1e-4)


def test_block_maxima_searches_equal_argmax_and_topk():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 640, generator=g)
    x[0, 100] = x[0, 500] = 9.0  # a tie across blocks: the first index wins, as in argmax
    x[1, 70:72] = 9.0  # a tie inside a block
    x[2, 300] = float("nan")  # argmax returns the NaN's index
    assert torch.equal(row_argmax(x), x.argmax(1))
    for k in (1, 3, 9):
        values, idx = row_topk(x[3:], k)
        ref = x[3:].topk(k, dim=1)
        assert torch.equal(values, ref.values) and torch.equal(idx, ref.indices)
    odd = torch.randn(3, 100, generator=g)  # not whole blocks: torch's own search
    assert torch.equal(row_argmax(odd), odd.argmax(1)) and torch.equal(row_topk(odd, 2)[1], odd.topk(2, dim=1).indices)


@pytest.mark.parametrize("shape", [(64, 8000), (5, 17), (3, 1)])
def test_packed_log_probs_in_place_equal_log_softmax(shape):
    """A decoding step's log-probabilities through the CPU room's PackedLogits: normalised in place of the step's
    logits, equal to their log_softmax, and to the plain Logits.log_probs."""
    from attnkit.cpu.modules import sharing
    from attnkit.cpu.packed import PackedLogits, PackedWeights
    from attnkit.nn.outputs import Logits

    torch.manual_seed(4)
    n, v = shape
    h = torch.randn(n, 16)
    weight = torch.nn.Parameter(torch.randn(v, 16) * 3)
    bias = torch.nn.Parameter(torch.randn(v))
    with torch.no_grad():
        bias[0] = float("-inf")  # a banned token
    plain = Logits()
    packed = sharing(PackedLogits, plain, cache=PackedWeights())
    with torch.inference_mode():
        want = plain.log_probs(h, weight, bias)
    made = []  # the step's logits as PackedLogits' forward returned them (the hook is the shared module's too)
    hook = packed.register_forward_hook(lambda module, args, out: made.append((out.data_ptr(), out.clone())))
    with torch.inference_mode():
        out = packed.log_probs(h, weight, bias)
    hook.remove()
    (pointer, logits), = made
    assert out.data_ptr() == pointer  # in place: no second (N, V) tensor
    ref = logits.log_softmax(-1)
    assert torch.equal(out[:, 1:], ref[:, 1:]) and torch.equal(out.isneginf(), ref.isneginf())
    assert out.dtype == want.dtype == torch.float32 and (v == 1 or out[:, 0].isneginf().all())
    torch.testing.assert_close(out[:, 1:], want[:, 1:], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(want, F.linear(h, weight, bias).log_softmax(-1), equal_nan=True)
    half_h, half_w = h.bfloat16(), torch.nn.Parameter(weight.detach().bfloat16())
    with torch.inference_mode():
        half = packed.log_probs(half_h, half_w, None)
    assert half.dtype == torch.float32 and half_w.dtype == torch.bfloat16  # normalised in float32
    torch.testing.assert_close(half, F.linear(half_h, half_w).float().log_softmax(-1), atol=0.05, rtol=0.01)
    leaf = torch.randn(n, 16, requires_grad=True)
    recorded = packed.log_probs(leaf * 1.0, weight, bias)  # recorded for autograd: the logits are not overwritten
    torch.testing.assert_close(recorded, F.linear(leaf, weight, bias).log_softmax(-1), equal_nan=True)
    assert recorded.requires_grad


@pytest.mark.parametrize("top_p", [1e-75, 0.3, 0.6, 0.95])
def test_nucleus_keeps_the_smallest_set_reaching_top_p_and_never_nothing(top_p):
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 4  # peaked rows: the first token's rounding error once dropped it at tiny top_p
    kept = filter_logits(logits, top_p=top_p).isfinite()
    for row, keep in zip(logits.softmax(-1), kept):
        probs = row.sort(descending=True).values
        need = int((probs.cumsum(0) < top_p).sum()) + 1  # the smallest prefix whose mass reaches top_p
        assert keep.sum().item() == min(need, 50) and keep[row.argmax()]
