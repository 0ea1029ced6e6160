"""Prepared corpora: text files -> tokenizer(s) + compact encoded splits in a data folder.

`prepare` does the slow, deterministic work once (tokenizer training, encoding, filtering) so that
every training run starts by memory-mapping a few arrays instead of re-tokenizing text. The training text
streams from disk to disk and the splits are memory-mapped when read: a corpus larger than memory prepares
and trains in flat memory.

Data folder layout:
    tokenizer.model | src.model + tgt.model    sentencepiece model(s)
    {train,valid,test}.safetensors             EncodedSplit arrays
    {train,valid,test}.{src,tgt}.txt           raw text: the references BLEU is computed against, and the kept
                                               training pairs, which BPE-dropout segments afresh every epoch
    prepare.json                               settings and the PrepareReport
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO

import numpy as np
import safetensors.numpy

from attnkit.data.arrays import ArrayWriter, map_arrays
from attnkit.data.text import chunked, read_lines, read_parallel, stream_lines, write_lines
from attnkit.data.tokenizer import (
    MAX_SENTENCE_BYTES,
    SubwordTokenizer,
    TrainingTextError,
    default_normalization,
    too_long_to_learn,
)
from attnkit.errors import ConfigError, DataError
from attnkit.io import atomic_folder, atomic_open, atomic_write_bytes, atomic_write_json, ensure_new_output

SPLIT_NAMES = ("train", "valid", "test")
_ARRAY_NAMES = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
PathPair = tuple[str | os.PathLike, str | os.PathLike]


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged lists -> (flat int32 ids, int64 offsets of length n+1): two arrays instead of n objects."""
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


class EncodedSplit:
    """One split of a parallel corpus as flat id arrays plus offsets (example i is ids[off[i]:off[i+1]])."""

    def __init__(
        self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray
    ):
        self.src_ids, self.src_offsets = src_ids, src_offsets
        self.tgt_ids, self.tgt_offsets = tgt_ids, tgt_offsets

    @classmethod
    def from_pairs(cls, src: list[list[int]], tgt: list[list[int]]) -> EncodedSplit:
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source sequences but {len(tgt)} target sequences")
        return cls(*_flatten(src), *_flatten(tgt))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @cached_property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @cached_property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, t = self.src_offsets, self.tgt_offsets
        return self.src_ids[s[i] : s[i + 1]], self.tgt_ids[t[i] : t[i + 1]]

    def _arrays(self) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(getattr(self, name)) for name in _ARRAY_NAMES}

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_bytes(path, safetensors.numpy.save(self._arrays()))

    @classmethod
    def load(cls, path: str | os.PathLike) -> EncodedSplit:
        """The split's arrays memory-mapped, not read: a corpus larger than memory trains in constant memory (the
        lengths the batcher sorts by, 8 bytes an example, are the only per-example arrays in memory)."""
        path = Path(path)
        arrays, _ = map_arrays(path)
        _check_arrays(arrays, path)
        return cls(*(arrays[name] for name in _ARRAY_NAMES))


def _check_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """A truncated or foreign file must fail here, not as an IndexError in the middle of an epoch."""
    missing = [name for name in _ARRAY_NAMES if name not in arrays]
    if missing:
        raise DataError(f"{path}: not an encoded split (missing {', '.join(missing)})")
    for side in ("src", "tgt"):
        ids, offsets = arrays[f"{side}_ids"], arrays[f"{side}_offsets"]
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise DataError(f"{path}: {side} offsets do not match {side} ids")
    if len(arrays["src_offsets"]) != len(arrays["tgt_offsets"]):
        raise DataError(f"{path}: source and target hold different numbers of examples")


@dataclass
class SplitCounts:
    """What happened to the lines of one split."""

    kept: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0
    # source and target lines tokenizer training left out (over sentencepiece's limit; train only), kept or not
    tokenizer_left_out: int = 0

    def summary(self) -> str:
        empty, too_long = self.dropped_empty, self.dropped_too_long
        out = f"{self.kept} kept, {empty + too_long} dropped ({empty} empty, {too_long} too long)"
        if self.tokenizer_left_out:
            out += (f"; tokenizer training left out {self.tokenizer_left_out} line(s) over "
                    f"{MAX_SENTENCE_BYTES:,} bytes (sentencepiece's max_sentence_length)")
        return out


@dataclass
class PrepareReport:
    """Per-split counts, so a user sees at once if filtering threw away half the corpus, and the tokenizer's
    normalization with the reason it was chosen (a language's default or the caller's)."""

    splits: dict[str, SplitCounts] = field(default_factory=dict)
    normalization: str = ""

    def summary(self) -> str:
        lines = [f"tokenizer normalization: {self.normalization}"] if self.normalization else []
        return "\n".join(lines + [f"{name}: {counts.summary()}" for name, counts in self.splits.items()])

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {name: dataclasses.asdict(counts) for name, counts in self.splits.items()}


def _filter_train(
    src_text: list[str],
    tgt_text: list[str],
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    max_src_len: int,
    max_tgt_len: int,
    counts: SplitCounts,
) -> list[int]:
    """Indices of training pairs worth learning from: both sides non-empty and within the length caps (`counts` adds
    up what was kept and dropped). A side the tokenizer reads as no tokens (only characters it drops: control or
    zero-width ones) is as empty as a blank one."""
    keep = []
    for i, (s, t) in enumerate(zip(src_text, tgt_text)):
        if not s.strip() or not t.strip() or not len(src_ids[i]) or not len(tgt_ids[i]):
            counts.dropped_empty += 1
        elif len(src_ids[i]) > max_src_len or len(tgt_ids[i]) > max_tgt_len:
            counts.dropped_too_long += 1
        else:
            keep.append(i)
    counts.kept += len(keep)
    counts.tokenizer_left_out += sum(map(too_long_to_learn, itertools.chain(src_text, tgt_text)))
    return keep


def _train_tokenizers(
    src: Iterable[str], tgt: Iterable[str], *, vocab_size: int, joint: bool, **options
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """One shared model (shared subwords for names/numbers, tieable embeddings; every source line, then every target
    line) or one per language; `options`: SubwordTokenizer.train's (model_type, seed, character_coverage,
    normalization). The lines stream through once."""

    def train(texts: Iterable[str]) -> SubwordTokenizer:
        return SubwordTokenizer.train(texts, vocab_size, **options)

    if joint:
        tok = train(itertools.chain(src, tgt))
        return tok, tok
    return train(src), train(tgt)


def _save_tokenizers(out_dir: Path, src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer) -> None:
    if src_tok is tgt_tok:
        src_tok.save(out_dir / "tokenizer.model")
    else:
        src_tok.save(out_dir / "src.model")
        tgt_tok.save(out_dir / "tgt.model")


OUTPUT_NAMES = frozenset(
    ["tokenizer.model", "src.model", "tgt.model", "prepare.json"]
    + [f"{split}.safetensors" for split in SPLIT_NAMES]
    + [f"{split}.{side}.txt" for split in SPLIT_NAMES for side in ("src", "tgt")]
)


def _check_replaceable(out_dir: Path) -> None:
    """--force replaces the data folder whole (`atomic_folder`), so a file prepare does not write there (a user's
    notes, a run folder) would go with it: refused, naming it, rather than lost. Hidden temp files an interrupted
    write left behind (`.NAME.XXXX.tmp`) are prepare's own. Checked by tests/test_data.py:
    test_prepare_force_refuses_a_folder_holding_other_files."""
    if not out_dir.is_dir():
        return
    foreign = sorted(p.name for p in out_dir.iterdir()
                     if p.name not in OUTPUT_NAMES and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise DataError(f"data folder '{out_dir}' holds files prepare did not write ({shown}); --force would replace "
                        "the folder whole: move them, or choose another --out")


def _encode_split(src: list[str], tgt: list[str], src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer) -> EncodedSplit:
    """A valid or test split, encoded whole and unfiltered: it is scored against every reference line."""
    return EncodedSplit.from_pairs(src_tok.encode(src), tgt_tok.encode(tgt))


def _parallel_lines(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """(source line, target line) streamed from the two files; a file that ends first is a DataError giving both
    line counts, as read_parallel's."""
    pairs = itertools.zip_longest(stream_lines(src_path), stream_lines(tgt_path))
    for n, (src, tgt) in enumerate(pairs):  # n: pairs before this one
        if src is None or tgt is None:
            counts = [n + (src is not None), n + (tgt is not None)]
            for rest in pairs:
                counts = [count + (line is not None) for count, line in zip(counts, rest)]
            raise DataError(f"parallel files differ in length: {src_path} has {counts[0]} lines, {tgt_path} has "
                            f"{counts[1]}")
        yield src, tgt


@contextlib.contextmanager
def _train_files(out_dir: Path) -> Iterator[tuple[ArrayWriter, IO[str], IO[str]]]:
    """The train split's outputs, written as the corpus streams in: they replace the folder's files only when the
    block ends without an error (the arrays first, then the kept text)."""
    dtypes = dict(zip(_ARRAY_NAMES, (np.int32, np.int64, np.int32, np.int64)))
    with (ArrayWriter(out_dir / "train.safetensors", dtypes) as arrays,
          atomic_open(out_dir / "train.src.txt") as src_text, atomic_open(out_dir / "train.tgt.txt") as tgt_text):
        yield arrays, src_text, tgt_text
        arrays.finish()


def _encode_train(
    files: tuple[ArrayWriter, IO[str], IO[str]],
    pairs: Iterator[tuple[str, str]],
    src_tok: SubwordTokenizer,
    tgt_tok: SubwordTokenizer,
    max_src_len: int,
    max_tgt_len: int,
) -> SplitCounts:
    """Encode and filter the training pairs a chunk at a time into `files` (`_train_files`): memory stays flat
    whatever the corpus's size."""
    arrays, counts, ends = files[0], SplitCounts(), {"src": 0, "tgt": 0}
    for side in ends:
        arrays.append(f"{side}_offsets", [0])
    for chunk in chunked(pairs):
        src, tgt = (list(side) for side in zip(*chunk))
        src_ids, tgt_ids = src_tok.encode(src), tgt_tok.encode(tgt)
        keep = _filter_train(src, tgt, src_ids, tgt_ids, max_src_len, max_tgt_len, counts)
        for (side, text, ids), out in zip((("src", src, src_ids), ("tgt", tgt, tgt_ids)), files[1:]):
            flat, offsets = _flatten([ids[i] for i in keep])
            arrays.append(f"{side}_ids", flat)
            arrays.append(f"{side}_offsets", ends[side] + offsets[1:])
            ends[side] += len(flat)
            out.write("".join(text[i] + "\n" for i in keep))
    return counts


def _check_lengths(max_src_len: int, max_tgt_len: int) -> None:
    if max_src_len < 1 or max_tgt_len < 1:
        raise ConfigError(f"--max-src-len and --max-tgt-len must be at least 1, got {max_src_len} and {max_tgt_len}")


def _check_out_dir(out_dir: Path) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"data folder '{out_dir}' is a file, not a folder")
    return out_dir


def prepare(
    out_dir: str | os.PathLike,
    train: PathPair,
    valid: PathPair | None = None,
    test: PathPair | None = None,
    *,
    vocab_size: int = 8000,
    joint: bool = True,
    model_type: str = "bpe",
    max_src_len: int = 256,
    max_tgt_len: int = 256,
    force: bool = False,
    seed: int = 0,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    normalization: str | None = None,
    character_coverage: float = 1.0,
    tokenizers: tuple[SubwordTokenizer, SubwordTokenizer] | None = None,
) -> PrepareReport:
    """Train tokenizer(s) on the training text, encode every split and write the data folder.

    `src_lang` / `tgt_lang`: the languages' codes (zh, en, ...), recorded in prepare.json and copied by training
    into every checkpoint, so that BLEU is tokenised for the target language (`attnkit.eval.bleu_tokenizer`)
    without being told again. `normalization` and `character_coverage`: the tokenizer's (`SubwordTokenizer.train`);
    without a `normalization` the languages choose it (`default_normalization`: identity for Chinese or Japanese).
    `tokenizers`: (source, target) tokenizers to encode with instead of training new ones (the same object twice
    for a joint one): a checkpoint's, so that a model fine-tuned on this folder reads its ids as it learnt them.

    The folder is built beside `out_dir` and swapped into its place whole when every file is written
    (`atomic_folder`): an error or an interruption half-way leaves an earlier folder as it was (tests/
    test_hostile_inputs.py: test_an_interrupted_prepare_force_leaves_the_old_folder_untouched).
    """
    _check_lengths(max_src_len, max_tgt_len)
    out_dir = _check_out_dir(ensure_new_output(out_dir, force, what="data folder"))
    _check_replaceable(out_dir)
    rule, why = default_normalization(src_lang, tgt_lang)
    if normalization:
        rule, why = normalization, "chosen with --normalization"
    if tokenizers is not None:  # not trained here: the given tokenizers' own normalisation and model type
        rule, why = "the given tokenizers' own", "not trained here"
        model_type, joint = "given", tokenizers[0] is tokenizers[1]
    given = {name: paths for name, paths in zip(SPLIT_NAMES, (train, valid, test)) if paths is not None}
    # valid and test (small) are read whole before anything is written: a bad valid file leaves no half-made folder
    texts = {name: read_parallel(*paths) for name, paths in given.items() if name != "train"}
    try:
        src_tok, tgt_tok = tokenizers or _train_tokenizers(
            *map(stream_lines, given["train"]), vocab_size=vocab_size, joint=joint, model_type=model_type, seed=seed,
            normalization=rule, character_coverage=character_coverage,
        )
    except TrainingTextError as e:  # a file that cannot be read names itself
        raise DataError(f"{given['train'][0]}, {given['train'][1]}: {e}") from None
    splits = {name: _encode_split(src, tgt, src_tok, tgt_tok) for name, (src, tgt) in texts.items()}
    report = PrepareReport(normalization=f"{rule} ({why})")
    with atomic_folder(out_dir) as new:
        with _train_files(new) as files:  # the training pairs stream from disk to disk
            counts = _encode_train(files, _parallel_lines(*given["train"]), src_tok, tgt_tok, max_src_len,
                                   max_tgt_len)
        if counts.kept == 0:
            raise DataError(f"{given['train'][0]}, {given['train'][1]}: no training pairs left "
                            f"({counts.summary()}; see --max-src-len / --max-tgt-len)")
        report.splits["train"] = counts
        _save_tokenizers(new, src_tok, tgt_tok)
        for name, split in splits.items():
            for side, lines in zip(("src", "tgt"), texts[name]):
                write_lines(new / f"{name}.{side}.txt", lines)
            split.save(new / f"{name}.safetensors")
            report.splits[name] = SplitCounts(kept=len(split))
        _write_settings(new, report, src_tok, tgt_tok, vocab_size=vocab_size, joint=joint, model_type=model_type,
                        normalization=rule, normalization_reason=why, character_coverage=character_coverage,
                        languages={"src": src_lang, "tgt": tgt_lang}, max_src_len=max_src_len,
                        max_tgt_len=max_tgt_len, seed=seed,
                        sources={name: [str(p) for p in paths] for name, paths in given.items()})
    return report


def _write_settings(out_dir: Path, report: PrepareReport, src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer, *,
                    vocab_size: int, **settings) -> None:
    """prepare.json: the settings prepare ran with (the vocabulary sizes it reached beside the one asked for) and
    the report."""
    settings = {
        "vocab_size_requested": vocab_size,
        "src_vocab_size": src_tok.vocab_size,
        "tgt_vocab_size": tgt_tok.vocab_size,
        **settings,
    }
    atomic_write_json(out_dir / "prepare.json", {"settings": settings, "report": report.to_dict()})


def _setting(data_dir: Path, key: str, default, *, since: bool = False):
    """One of prepare.json's settings; `default` for a folder without prepare.json, and with `since` (a setting
    added after the first release) for one prepared before the setting was recorded."""
    meta = data_dir / "prepare.json"
    if not meta.is_file():
        return default
    try:
        settings = json.loads(meta.read_text(encoding="utf-8"))["settings"]
        return settings.get(key, default) if since else settings[key]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{meta}: unreadable: {e}") from None


def data_languages(data_dir: str | os.PathLike) -> dict[str, str | None]:
    """{"src": code, "tgt": code} that prepare recorded; None for a side it was not told (or a folder prepared
    before languages were recorded: BLEU then looks at the references' script)."""
    languages = _setting(Path(data_dir), "languages", None, since=True) or {}
    if not isinstance(languages, dict):
        raise DataError(f"{Path(data_dir) / 'prepare.json'}: settings.languages is not a mapping: {languages!r}")
    return {side: languages.get(side) for side in ("src", "tgt")}


def _is_joint(data_dir: Path) -> bool:
    """prepare.json decides; without it, the presence of tokenizer.model does."""
    return bool(_setting(data_dir, "joint", (data_dir / "tokenizer.model").is_file()))


def load_tokenizers(data_dir: str | os.PathLike) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """(source, target) tokenizers of a prepared folder; the very same object when joint."""
    data_dir = Path(data_dir)
    if _is_joint(data_dir):
        tok = SubwordTokenizer.load(data_dir / "tokenizer.model")
        return tok, tok
    return SubwordTokenizer.load(data_dir / "src.model"), SubwordTokenizer.load(data_dir / "tgt.model")


def load_split(data_dir: str | os.PathLike, name: str) -> EncodedSplit:
    return EncodedSplit.load(Path(data_dir) / f"{name}.safetensors")


def resegment_train(
    data_dir: str | os.PathLike, src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer, dropout: float
) -> EncodedSplit:
    """The training pairs of train.safetensors, in the same order, segmented afresh with BPE-dropout: each merge
    skipped with probability `dropout` (Provilkov et al. 2020), so the model sees a word in many pieces."""
    data_dir = Path(data_dir)
    model_type = _setting(data_dir, "model_type", "bpe")
    if model_type != "bpe":
        raise ConfigError(f"train.bpe_dropout needs a BPE tokenizer; {data_dir} was prepared with --model-type "
                          f"{model_type}")
    texts = []
    for side in ("src", "tgt"):
        path = data_dir / f"train.{side}.txt"
        if not path.is_file():
            raise DataError(f"{path}: missing; train.bpe_dropout segments the training text afresh every epoch, "
                            "and a folder prepared by an older attnkit lacks it: prepare the folder again")
        texts.append(read_lines(path))
    return EncodedSplit.from_pairs(src_tok.encode(texts[0], dropout), tgt_tok.encode(texts[1], dropout))
