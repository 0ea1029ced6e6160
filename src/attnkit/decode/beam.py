"""Batched beam search over the models' encode / step interface, with the key/value cache.

B sentences, K beams, A = active sentences, N = A * K rows, V vocabulary, t output position.
The decoder state is expanded to K rows per sentence with `state.expand(K)` and reordered with
`state.reorder(rows)`, so any seq2seq model family works; while the rows only trade places within their
sentence's block, the source side is kept (`within_sentences`), and rows always move in whole blocks.
"""

from __future__ import annotations

import torch

from attnkit.data.tokenizer import BOS_ID, EOS_ID
from attnkit.decode.search import Hypothesis, StepRules, length_penalty, max_lengths, row_topk, search


@search
def beam_search(model, src: torch.Tensor, *, beam: int = 5, nbest: int = 1, max_len_a: float = 1.2,
                max_len_b: int = 10, max_len: int = 0, min_len: int = 0, len_penalty: float = 1.0,
                len_style: str = "length", no_repeat_ngram: int = 0, prefix: torch.Tensor | None = None,
                need_attention: bool = False, attention_layer: int = -1) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses per sentence, best first, ranked by score / length_penalty.

    At each step the 2K best continuations are ranked; an EOS among the first K finishes a
    hypothesis (the K best finished are kept), and the first K others continue. A sentence stops
    once it has K finished hypotheses and no running one can still beat the worst of them (scores
    only fall as tokens are added, so the bound is exact); its rows leave the batch. Stopping at the
    first K finished instead (fairseq's early stopping) loses hypotheses that end later with a
    better score: on Multi30k beam 5 then scored below greedy on 3-4% of the sentences. With
    len_penalty 0 (raw log-probability, greedy's objective) beam 1 is exactly greedy search.
    """
    b, k, device = src.size(0), beam, src.device
    # The K beams of a sentence would start identical: the first step runs one row per sentence (kk = 1
    # row each), and its K best continuations become the K beams (`expand`).
    state = model.init_state(model.encode(src))
    rules = StepRules(max_lengths(src, max_len_a, max_len_b, max_len, prefix), min_len, prefix, no_repeat_ngram)
    steps = int(rules.limits.max()) + 1
    beam_scores = torch.zeros(b, 1, device=device)  # (A, kk)
    history = torch.empty(b, 0, dtype=torch.long, device=device)  # (N, t), N = A * kk
    attn_hist: torch.Tensor | None = None  # (N, t, H, S)
    sentences = torch.arange(b, device=device)  # original index of each active sentence
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    last = torch.full((b,), BOS_ID, dtype=torch.long, device=device)
    for t in range(steps):
        logp, state, cross = model.step(last, state, need_weights=need_attention)  # (N, V)
        if need_attention:
            step_attn = cross[attention_layer][:, None].float()  # (N, 1, H, S)
            attn_hist = step_attn if attn_hist is None else torch.cat([attn_hist, step_attn], 1)
        logp = rules.apply(logp, t, history)
        (a, kk), c = beam_scores.shape, min(2 * k, logp.size(1))
        # A sentence's 2K best continuations are among its beams' 2K best each (no beam holds more of them):
        # ranking kk * 2K candidates rather than kk * V is the same search, at a fraction of the cost.
        row_scores, row_tok = row_topk(logp, c)  # (N, C)
        cand = (beam_scores.view(-1, 1) + row_scores).view(a, kk * c)  # (A, kk*C)
        top_scores, top_idx = cand.topk(min(2 * k, kk * c), dim=1)  # (A, 2K)
        top_beam, top_tok = top_idx // c, row_tok.view(a, kk * c).gather(1, top_idx)
        if top_scores.size(1) < k:  # a vocabulary smaller than the beam: the missing beams are dead (-inf)
            top_scores, top_beam, top_tok = _pad(top_scores, top_beam, top_tok, k)
        is_eos = top_tok.eq(EOS_ID) & top_scores.gt(float("-inf"))
        _finish(finished, sentences, history, attn_hist, top_scores, top_beam, is_eos, k, kk, len_penalty,
                len_style)
        # the first K candidates that are not EOS continue
        rank = torch.where(is_eos, top_scores.size(1) + torch.arange(top_scores.size(1), device=device),
                           torch.arange(top_scores.size(1), device=device))
        keep = rank.argsort(dim=1)[:, :k]  # (A, K)
        beam_scores = top_scores.gather(1, keep)
        rows = (torch.arange(a, device=device)[:, None] * kk + top_beam.gather(1, keep)).view(-1)  # (A*K,)
        last = top_tok.gather(1, keep).view(-1)
        history = torch.cat([history.index_select(0, rows), last[:, None]], 1)
        attn_hist = None if attn_hist is None else attn_hist.index_select(0, rows)
        # rows stay in their blocks; after the first step every beam comes from its sentence's one row
        state = state.reorder(rows, within_sentences=True) if kk == k else state.expand(k)
        rules = rules.reorder(rows)
        bounds = best_possible(beam_scores, t, rules.limits.view(a, k)[:, 0], len_penalty, len_style)
        # a sentence whose beams are all dead (-inf: its limit forced EOS, e.g. an empty source) has nothing to find
        running = torch.tensor([bound > float("-inf") and (len(finished[s]) < k or finished[s][-1].norm_score < bound)
                                for s, bound in zip(sentences.tolist(), bounds.tolist())], device=device)
        if not running.any():
            break
        if not running.all():  # drop the rows of finished sentences
            blocks = running.nonzero().squeeze(1)
            rows = (blocks[:, None] * k + torch.arange(k, device=device)).view(-1)
            sentences, beam_scores, last = sentences[blocks], beam_scores[blocks], last[rows]
            history = history.index_select(0, rows)
            attn_hist = None if attn_hist is None else attn_hist.index_select(0, rows)
            state, rules = state.reorder(rows), rules.reorder(rows)
    return [f[:nbest] for f in finished]


def best_possible(beam_scores: torch.Tensor, t: int, limits: torch.Tensor, alpha: float, style: str) -> torch.Tensor:
    """(A,) the best normalised score a running hypothesis of each sentence could still finish with.

    beam_scores (A, K) hold t + 1 tokens; finishing adds EOS and at most `limit` steps are taken. A
    log-probability only falls with more tokens, so the bound is its current score divided by the
    length penalty at whichever end of [t + 2, limit + 1] divides it most favourably.
    """
    best = beam_scores.max(dim=1).values  # (A,)
    shortest = best / length_penalty(t + 2, alpha, style)
    longest = best / length_penalty(limits.to(best.dtype) + 1, alpha, style)
    return torch.maximum(shortest, longest)


def _pad(scores: torch.Tensor, beams: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """(A, n < K) candidates -> (A, K), the added ones scored -inf (they never finish nor win)."""
    a, n = scores.shape
    return (torch.cat([scores, scores.new_full((a, k - n), float("-inf"))], 1),
            torch.cat([beams, beams.new_zeros(a, k - n)], 1), torch.cat([tokens, tokens.new_zeros(a, k - n)], 1))


def _finish(finished: list[list[Hypothesis]], sentences: torch.Tensor, history: torch.Tensor,
            attn_hist: torch.Tensor | None, top_scores: torch.Tensor, top_beam: torch.Tensor,
            is_eos: torch.Tensor, k: int, kk: int, alpha: float, style: str) -> None:
    """Record the EOS candidates ranked among the first K of each sentence; each keeps its K best, best first.
    Candidate j of sentence a extends row a * kk + top_beam[a, j] (kk rows per sentence)."""
    a_idx, j_idx = (is_eos[:, :k]).nonzero(as_tuple=True)
    for a, j in zip(a_idx.tolist(), j_idx.tolist()):
        sent = int(sentences[a])
        row = a * kk + int(top_beam[a, j])
        tokens = history[row].tolist()
        score = float(top_scores[a, j])
        norm = score / length_penalty(len(tokens) + 1, alpha, style)
        if len(finished[sent]) >= k and norm <= finished[sent][-1].norm_score:
            continue
        attention = None if attn_hist is None else attn_hist[row].cpu()
        finished[sent].append(Hypothesis(tokens, score, norm, attention))
        finished[sent].sort(key=lambda h: -h.norm_score)  # best first; keep the K best
        del finished[sent][k:]
