"""Language-model corpora: text -> vocabulary + one id stream per split -> ordered segment batches.

N corpus tokens, B parallel streams, L = N // B tokens per stream, T segment length (tgt_len).

Levels: `char` (every character, newlines included), `word` (whitespace tokens plus `<eos>` at the
end of every line, as WikiText and PTB are modelled) and `subword` (sentencepiece via
attnkit.data.tokenizer, `<eos>` = its EOS id per line).

Data folder layout (written by `prepare_lm`, streaming: a corpus larger than memory prepares in flat memory):
    corpus.safetensors    one int32 id stream per split (train, valid, test), the vocabulary in the metadata;
                          memory-mapped when loaded, so training reads a segment at a time

Ordered batching (Dai et al. 2019, as in their reference code): the stream is cut into B contiguous
parts, one per batch row, and read T tokens at a time, so segment tau + 1 of row b continues segment
tau of row b — the memory a Transformer-XL carries from one batch to the next is the true left context.
With extended context E (the reference's `ext_len`), each segment's input also starts with the E tokens
before it (the end of the previous segment, read again): x is (B, <= E + T), y stays (B, <= T).
The corpus stays on the CPU; only the (B, T) batches move to the device.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.data.arrays import ArrayWriter, map_arrays
from attnkit.data.text import check_unicode, chunked, stream_lines
from attnkit.data.tokenizer import EOS_ID, SubwordTokenizer, TrainingTextError
from attnkit.errors import ConfigError, DataError
from attnkit.io import ensure_new_output

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
    def build(cls, lines: Iterable[str], level: str, vocab_size: int = 8000) -> LMVocab:
        """Learn the vocabulary of training lines (read once: a stream will do): every character / word (most
        frequent first), or sentencepiece."""
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


class _Int64Splits(Mapping):
    """The splits as (N,) int64 tensors in memory, each made when asked for (scoring reads valid or test whole)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def __getitem__(self, name: str) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.arrays[name], dtype=np.int64))

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


@dataclass
class LMCorpus:
    """A vocabulary and its id streams: `arrays` (N,) int32 numpy arrays, memory-mapped when loaded from disk (the
    training stream of a corpus larger than memory is read a segment at a time), `splits` the same as int64 tensors
    made on demand."""

    vocab: LMVocab
    arrays: dict[str, np.ndarray]

    @property
    def splits(self) -> Mapping[str, torch.Tensor]:
        return _Int64Splits(self.arrays)

    def save(self, out_dir: str | os.PathLike) -> None:
        with ArrayWriter(Path(out_dir) / CORPUS_FILE, dict.fromkeys(self.arrays, np.int32)) as out:
            for name, ids in self.arrays.items():
                out.append(name, ids)
            out.finish(metadata={"vocab": self.vocab.to_json()})

    def summary(self) -> str:
        sizes = ", ".join(f"{name} {len(ids):,}" for name, ids in self.arrays.items())
        return f"{self.vocab.level}-level vocabulary of {self.vocab.vocab_size:,}; tokens: {sizes}"


def load_lm_corpus(data_dir: str | os.PathLike) -> LMCorpus:
    """The corpus of a prepared folder, its id streams memory-mapped (nothing of them is read until used)."""
    path = Path(data_dir) / CORPUS_FILE
    if not path.is_file():
        raise DataError(f"no LM corpus in {data_dir} (expected {CORPUS_FILE}; run `attnkit lm prepare`)")
    arrays, metadata = map_arrays(path)
    if "vocab" not in metadata:
        raise DataError(f"{path} is not a readable LM corpus: no vocabulary in its metadata")
    try:
        vocab = LMVocab.from_json(metadata["vocab"])
    except DataError as e:
        raise DataError(f"{path} is not a readable LM corpus: {e}") from None
    return LMCorpus(vocab, arrays)


def _count_lines(path: str | os.PathLike) -> int:
    return sum(1 for _ in stream_lines(path))


def _learn_vocab(train: str | os.PathLike, level: str, vocab_size: int, lines: int | None) -> LMVocab:
    try:
        return LMVocab.build(itertools.islice(stream_lines(train), lines), level, vocab_size)
    except TrainingTextError as e:  # e.g. sentencepiece finding no line it can learn from
        raise DataError(f"{train}: {e}") from None


def _write_stream(out: ArrayWriter, vocab: LMVocab, lines: Iterable[str], name: str, *, rest: str | None = None,
                  cut: int = 0) -> None:
    """Encode `lines` a chunk at a time into array `name`; with `rest`, only the first `cut` tokens, the others into
    array `rest`."""
    written = 0
    for chunk in chunked(lines):
        ids = vocab.encode(chunk)
        head = len(ids) if rest is None else max(0, min(len(ids), cut - written))
        out.append(name, ids[:head])
        if head < len(ids):
            out.append(rest, ids[head:])
        written += len(ids)


def _check_request(out_dir: Path, valid, valid_fraction: float, level: str | None, vocab: LMVocab | None) -> None:
    """Refuse, in one line, what prepare_lm would otherwise have to ignore: a valid file and a fraction to hold out
    both giving the validation text, a level other than that of the vocabulary given (it decides the level), and an
    output that is a file (tests/test_data.py: test_lm_prepare_refuses_conflicting_requests_in_one_line)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"output folder '{out_dir}' is a file, not a folder")
    if valid_fraction and not 0 < valid_fraction < 1:
        raise ConfigError(f"valid fraction must be between 0 and 1, got {valid_fraction}")
    if valid and valid_fraction:
        raise ConfigError(f"--valid {valid} and --valid-fraction {valid_fraction:g} both give the validation text: "
                          "give one")
    if vocab is not None and level is not None and level != vocab.level:
        raise ConfigError(f"--level {level}, but the vocabulary given (--vocab-from) is {vocab.level}-level and "
                          "decides the level: drop --level")


def prepare_lm(out_dir: str | os.PathLike, train: str | os.PathLike | None, valid: str | os.PathLike | None = None,
               test: str | os.PathLike | None = None, *, level: str | None = None, vocab_size: int = 8000,
               valid_fraction: float = 0.0, force: bool = False, vocab: LMVocab | None = None) -> LMCorpus:
    """Read text files (plain or .gz), learn the vocabulary on train (or take `vocab`: a model's, so that its
    checkpoint scores the splits), encode every split given, save; the text streams from disk to disk, a pass to
    learn the vocabulary and one to encode, so that a corpus larger than memory prepares in flat memory.

    Without a valid file, `valid_fraction` > 0 holds out the end of train: the last fraction of its
    characters (char level: the vocabulary is then the whole file's, as nanoGPT's Shakespeare) or of its
    lines (word / subword level, the vocabulary learnt on the rest), e.g. 0.1 for Tiny Shakespeare's 90/10.
    `level`: char when None; with `vocab`, the vocabulary's level (another one is refused).
    """
    _check_request(ensure_new_output(out_dir, force, "output folder"), valid, valid_fraction, level, vocab)
    if train is None and vocab is None:
        raise ConfigError("prepare needs the training text to learn a vocabulary from (or a model's vocabulary)")
    level = vocab.level if vocab is not None else level or "char"
    for path in (valid, test):
        if path:
            next(stream_lines(path))  # a missing or empty file fails before the long passes over train
    hold_out = not valid and valid_fraction > 0 and train is not None
    kept_lines = int(_count_lines(train) * (1 - valid_fraction)) if hold_out and level != "char" else None
    vocab = vocab or _learn_vocab(train, level, vocab_size, kept_lines)
    path = Path(out_dir) / CORPUS_FILE
    names = [name for name, given in (("train", train), ("valid", valid or hold_out), ("test", test)) if given]
    with ArrayWriter(path, dict.fromkeys(names, np.int32)) as out:
        if hold_out and level == "char":  # a token per character and newline: the cut in tokens is known
            n = sum(len(line) + 1 for line in stream_lines(train))
            _write_stream(out, vocab, stream_lines(train), "train", rest="valid", cut=int(n * (1 - valid_fraction)))
        elif hold_out:  # by lines: the first kept_lines to train, the others to valid
            lines = stream_lines(train)
            _write_stream(out, vocab, itertools.islice(lines, kept_lines), "train")
            _write_stream(out, vocab, lines, "valid")
        for name, text in (("train", train), ("valid", valid), ("test", test)):
            if text and not (hold_out and name == "train"):
                _write_stream(out, vocab, stream_lines(text), name)
        out.finish(metadata={"vocab": vocab.to_json()})
    return load_lm_corpus(out_dir)


def _long(ids: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A batch as int64: a slice of a memory-mapped int32 stream is copied (B x T ids), an int64 tensor kept as is."""
    return ids.long() if isinstance(ids, torch.Tensor) else torch.from_numpy(np.array(ids, dtype=np.int64))


class LMStreams:
    """A (N,) id stream (a tensor, or a memory-mapped array read a segment at a time) as B parallel rows read in
    segments of T: batch tau = (x, y), (B, <= E + T) and (B, <= T) int64, where the first E = ext_len inputs (fewer
    in the first segment) are the context before the segment."""

    def __init__(self, ids: torch.Tensor | np.ndarray, batch_size: int, tgt_len: int, ext_len: int = 0):
        n_per_stream = len(ids) // batch_size
        if n_per_stream < 2:
            raise DataError(f"{len(ids)} tokens are too few for {batch_size} streams")
        self.data = ids[: n_per_stream * batch_size].reshape(batch_size, n_per_stream)  # (B, L), row b = part b
        self.tgt_len, self.ext_len = tgt_len, ext_len

    def __len__(self) -> int:
        """Segments per pass: every position but the last of a row is an input (the last is only a target)."""
        return -(-(self.data.shape[1] - 1) // self.tgt_len)

    @property
    def n_tokens(self) -> int:
        """Predicted tokens per pass."""
        return self.data.shape[0] * (self.data.shape[1] - 1)

    def batch(self, tau: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment tau: inputs data[:, tau*T-E : tau*T+T] (from 0 at most), targets data[:, tau*T+1 : tau*T+T+1]
        (the last segment shorter): the reference's LMOrderedIterator.get_batch."""
        start = tau * self.tgt_len
        end = min(start + self.tgt_len, self.data.shape[1] - 1)
        x, y = self.data[:, max(0, start - self.ext_len) : end], self.data[:, start + 1 : end + 1]  # (B, E+T), (B, T)
        return _long(x), _long(y)

    def segments(self, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches start, start + 1, ... to the end of the pass (resuming mid-pass starts later)."""
        return (self.batch(tau) for tau in range(start, len(self)))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.segments(0)
