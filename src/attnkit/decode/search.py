"""What every search shares: hypotheses, length limits and the per-step rules on log-probabilities.

N rows (sentences x beams), V vocabulary, t tokens produced so far.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@contextlib.contextmanager
def evaluating(model) -> Iterator[None]:
    """The model in eval mode (no dropout; the incremental step refuses training mode) for the length of a
    search, then back in the mode it was in."""
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def search(fn: Callable) -> Callable:
    """A search `fn(model, src, ...)` runs under inference_mode with the model in eval mode (restored after)."""

    @functools.wraps(fn)
    def run(model, *args, **kw):
        with torch.inference_mode(), evaluating(model):
            return fn(model, *args, **kw)

    return run


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # summed log-probability, EOS included when produced
    norm_score: float  # the score the search ranked by (after any length normalisation)
    attention: torch.Tensor | None = None  # (len(tokens) + 1, H, S) cross-attention of the chosen layer
    unmet: tuple[int, ...] = ()  # the constraints a constrained search could not place (attnkit.decode.constrained)


def max_lengths(src: torch.Tensor, a: float, b: int, cap: int = 0, prefix: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Per-sentence output limit a * |src| + b (|src| counting real tokens only), at most `cap` if set.

    A source without content (its EOS alone: an empty or blank line, or one of characters the tokenizer drops)
    gets 0: its translation is empty, as CTranslate2 answers it, not whatever the model makes of nothing; the
    search still scores that EOS. A forced `prefix` (N, P) keeps its row's limit."""
    real = src.ne(PAD_ID).sum(1)  # (N,) with the EOS
    limits = (real.float() * a + b).long().clamp(min=1)
    limits = limits.clamp(max=cap) if cap > 0 else limits
    empty = real.le(1)
    if prefix is not None and prefix.size(1):
        empty &= prefix[:, 0].eq(PAD_ID)
    return limits.masked_fill(empty, 0)


def length_penalty(length: int | torch.Tensor, alpha: float, style: str = "gnmt") -> float | torch.Tensor:
    """GNMT's ((5 + |Y|) / 6)^alpha (Wu et al. 2016), or plain |Y|^alpha (alpha 1 = per-token average)."""
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    return (1.0 * length) ** alpha


@dataclass
class StepRules:
    """Constraints applied to each step's log-probs, row by row.

    limits (N,): the step at which EOS is forced; min_len: EOS is banned before it; prefix (N, P):
    forced first tokens (PAD where a row's prefix has ended); no_repeat_ngram: no n-gram twice. PAD and BOS
    are never produced: label smoothing gives them probability mass that a search would otherwise spend
    (fairseq bans them too).
    """

    limits: torch.Tensor
    min_len: int = 0
    prefix: torch.Tensor | None = None
    no_repeat_ngram: int = 0

    first_limit: int | None = None  # no row is at its limit before this step (None: computed)

    def __post_init__(self) -> None:
        if self.first_limit is None:
            self.first_limit = int(self.limits.min()) if self.limits.numel() else 0

    def reorder(self, rows: torch.Tensor) -> StepRules:
        """The rules of the rows selected; the first limit stays a lower bound (no sync per step)."""
        prefix = None if self.prefix is None else self.prefix.index_select(0, rows)
        return StepRules(self.limits.index_select(0, rows), self.min_len, prefix, self.no_repeat_ngram,
                         self.first_limit)

    def apply(self, logp: torch.Tensor, t: int, history: torch.Tensor) -> torch.Tensor:
        """logp (N, V) at output position t, history (N, t) -> the constrained log-probs, written into logp
        itself (the model's fresh output) and returned."""
        forcing = self.prefix is not None and t < self.prefix.size(1)
        repeats = bool(self.no_repeat_ngram and t + 1 >= self.no_repeat_ngram)
        if forcing:  # the prefix wins even where another rule bans its token: read it before any ban
            forced = self.prefix[:, t]  # (N,)
            rows = forced.ne(PAD_ID).nonzero().squeeze(1)
            kept = logp[rows, forced[rows]]
        logp[:, PAD_ID] = float("-inf")
        logp[:, BOS_ID] = float("-inf")
        if t < self.min_len:
            logp[:, EOS_ID] = float("-inf")
        if repeats:
            self._ban_repeats(logp, history)
        if forcing:
            logp[rows] = float("-inf")
            logp[rows, forced[rows]] = kept
        if t < self.first_limit and not repeats:  # no row is at its limit yet: nothing to check
            return logp
        at_limit = self.limits.le(t)  # (N,)
        if repeats:  # a row whose every token is banned (e.g. no_repeat_ngram 1 after all were used) ends here
            at_limit = at_limit | torch.isneginf(logp).all(dim=1)
        if at_limit.any():
            eos = logp[at_limit, EOS_ID]
            logp[at_limit] = float("-inf")
            logp[at_limit, EOS_ID] = eos.clamp(min=-1e4)  # EOS stays possible even if it was banned
        return logp

    def _ban_repeats(self, logp: torch.Tensor, history: torch.Tensor) -> None:
        n = self.no_repeat_ngram
        for row, seq in enumerate(history.tolist()):
            tail = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
            banned = [seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i : i + n - 1]) == tail]
            if banned:
                logp[row, banned] = float("-inf")


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the top-k tokens and the smallest set whose probability reaches top_p (Holtzman et al. 2020)."""
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches top_p
        drop[:, 0] = False  # the most likely token always stays (a top_p below float32's range would drop it)
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits



_BLOCK = 64  # entries per block in the block-maxima searches below


def _blocks(x: torch.Tensor, least: int) -> torch.Tensor | None:
    """(N, V) -> a (N, V / 64, 64) view when V splits into more than `least` whole blocks, else None."""
    n, v = x.shape
    return x.view(n, v // _BLOCK, _BLOCK) if v % _BLOCK == 0 and v // _BLOCK > least and x.is_contiguous() else None


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(1) for (N, V) rows (the first index of each row's maximum), by block maxima.

    torch's CPU argmax tracks an index per element; a vectorised max over blocks of 64, then argmax among the
    N x V/64 maxima and inside the one winning block, does far less work and finds the same index, ties and NaN
    included (tests/test_decode.py; `attnkit bench --workloads mt-greedy` times the search).
    """
    blocks = _blocks(x, 1)
    if blocks is None:
        return x.argmax(1)
    first = blocks.amax(2).argmax(1)  # (N,) the first block that holds the row's maximum
    inner = blocks[torch.arange(x.size(0), device=x.device), first].argmax(1)  # (N,)
    return first * _BLOCK + inner


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k, dim=1) for (N, V) rows: values and indices (N, k), largest first.

    The k largest entries of a row lie in the k blocks of 64 with the largest maxima (a block that holds
    one of them has a maximum at least as large), so a vectorised max pass over the blocks and a top-k over
    k * 64 candidates find them; which of several equal entries is returned may differ from torch.topk.
    """
    blocks = _blocks(x, k)
    if blocks is None:
        return x.topk(k, dim=1)
    n = x.size(0)
    chosen = blocks.amax(2).topk(k, dim=1).indices  # (N, k) block numbers
    cand = blocks.gather(1, chosen[:, :, None].expand(n, k, _BLOCK)).view(n, k * _BLOCK)  # (N, k*64)
    values, pos = cand.topk(k, dim=1)
    return values, chosen.gather(1, pos // _BLOCK) * _BLOCK + pos % _BLOCK
