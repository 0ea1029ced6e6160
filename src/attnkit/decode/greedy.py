"""Left-to-right decoding with the key/value cache: greedy search and sampling.

B batch, S source length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnkit.decode.search import Hypothesis, StepRules, filter_logits, max_lengths, row_argmax, search

Pick = Callable[[torch.Tensor], torch.Tensor]  # constrained log-probs (A, V) -> chosen tokens (A,)


def greedy_search(model, src: torch.Tensor, **kw) -> list[list[Hypothesis]]:
    """The most probable token at every step; one hypothesis per sentence."""
    return left_to_right(model, src, row_argmax, **kw)


def sample(model, src: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None, **kw) -> list[list[Hypothesis]]:
    """Ancestral sampling from the (temperature-scaled, top-k / nucleus-filtered) distribution."""

    def pick(logp: torch.Tensor) -> torch.Tensor:
        probs = filter_logits(logp / max(temperature, 1e-6), top_k, top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return left_to_right(model, src, pick, **kw)


@search
def left_to_right(model, src: torch.Tensor, pick: Pick, *, max_len_a: float = 1.2, max_len_b: int = 10,
                  max_len: int = 0, min_len: int = 0, prefix: torch.Tensor | None = None, no_repeat_ngram: int = 0,
                  need_attention: bool = False, attention_layer: int = -1) -> list[list[Hypothesis]]:
    """Decode every sentence one token at a time until EOS or its length limit.

    Finished sentences leave the batch (their rows are dropped from the decoder state), so the cost
    follows the sentences still running.
    """
    b = src.size(0)
    rules = StepRules(max_lengths(src, max_len_a, max_len_b, max_len, prefix), min_len, prefix,
                      no_repeat_ngram)
    steps = int(rules.limits.max()) + 1
    state = model.init_state(model.encode(src))
    active = torch.arange(b, device=src.device)  # original sentence of each state row
    last = torch.full((b,), BOS_ID, dtype=torch.long, device=src.device)
    out = torch.full((b, steps), PAD_ID, dtype=torch.long, device=src.device)
    scores = torch.zeros(b, device=src.device)
    attn: list[list[torch.Tensor]] = [[] for _ in range(b)]
    for t in range(steps):
        logp, state, cross = model.step(last, state, need_weights=need_attention)  # (A, V)
        rows = slice(None) if active.numel() == b else active  # every sentence still running: no gathers
        logp = rules.apply(logp, t, out[rows, :t])
        best = pick(logp)  # (A,)
        scores[rows] += logp.gather(1, best[:, None]).squeeze(1)
        out[rows, t] = best
        if need_attention:
            for row, w in zip(active.tolist(), cross[attention_layer].float().cpu()):
                attn[row].append(w)
        ended = best.eq(EOS_ID)
        if ended.any():
            if ended.all():
                break
            keep = ended.logical_not_().nonzero().squeeze(1)
            state, rules, active, best = state.reorder(keep), rules.reorder(keep), active[keep], best[keep]
        last = best
    hyps = []
    for row, ids in enumerate(out.tolist()):
        tokens = ids[: ids.index(EOS_ID)] if EOS_ID in ids else [i for i in ids if i != PAD_ID]
        score = float(scores[row])
        hyps.append([Hypothesis(tokens, score, score, torch.stack(attn[row]) if need_attention else None)])
    return hyps
