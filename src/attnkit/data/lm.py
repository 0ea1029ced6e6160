"""Language-model corpora: text -> vocabulary + one id stream per split -> ordered segment batches.

N corpus tokens, B parallel streams, L = N // B tokens per stream, T segment length (tgt_len).

Levels: `char` (every character, newlines included), `word` (whitespace tokens plus `<eos>` at the
end of every line, as WikiText and PTB are modelled) and `subword` (sentencepiece via
attnkit.data.tokenizer, `<eos>` = its EOS id per line).

Data folder layout (written by `prepare_lm`):
    corpus.safetensors    one int32 id stream per split (train, valid, test), the vocabulary in the metadata

Ordered batching (Dai et al. 2019, as in their reference code): the stream is cut into B contiguous
parts, one per batch row, and read T tokens at a time, so segment tau + 1 of row b continues segment
tau of row b — the memory a Transformer-XL carries from one batch to the next is the true left context.
With extended context E (the reference's `ext_len`), each segment's input also starts with the E tokens
before it (the end of the previous segment, read again): x is (B, <= E + T), y stays (B, <= T).
The corpus stays on the CPU; only the (B, T) batches move to the device.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import torch

from attnkit.data.text import check_unicode, read_lines
from attnkit.data.tokenizer import EOS_ID, SubwordTokenizer
from attnkit.errors import ConfigError, DataError
from attnkit.io import atomic_write_bytes, ensure_new_output

LEVELS = ("char", "word", "subword")
UNK, EOS = "<unk>", "<eos>"
CORPUS_FILE = "corpus.safetensors"


class LMVocab:
    """Text <-> ids at one level. Char and word vocabularies are token lists (id = index); a token the list lacks is
    read as `<unk>` (id 0 in the vocabularies attnkit builds; where an imported one keeps it)."""

    def __init__(self, level: str, tokens: list[str] | None = None, subword: SubwordTokenizer | None = None):
        if level not in LEVELS:
            raise ConfigError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
        self.level, self.tokens, self.subword = level, tokens or [], subword
        self.index = {tok: i for i, tok in enumerate(self.tokens)}
        self.unk = self.index.get(UNK, 0)

    @classmethod
    def build(cls, lines: list[str], level: str, vocab_size: int = 8000) -> LMVocab:
        """Learn the vocabulary of training lines: every character / word (most frequent first), or sentencepiece."""
        if level == "subword":
            return cls(level, subword=SubwordTokenizer.train(lines, vocab_size))
        counts = Counter(_units(lines, level))
        counts.pop(UNK, None)
        specials = [UNK, EOS] if level == "word" else [UNK]
        counts.pop(EOS, None)
        return cls(level, specials + [tok for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))])

    @property
    def vocab_size(self) -> int:
        return self.subword.vocab_size if self.subword is not None else len(self.tokens)

    def encode(self, lines: list[str]) -> np.ndarray:
        """Lines -> one int32 id stream (`<eos>` / newline after every line); a lone surrogate is refused, at every
        level, as the subword tokenizer refuses it."""
        if self.subword is not None:
            ids = [i for seq in self.subword.encode(lines) for i in [*seq, EOS_ID]]
        else:
            check_unicode(lines)
            ids = [self.index.get(tok, self.unk) for tok in _units(lines, self.level)]
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids: list[int]) -> str:
        if self.subword is not None:
            parts, line = [], []
            for i in ids:
                if int(i) == EOS_ID:
                    parts.append(self.subword.decode([line])[0] + "\n")
                    line = []
                else:
                    line.append(int(i))
            return "".join(parts) + (self.subword.decode([line])[0] if line else "")
        toks = [self.tokens[int(i)] for i in ids]
        if self.level == "char":
            return "".join(toks)
        text = " ".join(toks)  # words apart, every <eos> a line break without spaces around it
        return text.replace(f" {EOS} ", "\n").replace(f" {EOS}", "\n").replace(f"{EOS} ", "\n").replace(EOS, "\n")

    def to_json(self) -> str:
        if self.subword is not None:
            return json.dumps({"level": self.level, "sentencepiece": self.subword.to_bytes().hex()})
        return json.dumps({"level": self.level, "tokens": self.tokens}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> LMVocab:
        try:
            data = json.loads(text)
            if "sentencepiece" in data:
                return cls(data["level"], subword=SubwordTokenizer.from_bytes(bytes.fromhex(data["sentencepiece"])))
            return cls(data["level"], list(data["tokens"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DataError(f"not an LM vocabulary: {e}") from None

    def to_bytes(self) -> bytes:
        return self.to_json().encode("utf-8")

    @classmethod
    def from_bytes(cls, blob: bytes) -> LMVocab:
        return cls.from_json(blob.decode("utf-8"))


def _units(lines: list[str], level: str) -> Iterator[str]:
    """Characters with a newline after every line, or words with `<eos>` after every line."""
    for line in lines:
        if level == "char":
            yield from line
            yield "\n"
        else:
            yield from line.split()
            yield EOS


@dataclass
class LMCorpus:
    vocab: LMVocab
    splits: dict[str, torch.Tensor]  # name -> (N,) int64 ids, on the CPU

    def save(self, out_dir: str | os.PathLike) -> None:
        arrays = {name: ids.numpy().astype(np.int32) for name, ids in self.splits.items()}
        atomic_write_bytes(Path(out_dir) / CORPUS_FILE,
                           safetensors.numpy.save(arrays, metadata={"vocab": self.vocab.to_json()}))

    def summary(self) -> str:
        sizes = ", ".join(f"{name} {len(ids):,}" for name, ids in self.splits.items())
        return f"{self.vocab.level}-level vocabulary of {self.vocab.vocab_size:,}; tokens: {sizes}"


def load_lm_corpus(data_dir: str | os.PathLike) -> LMCorpus:
    path = Path(data_dir) / CORPUS_FILE
    if not path.is_file():
        raise DataError(f"no LM corpus in {data_dir} (expected {CORPUS_FILE}; run `attnkit lm prepare`)")
    data = path.read_bytes()
    try:
        arrays = safetensors.numpy.load(data)
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        vocab = LMVocab.from_json(header["__metadata__"]["vocab"])
    except (safetensors.SafetensorError, ValueError, KeyError) as e:
        raise DataError(f"{path} is not a readable LM corpus: {e}") from None
    return LMCorpus(vocab, {name: torch.from_numpy(a.astype(np.int64)) for name, a in arrays.items()})


def prepare_lm(out_dir: str | os.PathLike, train: str | os.PathLike | None, valid: str | os.PathLike | None = None,
               test: str | os.PathLike | None = None, *, level: str = "char", vocab_size: int = 8000,
               valid_fraction: float = 0.0, force: bool = False, vocab: LMVocab | None = None) -> LMCorpus:
    """Read text files (plain or .gz), learn the vocabulary on train (or take `vocab`: a model's, so that its
    checkpoint scores the splits), encode every split given, save.

    Without a valid file, `valid_fraction` > 0 holds out the end of train: the last fraction of its
    characters (char level: the vocabulary is then the whole file's, as nanoGPT's Shakespeare) or of its
    lines (word / subword level, the vocabulary learnt on the rest), e.g. 0.1 for Tiny Shakespeare's 90/10.
    """
    ensure_new_output(out_dir, force, "output folder")
    if valid_fraction and not 0 < valid_fraction < 1:
        raise ConfigError(f"valid fraction must be between 0 and 1, got {valid_fraction}")
    if train is None and vocab is None:
        raise ConfigError("prepare needs the training text to learn a vocabulary from (or a model's vocabulary)")
    level = vocab.level if vocab is not None else level
    train_lines = read_lines(train) if train is not None else None
    hold_out = not valid and valid_fraction > 0 and train_lines is not None
    valid_lines = read_lines(valid) if valid else None
    if hold_out and level != "char":
        cut = int(len(train_lines) * (1 - valid_fraction))
        train_lines, valid_lines = train_lines[:cut], train_lines[cut:]
    if vocab is None:
        try:
            vocab = LMVocab.build(train_lines, level, vocab_size)
        except DataError as e:  # e.g. sentencepiece finding no line it can learn from
            raise DataError(f"{train}: {e}") from None
    splits = {"train": train_lines, "valid": valid_lines, "test": read_lines(test) if test else None}
    ids = {name: torch.from_numpy(vocab.encode(lines).astype(np.int64))
           for name, lines in splits.items() if lines is not None}
    if hold_out and level == "char":
        cut = int(ids["train"].numel() * (1 - valid_fraction))
        ids["train"], ids["valid"] = ids["train"][:cut].clone(), ids["train"][cut:].clone()
    corpus = LMCorpus(vocab, {name: ids[name] for name in ("train", "valid", "test") if name in ids})
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    corpus.save(out_dir)
    return corpus


class LMStreams:
    """A (N,) id stream as B parallel rows read in segments of T: batch tau = (x, y), (B, <= E + T) and (B, <= T),
    where the first E = ext_len inputs (fewer in the first segment) are the context before the segment."""

    def __init__(self, ids: torch.Tensor, batch_size: int, tgt_len: int, ext_len: int = 0):
        n_per_stream = ids.numel() // batch_size
        if n_per_stream < 2:
            raise DataError(f"{ids.numel()} tokens are too few for {batch_size} streams")
        self.data = ids[: n_per_stream * batch_size].view(batch_size, n_per_stream)  # (B, L), row b = part b
        self.tgt_len, self.ext_len = tgt_len, ext_len

    def __len__(self) -> int:
        """Segments per pass: every position but the last of a row is an input (the last is only a target)."""
        return -(-(self.data.size(1) - 1) // self.tgt_len)

    @property
    def n_tokens(self) -> int:
        """Predicted tokens per pass."""
        return self.data.size(0) * (self.data.size(1) - 1)

    def batch(self, tau: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment tau: inputs data[:, tau*T-E : tau*T+T] (from 0 at most), targets data[:, tau*T+1 : tau*T+T+1]
        (the last segment shorter): the reference's LMOrderedIterator.get_batch."""
        start = tau * self.tgt_len
        end = min(start + self.tgt_len, self.data.size(1) - 1)
        return self.data[:, max(0, start - self.ext_len) : end], self.data[:, start + 1 : end + 1]  # (B, E+T), (B, T)

    def segments(self, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches start, start + 1, ... to the end of the pass (resuming mid-pass starts later)."""
        return (self.batch(tau) for tau in range(start, len(self)))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.segments(0)
