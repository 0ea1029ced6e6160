"""Lexically constrained beam search: every glossary term found in a source appears in its translation (dynamic beam
allocation, Post & Vilar 2018).

One sentence at a time: K rows (beams), V vocabulary, C constraint tokens in all, t output position.

A constraint is a token sequence (a target term's pieces); a hypothesis meets it by producing those tokens in a row.
Each step the candidates are the K x V continuations' 2K best, every row's best token, and every row's next
constraint tokens: the next token of the constraint it is inside, or else the first token of each constraint it has
not met. A candidate's bank is the number of constraint tokens its hypothesis holds (met constraints in full, the one
it is inside so far). The K beams are filled from the banks in turn, the fullest bank first: hypotheses that placed
more of the terms keep places beside more probable ones that placed fewer, so the beam never fills with hypotheses
that would place none. EOS is allowed once every constraint is met; at the output limit (raised by C so the terms have
room) a hypothesis ends with what it has, and the constraints it did not meet are reported in `Hypothesis.unmet`,
never dropped silently. A hypothesis that met them all ranks above every one that did not.

tests/test_glossary.py checks that the terms appear, that a toy decoder with known probabilities gets its best
constrained output, and that a term that cannot fit is reported; benchmarks/glossary.py measures term use and BLEU.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from attnkit.data.glossary import Term
from attnkit.data.text import UNSPACED
from attnkit.data.tokenizer import BOS_ID, EOS_ID, UNK_ID
from attnkit.decode.beam import best_possible
from attnkit.decode.options import TermUse
from attnkit.decode.search import Hypothesis, StepRules, length_penalty, max_lengths, search

UNWRITABLE = "the target vocabulary cannot write it"  # TermUse.note of a term whose pieces include UNK
NO_ROOM = "not placed before the output limit"  # TermUse.note of a term the search could not fit


@dataclass(frozen=True)
class Progress:
    """How far one hypothesis is through its constraints: which it met, and the one it is inside (-1: none)."""

    met: tuple[bool, ...]
    inside: int = -1
    done: int = 0  # tokens of `inside` produced so far

    def bank(self, lengths: list[int]) -> int:
        return sum(n for n, m in zip(lengths, self.met) if m) + self.done

    @property
    def complete(self) -> bool:
        return all(self.met)

    def next_tokens(self, constraints: list[list[int]]) -> set[int]:
        if self.inside >= 0:
            return {constraints[self.inside][self.done]}
        return {c[0] for c, m in zip(constraints, self.met) if not m}

    def advance(self, token: int, constraints: list[list[int]]) -> Progress:
        """The progress after `token`: one more token of the constraint it is inside, or that constraint left (its
        tokens so far count for nothing) and perhaps another begun."""
        if self.inside >= 0:
            if constraints[self.inside][self.done] == token:
                return self._step(self.inside, self.done + 1, constraints)
            return Progress(self.met).advance(token, constraints)
        for i, c in enumerate(constraints):
            if not self.met[i] and c[0] == token:
                return self._step(i, 1, constraints)
        return self

    def _step(self, i: int, done: int, constraints: list[list[int]]) -> Progress:
        if done < len(constraints[i]):
            return Progress(self.met, i, done)
        return Progress(self.met[:i] + (True,) + self.met[i + 1 :])


@dataclass(frozen=True)
class Candidate:
    score: float
    row: int
    token: int
    progress: Progress


@search
def constrained_beam_search(model, src: torch.Tensor, constraints: list[list[int]], *, beam: int = 5, nbest: int = 1,
                            max_len_a: float = 1.2, max_len_b: int = 10, max_len: int = 0, min_len: int = 0,
                            len_penalty: float = 1.0, len_style: str = "length", no_repeat_ngram: int = 0,
                            need_attention: bool = False, attention_layer: int = -1) -> list[Hypothesis]:
    """The `nbest` best hypotheses for one source src (1, S) that contain every constraint, best first (ranked
    by score / length_penalty, those that met every constraint first)."""
    k, lengths = beam, [len(c) for c in constraints]
    base = max_lengths(src, max_len_a, max_len_b)
    limit = int(base + sum(lengths)) if int(base) else 0  # an empty source stays empty
    limit = min(limit, max_len) if max_len else limit
    rules = StepRules(torch.full((1,), limit, device=src.device), min_len, None, no_repeat_ngram)
    state = model.init_state(model.encode(src))
    scores = torch.zeros(1, device=src.device)  # (R,) R = 1 row, then K
    progress = [Progress((False,) * len(constraints))]
    history = torch.empty(1, 0, dtype=torch.long, device=src.device)  # (R, t)
    attn_hist: torch.Tensor | None = None  # (R, t, H, S)
    last = torch.full((1,), BOS_ID, dtype=torch.long, device=src.device)
    finished: list[Hypothesis] = []
    for t in range(limit + 1):
        logp, state, cross = model.step(last, state, need_weights=need_attention)  # (R, V)
        if need_attention:
            step_attn = cross[attention_layer][:, None].float()  # (R, 1, H, S)
            attn_hist = step_attn if attn_hist is None else torch.cat([attn_hist, step_attn], 1)
        logp = rules.apply(logp, t, history)
        if t < limit:  # before the limit a hypothesis ends only once its constraints are met
            logp[[r for r, p in enumerate(progress) if not p.complete], EOS_ID] = float("-inf")
        cands = _candidates(scores[:, None] + logp, progress, constraints, k)
        for c in cands:
            if c.token == EOS_ID:
                _finish(finished, c, history, attn_hist, k, len_penalty, len_style)
        chosen = _allocate([c for c in cands if c.token != EOS_ID], lengths, k)
        if not chosen or _settled(finished, chosen, t, limit, nbest, len_penalty, len_style):
            break
        chosen += [Candidate(float("-inf"), chosen[0].row, chosen[0].token, chosen[0].progress)] * (k - len(chosen))
        rows = torch.tensor([c.row for c in chosen], device=src.device)  # (K,)
        last = torch.tensor([c.token for c in chosen], device=src.device)
        scores = torch.tensor([c.score for c in chosen], device=src.device)
        progress = [c.progress for c in chosen]
        history = torch.cat([history.index_select(0, rows), last[:, None]], 1)
        attn_hist = None if attn_hist is None else attn_hist.index_select(0, rows)
        state = state.reorder(rows, within_sentences=True) if t else state.expand(k)
        rules = rules.reorder(rows) if t else StepRules(rules.limits.repeat(k), min_len, None, no_repeat_ngram)
    return finished[:nbest]


def _candidates(total: torch.Tensor, progress: list[Progress], constraints: list[list[int]], k: int
                ) -> list[Candidate]:
    """total (R, V): each continuation's score. The 2K best, each row's best, and each row's next constraint
    tokens; those scored -inf (banned, or a dead row) left out."""
    v = total.size(1)
    picks = {(i // v, i % v) for i in total.view(-1).topk(min(2 * k, total.numel())).indices.tolist()}
    picks |= set(enumerate(total.argmax(1).tolist()))
    picks |= {(r, tok) for r, p in enumerate(progress) for tok in p.next_tokens(constraints)}
    values = total[[r for r, _ in sorted(picks)], [tok for _, tok in sorted(picks)]].tolist()
    return sorted((Candidate(s, r, tok, progress[r].advance(tok, constraints))
                   for (r, tok), s in zip(sorted(picks), values) if s > float("-inf")),
                  key=lambda c: (-c.score, c.row, c.token))


def _allocate(cands: list[Candidate], lengths: list[int], k: int) -> list[Candidate]:
    """K candidates taken from the banks in turn, the fullest bank first, each bank's best first (`cands` come
    sorted by score)."""
    banks: dict[int, list[Candidate]] = defaultdict(list)
    for c in cands:
        banks[c.progress.bank(lengths)].append(c)
    order = sorted(banks, reverse=True)
    chosen: list[Candidate] = []
    while len(chosen) < k and any(banks.values()):
        for b in order:
            if banks[b] and len(chosen) < k:
                chosen.append(banks[b].pop(0))
    return chosen


def _finish(finished: list[Hypothesis], c: Candidate, history: torch.Tensor, attn_hist: torch.Tensor | None, k: int,
            alpha: float, style: str) -> None:
    """Record an ended hypothesis; the K best are kept, those that met every constraint first."""
    tokens = history[c.row].tolist()
    unmet = tuple(i for i, m in enumerate(c.progress.met) if not m)
    norm = c.score / length_penalty(len(tokens) + 1, alpha, style)
    attention = None if attn_hist is None else attn_hist[c.row].cpu()
    finished.append(Hypothesis(tokens, c.score, norm, attention, unmet))
    finished.sort(key=lambda h: (len(h.unmet), -h.norm_score))
    del finished[k:]


def _settled(finished: list[Hypothesis], running: list[Candidate], t: int, limit: int, n: int, alpha: float,
             style: str) -> bool:
    """The n best finished hypotheses met every constraint and no running one can still beat the n-th of them
    (scores only fall as tokens are added, so the bound is exact): the n returned are final. Waiting for K, as
    `beam_search` does, would change nothing returned; the banks leave few rows to the fullest bank, so K
    complete hypotheses come late, often at the output limit (benchmarks/glossary.py times the search)."""
    if len(finished) < n or finished[n - 1].unmet:
        return False
    best = torch.tensor([[max(c.score for c in running)]])
    return float(best_possible(best, t, torch.tensor([limit]), alpha, style)) <= finished[n - 1].norm_score


def unmet_in(tokens: list[int], constraints: list[list[int]]) -> tuple[int, ...]:
    """The constraints (indices) `tokens` does not hold, each occurrence held once: a term asked for twice needs two
    places of its own."""
    used: set[int] = set()
    unmet = []
    for c, ids in enumerate(constraints):
        at = next((i for i in range(len(tokens) - len(ids) + 1)
                   if tokens[i : i + len(ids)] == ids and not used & set(range(i, i + len(ids)))), None)
        if at is None:
            unmet.append(c)
        else:
            used |= set(range(at, at + len(ids)))
    return tuple(unmet)


@dataclass(frozen=True)
class SentenceTerms:
    """The glossary terms one source holds, with each target term's ids (None: the vocabulary cannot write it)."""

    terms: list[Term]
    ids: list[list[int] | None]

    @classmethod
    def of(cls, terms: list[Term], tok) -> SentenceTerms:
        ids = [term_tokens(tok, term.target) for term in terms]
        return cls(terms, [None if UNK_ID in t or not t else t for t in ids])

    @property
    def constraints(self) -> list[list[int]]:
        """What the search must place: the writable terms' ids."""
        return [t for t in self.ids if t is not None]

    def uses(self, unmet: tuple[int, ...]) -> list[TermUse]:
        """Each term's outcome, given the constraints (indices into `constraints`) a hypothesis left unmet."""
        out, c = [], 0
        for term, ids in zip(self.terms, self.ids):
            if ids is None:
                out.append(TermUse(term.source, term.target, False, UNWRITABLE))
                continue
            out.append(TermUse(term.source, term.target, c not in unmet, NO_ROOM if c in unmet else ""))
            c += 1
        return out


def term_tokens(tok, target: str) -> list[int]:
    """A target term's ids as it reads inside a sentence: in a script written without spaces, without the
    word-start mark sentencepiece puts before a text ("▁猫" -> "猫" where the vocabulary has it)."""
    ids = tok.encode([target])[0]
    pieces = tok.pieces(ids)
    if UNSPACED.match(target) and pieces and pieces[0].startswith("▁"):
        bare = pieces[0][1:]
        if not bare:
            return ids[1:]
        if tok.piece_id(bare) != UNK_ID:
            return [tok.piece_id(bare)] + ids[1:]
    return ids


__all__ = ["Progress", "SentenceTerms", "constrained_beam_search", "term_tokens", "unmet_in"]
