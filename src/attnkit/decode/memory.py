"""How much memory a search needs, so that a batch is cut to fit and a request that cannot fit is refused.

A beam of K over a vocabulary of V scores K * V continuations per sentence and step, and keeps every
layer's keys and values for each of the K hypotheses: `--beam 100000` on an 8k vocabulary is 8 x 10^8 float32
logits alone, several times over once they are log-softmaxed, ranked and reordered. The estimate below is
deliberately an upper bound (every buffer of a step counted as live at once); a test checks it against
the memory a search really takes.

`plan_batches` turns the estimate into batches: sources sorted by length (less padding), grouped up to a batch
size and a token count, and each group halved until its search fits the budget (tests/test_memory_budget.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.errors import ConfigError
from attnkit.runtime import available_memory

FLOAT = 4  # bytes: decoding runs in float32 (bf16 autocast only shrinks it)


@dataclass(frozen=True)
class SearchShape:
    """What a search's memory depends on: the model's sizes and the request's."""

    vocab: int  # target vocabulary
    width: int  # d_model (Transformer) or hidden (RNN)
    layers: int  # decoder layers
    heads: int
    ffn: int  # the feed-forward inner size (Transformer) or the width (RNN)

    @classmethod
    def of(cls, config) -> SearchShape:
        width = getattr(config, "d_model", None) or config.hidden
        return cls(vocab=config.tgt_vocab_size, width=width, layers=config.n_decoder_layers,
                   heads=getattr(config, "n_heads", 1), ffn=getattr(config, "d_ff", width))


def search_bytes(shape: SearchShape, *, sentences: int, expand: int, src_len: int, out_len: int,
                 need_attention: bool = False) -> int:
    """Peak bytes of one search: `sentences` of `src_len` tokens, `expand` rows each (beam or samples),
    up to `out_len` output tokens. An upper estimate."""
    rows, d = sentences * expand, shape.width
    per_row = (6 * shape.vocab  # logits, log-probs, masked and candidate scores, top-k workspace
               + 3 * 2 * shape.layers * out_len * d  # self-attention keys and values, reordered copy, new step
               + 2 * shape.layers * src_len * d  # cross-attention keys and values
               + shape.heads * (out_len + src_len)  # one step's attention weights
               + (2 * shape.heads * out_len * src_len if need_attention else 0)  # the attention kept per token
               + 4 * out_len)  # tokens, scores and back-pointers (int64 counted twice)
    encoder = sentences * src_len * (4 * d + shape.ffn + shape.heads * src_len)  # one layer's activations
    return FLOAT * (rows * per_row + encoder)


def gigabytes(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 / 10 else f"{n / 2**20:.0f} MB"


def default_budget(device: torch.device) -> int:
    """Half the memory available on `device` now (0, no limit, where it cannot be read)."""
    available = available_memory(device)
    return available // 2 if available else 0


def plan_batches(lengths: list[int], need: Callable[[int, int], int], *, batch_size: int, max_tokens: int,
                 budget: int, knob: tuple[str, int]) -> list[list[int]]:
    """The indices of `lengths` (source tokens, EOS included) in batches of rising length, each of at most
    `batch_size` sentences and (if set) `max_tokens` padded tokens, cut in halves until each search fits in
    `budget` bytes (0: no limit). `need(sentences, src_len)` estimates a search's bytes; `knob` (the option
    and its value, ("--beam", 5)) is what the error for a sentence that cannot fit alone tells to lower."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [part for group in by_size(order, lengths, batch_size, max_tokens)
            for part in halve_to_fit(group, lengths, need, budget, knob)]


def by_size(order: list[int], lengths: list[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Consecutive groups of `order` with at most batch_size items and (if set) max_tokens padded tokens."""
    groups, current, longest = [], [], 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and (len(current) >= batch_size or (max_tokens and new_longest * (len(current) + 1) > max_tokens)):
            groups.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    return groups + ([current] if current else [])


def halve_to_fit(idx: list[int], lengths: list[int], need: Callable[[int, int], int], budget: int,
                 knob: tuple[str, int]) -> list[list[int]]:
    """`idx` cut in halves until each part's search fits in `budget` bytes (0: no limit)."""
    needed = need(len(idx), max(lengths[i] for i in idx))
    if not budget or needed <= budget:
        return [idx]
    if len(idx) == 1:
        flag, value = knob
        raise ConfigError(f"{flag} {value} needs about {gigabytes(needed)} for one sentence of {lengths[idx[0]]} "
                          f"tokens, more than the {gigabytes(budget)} it may use: lower {flag}")
    half = len(idx) // 2
    return halve_to_fit(idx[:half], lengths, need, budget, knob) + halve_to_fit(idx[half:], lengths, need, budget, knob)


__all__ = ["SearchShape", "by_size", "default_budget", "gigabytes", "halve_to_fit", "plan_batches", "search_bytes"]
