"""Batches for seq2seq training: padding, teacher-forcing shifts, and token-budget bucketing.

B batch, S source length, T target length (+1 for the BOS/EOS shift).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from attnkit.data.dataset import EncodedSplit
from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnkit.errors import ConfigError


@dataclass
class Batch:
    """Padded tensors of one batch; `indices` map rows back to examples (to restore corpus order)."""

    src: torch.Tensor  # (B, S) x + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + y: what the decoder reads
    tgt_out: torch.Tensor  # (B, T) y + EOS: what it must predict at each position
    indices: torch.Tensor  # (B,)

    @property
    def src_pad_mask(self) -> torch.Tensor:
        """(B, S) True at padding."""
        return self.src == PAD_ID

    @property
    def tgt_pad_mask(self) -> torch.Tensor:
        """(B, T) True at padding."""
        return self.tgt_out == PAD_ID

    @property
    def n_tokens(self) -> int:
        """Predicted target tokens (EOS included): the denominator of a per-token loss."""
        return int((self.tgt_out != PAD_ID).sum())

    @property
    def n_src_tokens(self) -> int:
        return int((self.src != PAD_ID).sum())

    def to(self, device: torch.device | str) -> Batch:
        """Copy to `device`; non_blocking overlaps the copy with compute when memory is pinned."""
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})

    def __len__(self) -> int:
        return self.src.shape[0]


def _pad_rows(rows: Sequence[Sequence[int]], prefix: int | None, suffix: int | None) -> torch.Tensor:
    """(B, L) long tensor of `[prefix] + row + [suffix]`, right-padded with PAD_ID."""
    extra = (prefix is not None) + (suffix is not None)
    out = np.full((len(rows), max(len(r) for r in rows) + extra), PAD_ID, dtype=np.int64)
    start = int(prefix is not None)
    for i, row in enumerate(rows):
        if prefix is not None:
            out[i, 0] = prefix
        out[i, start : start + len(row)] = row
        if suffix is not None:
            out[i, start + len(row)] = suffix
    return torch.from_numpy(out)


def collate(pairs: list[tuple[np.ndarray, np.ndarray]], indices: Sequence[int]) -> Batch:
    """Pad a list of (source ids, target ids) into a Batch with the teacher-forcing shift.

    The source gets an EOS too: it marks where the sentence ends and keeps an empty source line
    (possible in valid/test) from becoming a row with no key to attend to.
    """
    if not pairs:
        raise ValueError("cannot collate an empty batch")
    srcs, tgts = zip(*pairs)
    return Batch(
        src=_pad_rows(srcs, None, EOS_ID),
        tgt_in=_pad_rows(tgts, BOS_ID, None),
        tgt_out=_pad_rows(tgts, None, EOS_ID),
        indices=torch.as_tensor(np.asarray(indices, dtype=np.int64)),
    )


def _greedy_fill(costs: np.ndarray, max_tokens: int, max_sentences: int = 0) -> list[int]:
    """Start positions of batches over `costs` (already in batch order) under the padded budget and, when
    max_sentences > 0, at most that many examples each.

    A Python loop over plain ints, linear in the corpus (benchmarks/sampler_speed.py times an epoch's plan),
    and the running max makes a numpy formulation no clearer.
    """
    starts, n, longest = [0], 0, 0
    for i, c in enumerate(costs.tolist()):
        new_longest = max(longest, c)
        if n and ((n + 1) * new_longest > max_tokens or n == max_sentences):
            starts.append(i)
            n, new_longest = 0, c
        n, longest = n + 1, new_longest
    return starts


class TokenBatchSampler:
    """Length-bucketed batches of at most `max_tokens` padded tokens (source or target, whichever is longer),
    and of at most `max_sentences` examples when that is > 0 (batches of N sentences, as Kyubyong Park's).

    Sorting by length keeps padding small; shuffling the batch order (not the examples) keeps
    SGD noisy. With several ranks, batch i goes to rank i % world_size.
    """

    def __init__(
        self,
        src_lens: np.ndarray,
        tgt_lens: np.ndarray,
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        max_sentences: int = 0,
    ):
        if max_tokens < 1 or max_sentences < 0:
            raise ConfigError(f"max_tokens must be positive (and max_sentences not negative), got {max_tokens} "
                              f"and {max_sentences}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside world size {world_size}")
        self.src_lens, self.tgt_lens = np.asarray(src_lens, np.int64), np.asarray(tgt_lens, np.int64)
        if self.src_lens.shape != self.tgt_lens.shape:
            raise ValueError("src_lens and tgt_lens differ in length")
        self.max_tokens, self.max_sentences, self.shuffle, self.seed = max_tokens, max_sentences, shuffle, seed
        self.rank, self.world_size = rank, world_size

    def _costs(self) -> np.ndarray:
        """Padded length of each example once collated: source + EOS, target + BOS/EOS."""
        return np.maximum(self.src_lens + 1, self.tgt_lens + 1)

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed + epoch)
        tie = rng.random(len(self.src_lens)) if self.shuffle else np.arange(len(self.src_lens))
        order = np.lexsort((tie, self.tgt_lens, self.src_lens))  # last key is the primary one
        starts = _greedy_fill(self._costs()[order], self.max_tokens, self.max_sentences)
        batches = np.split(order, starts[1:]) if len(order) else []
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches for `epoch`; every rank gets the same count (the tail is dropped)."""
        batches = self._all_batches(epoch)
        usable = len(batches) // self.world_size * self.world_size
        return [b.tolist() for b in batches[self.rank : usable : self.world_size]]

    def __len__(self) -> int:
        return len(self.batches(0))


def iterate_batches(split: EncodedSplit, batch_index_lists: list[list[int]]) -> Iterator[Batch]:
    for indices in batch_index_lists:
        yield collate([split.pair(i) for i in indices], indices)
