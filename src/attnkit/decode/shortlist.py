"""A lexical shortlist in decoding: each sentence's output is drawn from the target ids its source tokens allow
(Marian's `--shortlist`, which the Bergamot / Firefox models ship: `lex.*.s2t.bin`, read by
attnkit.formats.marian_shortlist), the softmax taken over those ids alone, as Marian scores only their rows.

B batch (rows), S source length, V target vocabulary.

`Shortlist` is the file's table in its own (Marian's) ids and `select` Marian's choice for one sentence;
`VocabShortlist` ties it to a checkpoint's ids (attnkit's rows are not Marian's: attnkit.formats.marian_bergamot)
and is what a checkpoint stores (`to_tensors`); `Shortlisted` wraps a model so that every search runs on it
unchanged: its `step` renormalises the model's log-probabilities over each row's allowed ids,

    log p_S(y) = log p(y) - logsumexp_{y' in S} log p(y')   (y in S; -inf elsewhere),

which equals a log-softmax over the allowed rows' logits alone (Marian's arithmetic), and its state carries each
row's allowed ids (B, V) through beam search's expand and reorder. The selection is per sentence, so a translation
does not depend on the batch it is in (Marian unites a batch's selections). Forced scoring does not use it. Every
logit is still computed: scoring only the allowed rows (the shortlist's speed) is for a later step.
tests/test_bergamot.py checks the imported models with their shortlists against the native engine, and
tests/test_ssru.py the renormalisation and the states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import PAD_ID


@dataclass(frozen=True)
class Shortlist:
    """A binary shortlist read: the frequent-target count `first_num`, `best_num`, and per source id its allowed
    target ids (`offsets` int64 [n + 1], `targets` int64 [m]), in the file's ids."""

    first_num: int
    best_num: int
    offsets: torch.Tensor
    targets: torch.Tensor

    @property
    def source_size(self) -> int:
        return self.offsets.numel() - 1

    def frequent(self) -> torch.Tensor:
        """The ids always allowed: 0 .. first_num-1."""
        return torch.arange(self.first_num)

    def allowed(self, source_id: int) -> torch.Tensor:
        """The target ids source id `source_id` allows, sorted."""
        if not 0 <= source_id < self.source_size:
            raise IndexError(f"source id {source_id} is outside the shortlist's {self.source_size} ids")
        return self.targets[int(self.offsets[source_id]):int(self.offsets[source_id + 1])]

    def select(self, source_ids: Iterable[int], vocab_size: int, *, shared: bool) -> torch.Tensor:
        """The sorted target ids the output layer scores for a sentence of `source_ids` (with its end-of-sentence
        id), as Marian's `generate`; `shared`: source and target share one vocabulary (the Bergamot models' one
        sentencepiece model for both sides), which adds the source ids themselves."""
        keep = torch.zeros(vocab_size, dtype=torch.bool)
        keep[:min(self.first_num, vocab_size)] = True
        src = torch.unique(torch.as_tensor(list(source_ids), dtype=torch.int64))
        if shared:
            keep[src] = True
        for s in src.tolist():
            keep[self.allowed(s)] = True
        missing = (-int(keep.sum())) % 8
        if missing:
            free = (~keep[self.first_num:]).nonzero().flatten()[:missing] + self.first_num
            keep[free] = True
        return keep.nonzero().flatten()


@dataclass(frozen=True)
class VocabShortlist:
    """A shortlist over a model's ids: `src_ids` (V_src,) maps a source row to the shortlist's source id,
    `tgt_rows` (V_lex,) a shortlist target id to the model's target row; `shared` as `Shortlist.select`'s."""

    lex: Shortlist
    src_ids: torch.Tensor
    tgt_rows: torch.Tensor
    shared: bool

    def mask(self, src: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """src (B, S) (PAD-padded) -> (B, V) True at the target rows each sentence may produce."""
        keep = torch.zeros(src.size(0), vocab_size, dtype=torch.bool)
        for row, ids in enumerate(src.cpu()):
            chosen = self.lex.select(self.src_ids[ids[ids.ne(PAD_ID)]].tolist(), self.tgt_rows.numel(),
                                     shared=self.shared)
            keep[row, self.tgt_rows[chosen]] = True
        return keep.to(src.device)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores (attnkit.checkpoint: `shortlist.<name>`)."""
        header = torch.tensor([self.lex.first_num, self.lex.best_num, int(self.shared)])
        return {"header": header, "offsets": self.lex.offsets, "targets": self.lex.targets, "src_ids": self.src_ids,
                "tgt_rows": self.tgt_rows}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor]) -> VocabShortlist:
        first, best, shared = (int(v) for v in t["header"])
        return cls(Shortlist(first, best, t["offsets"].long(), t["targets"].long()), t["src_ids"].long(),
                   t["tgt_rows"].long(), bool(shared))


@dataclass
class ShortlistState:
    """The model's decoder state and each row's allowed target rows (B, V), row for row."""

    inner: object
    allowed: torch.Tensor

    def expand(self, beams: int) -> ShortlistState:
        return ShortlistState(self.inner.expand(beams), self.allowed.repeat_interleave(beams, 0))

    def reorder(self, indices: torch.Tensor, *, within_sentences: bool = False) -> ShortlistState:
        return ShortlistState(self.inner.reorder(indices, within_sentences=within_sentences),
                              self.allowed.index_select(0, indices))


class Shortlisted(nn.Module):
    """`Shortlisted(model, shortlist)`: the model decoding over each sentence's shortlist (the module docstring);
    the encode / init_state / step interface of the seq2seq models, so every search runs on it."""

    def __init__(self, model: nn.Module, shortlist: VocabShortlist):
        super().__init__()
        self.model, self.shortlist = model, shortlist
        self.config = model.config

    def encode(self, src: torch.Tensor, **kw) -> tuple[object, torch.Tensor]:
        return self.model.encode(src, **kw), self.shortlist.mask(src, self.config.tgt_vocab_size)

    def init_state(self, encoded: tuple[object, torch.Tensor]) -> ShortlistState:
        enc, allowed = encoded
        return ShortlistState(self.model.init_state(enc), allowed)

    def step(self, tokens: torch.Tensor, state: ShortlistState, *, need_weights: bool = False
             ) -> tuple[torch.Tensor, ShortlistState, list[torch.Tensor] | None]:
        """tokens (B,) -> log-probabilities over each row's shortlist (B, V), -inf outside it; new state; weights."""
        logp, inner, cross = self.model.step(tokens, state.inner, need_weights=need_weights)
        logp = logp.masked_fill(~state.allowed, float("-inf"))  # (B, V)
        return logp - logp.logsumexp(-1, keepdim=True), ShortlistState(inner, state.allowed), cross


__all__ = ["Shortlist", "Shortlisted", "ShortlistState", "VocabShortlist"]
