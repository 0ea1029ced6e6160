"""Batched greedy decoding with the key/value cache.

B batch, S source length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypotheses:
    tokens: list[list[int]]  # without BOS, up to and excluding EOS
    scores: torch.Tensor  # (B,) summed log-probabilities, EOS included when produced
    attention: list[torch.Tensor] | None = None  # per sentence (len(tokens)+1, H, S) last-layer cross-attention


def max_lengths(src: torch.Tensor, a: float, b: int) -> torch.Tensor:
    """Per-sentence decoding limit a * |src| + b, |src| without padding."""
    return (src.ne(PAD_ID).sum(1).float() * a + b).long().clamp(min=1)


@torch.no_grad()
def greedy_search(model, src: torch.Tensor, *, max_len_a: float = 1.2, max_len_b: int = 10,
                  min_len: int = 0, need_attention: bool = False) -> Hypotheses:
    """Pick the most probable token at every step until EOS or the length limit.

    Finished sentences leave the batch (their rows are dropped from the decoder state), so the cost
    follows the sentences still running.
    """
    b = src.size(0)
    limits = max_lengths(src, max_len_a, max_len_b)  # (B,)
    state = model.init_state(model.encode(src))
    active = torch.arange(b, device=src.device)  # original row of each state row
    last = torch.full((b,), BOS_ID, dtype=torch.long, device=src.device)
    out = torch.full((b, int(limits.max()) + 1), PAD_ID, dtype=torch.long, device=src.device)
    scores = torch.zeros(b, device=src.device)
    attn: list[list[torch.Tensor]] = [[] for _ in range(b)]
    for t in range(int(limits.max()) + 1):
        logp, state, cross = model.step(last, state, need_weights=need_attention)  # (A, V)
        if t < min_len:
            logp[:, EOS_ID] = float("-inf")
        at_limit = t >= limits[active]
        best = torch.where(at_limit, EOS_ID, logp.argmax(-1))  # (A,)
        scores[active] += logp.gather(1, best[:, None]).squeeze(1)
        out[active, t] = best
        if need_attention:
            for row, w in zip(active.tolist(), cross.float().cpu()):
                attn[row].append(w)
        running = best.ne(EOS_ID)
        if not running.any():
            break
        if not running.all():
            keep = running.nonzero().squeeze(1)
            state, active, best = state.reorder(keep), active[keep], best[keep]
        last = best
    tokens = [_until_eos(row) for row in out.tolist()]
    attention = [torch.stack(a) for a in attn] if need_attention else None
    return Hypotheses(tokens, scores, attention)


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else [i for i in ids if i != PAD_ID]
