"""Moses tokenization + subword-nmt BPE: the text pipeline of fairseq's released translation models (and of most
2016-2019 NMT), as a tokenizer in attnkit's ids.

    encode: text -> Moses tokens (sacremoses: split punctuation, escape & < > ' " | [ ] as HTML entities, split
            dashes "a-b" -> "a @-@ b") -> BPE (subword-nmt: codes applied in priority order, "@@" ending every
            piece that a word continues after) -> pieces -> ids (a piece the vocabulary lacks: UNK)
    decode: ids -> pieces (UNK, PAD, BOS dropped; EOS ends) -> join, remove "@@ " -> Moses detokenize (unescape)

fairseq's own pipeline is the same two libraries with the same settings (fairseq.data.encoders' `moses` and
`subword_nmt`); tests/test_moses_bpe.py checks the two agree with fairseq itself as the oracle. Each side of a
model has its own tokenizer, which tokenizes with its own language's Moses rules and detokenizes with them; fairseq
tokenizes with the source's and detokenizes with the target's, which is the same for every decoded sentence.

Stored in checkpoints as bytes (`to_bytes`: MAGIC, then JSON: the codes, the pieces in attnkit's row order and the
Moses settings), so a checkpoint holds everything it needs, as it holds a sentencepiece model.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from attnkit.config import UNK_ID
from attnkit.data.tokenizer import content_ids
from attnkit.errors import ConfigError, DataError

MAGIC = b"attnkit-moses-bpe\n"  # the stored form's first bytes (a sentencepiece model never starts so)
SEPARATOR = "@@"  # subword-nmt's and fairseq's default: a piece followed by another of the same word ends in it
INSTALL = "pip install sacremoses subword-nmt (or attnkit[moses])"


def check_codes(text: str, where: str) -> None:
    """DataError naming the line of a subword-nmt codes file that is not `LEFT RIGHT` (subword-nmt itself would
    exit the process); an optional `#version: 0.2` first line. fastBPE's `LEFT RIGHT COUNT` lines are refused."""
    lines = text.rstrip("\n").split("\n")
    first = 1 if lines and lines[0].startswith("#version:") else 0
    if first == len(lines):
        raise DataError(f"{where}: no BPE codes (a subword-nmt codes file holds one 'LEFT RIGHT' merge per line)")
    for n, line in enumerate(lines[first:], first + 1):
        if len(line.strip("\r\n ").split(" ")) != 2:
            count = " (fastBPE's 'LEFT RIGHT COUNT': attnkit reads subword-nmt's codes)" if len(
                line.split()) == 3 else ""
            raise DataError(f"{where}:{n}: not a merge 'LEFT RIGHT'{count}: {line[:60]!r}")


def _libraries() -> tuple[Any, Any]:
    try:
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE
    except ImportError:
        raise ConfigError(f"a Moses + BPE tokenizer (fairseq's released models) needs sacremoses and subword-nmt: "
                          f"{INSTALL}") from None
    return (MosesTokenizer, MosesDetokenizer), BPE


@dataclass(frozen=True, eq=False)
class MosesBPETokenizer:
    """Text <-> ids through Moses (language `lang`; None: the text is split at spaces only, as for a model trained
    on text tokenized otherwise) and BPE `codes`, into the rows `names` (attnkit's ids: PAD, BOS, EOS, UNK first)."""

    codes: str
    names: list[str]
    lang: str | None = "en"
    escape: bool = True  # fairseq's default (--moses-no-escape turns it off)
    dash_splits: bool = True  # fairseq's default aggressive_dash_splits (--moses-no-dash-splits turns it off)
    separator: str = SEPARATOR
    _index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self):
        check_codes(self.codes, "the BPE codes")
        if len(self.names) <= UNK_ID:
            raise DataError(f"a vocabulary of {len(self.names)} names lacks attnkit's four special rows")
        object.__setattr__(self, "_index", {n: i for i, n in reversed(list(enumerate(self.names))) if i > UNK_ID})

    @cached_property
    def _pipeline(self) -> tuple[Any, Any, Any]:
        (tokenizer, detokenizer), bpe = _libraries()
        moses = (tokenizer(self.lang), detokenizer(self.lang)) if self.lang else (None, None)
        return *moses, bpe(io.StringIO(self.codes), separator=self.separator)

    @property
    def vocab_size(self) -> int:
        return len(self.names)

    def segment(self, text: str) -> list[str]:
        """The pieces of one text, as fairseq's pipeline gives them to its dictionary."""
        tok, _, bpe = self._pipeline
        if tok is not None:
            text = tok.tokenize(text, aggressive_dash_splits=self.dash_splits, return_str=True, escape=self.escape)
        return bpe.process_line(text).split()

    def encode(self, texts: list[str], dropout: float = 0.0) -> list[list[int]]:
        """Ids without BOS/EOS (a piece the vocabulary lacks: UNK, as fairseq's dictionary reads it)."""
        if dropout:
            raise ConfigError("BPE-dropout draws from a sentencepiece model; this model's BPE is subword-nmt's")
        return [[self._index.get(p, UNK_ID) for p in self.segment(text)] for text in texts]

    def decode(self, ids_batch: Iterable[Iterable[int]]) -> list[str]:
        """Text of model outputs: up to the first EOS, without PAD/BOS/UNK, BPE joined, Moses detokenized (fairseq's
        decode, but UNK dropped as sentencepiece drops it where fairseq writes "<unk>")."""
        _, detok, _ = self._pipeline
        out = []
        for ids in ids_batch:
            # UNK is fairseq's "<unk>" deleted: it still ends the word it was in ("c@@ <unk> the" -> "c the")
            joined = " ".join("" if i == UNK_ID else self.names[i] for i in content_ids(ids))
            words = (joined + " ").replace(self.separator + " ", "").split()
            out.append(detok.detokenize(words) if detok is not None else " ".join(words))
        return out

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.names[int(i)] for i in ids]

    def piece_id(self, piece: str) -> int:
        return self._index.get(piece, UNK_ID)

    def to_bytes(self) -> bytes:
        fields = {"codes": self.codes, "names": self.names, "lang": self.lang, "escape": self.escape,
                  "dash_splits": self.dash_splits, "separator": self.separator}
        return MAGIC + json.dumps(fields, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_bytes(cls, b: bytes) -> MosesBPETokenizer:
        if not b.startswith(MAGIC):
            raise DataError("not a Moses + BPE tokenizer")
        try:
            fields = json.loads(b[len(MAGIC):].decode("utf-8"))
            return cls(**fields)
        except (ValueError, TypeError) as e:
            raise DataError(f"a damaged Moses + BPE tokenizer ({e})") from None


__all__ = ["INSTALL", "MAGIC", "MosesBPETokenizer", "check_codes"]
