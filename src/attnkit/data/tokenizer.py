"""Subword tokenizer: a thin wrapper over sentencepiece with attnkit's fixed special ids.

Every model, loss and decoder in attnkit assumes PAD 0, BOS 1, EOS 2, UNK 3, so the tokenizer is
trained with exactly those ids and nothing else in the code base needs to ask for them.
"""

from __future__ import annotations

import io
import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import sentencepiece as spm

from attnkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # fixed for every vocabulary
from attnkit.data.text import check_unicode
from attnkit.errors import ConfigError, DataError
from attnkit.io import atomic_write_bytes

T = TypeVar("T")
MIN_VOCAB_SIZE = 8  # the 4 specials plus a few pieces; anything smaller cannot encode text at all
# sentencepiece's normalization_rule_name values (0.2.x): what the tokenizer does to the text before splitting it,
# stored in the model itself, so that encoding at translation time normalises as training did.
#   nmt_nfkc     NFKC plus NMT cleanups (sentencepiece's default): fullwidth ，？！１２ -> ,?!12, x² -> x2
#   nfkc         NFKC alone
#   nmt_nfkc_cf  nmt_nfkc, then case folding;  nfkc_cf  nfkc, then case folding
#   identity     none: the text as written (decode(encode(s)) == s for text without runs of spaces)
NORMALIZATIONS = ("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity")
DEFAULT_NORMALIZATION = "nmt_nfkc"
# Languages whose text NFKC rewrites against its own references: Chinese and Japanese write fullwidth ，？！：１２,
# which nmt_nfkc turns into ,?!:12, forms a model then always writes and the references never hold (docs/results.md,
# Tatoeba: a perfect English->Chinese model capped 4.28 BLEU below `identity`). Korean writes ASCII punctuation.
KEEP_AS_WRITTEN = ("zh", "ja")

# codes (ISO 639-1 / -2 / -3, the primary subtag of a BCP 47 tag) of the languages written without spaces between
# words, or with MeCab's segmentation as the usual unit, -> the language sacreBLEU has a tokeniser for
_CJK_CODES = {
    **dict.fromkeys(("zh", "zho", "chi", "cmn", "yue", "wuu", "lzh", "hak", "nan", "gan", "hsn", "cjy"), "zh"),
    **dict.fromkeys(("ja", "jpn"), "ja"),
    **dict.fromkeys(("ko", "kor"), "ko"),
}
LANGUAGE_NAMES = {"zh": "Chinese", "ja": "Japanese", "ko": "Korean"}
# sentencepiece samples this many sentences for training: enough for any MT corpus we ship,
# small enough that a multi-million-line corpus does not exhaust memory.
MAX_TRAIN_SENTENCES = 2_000_000


# sentencepiece skips training sentences longer than this many bytes (its default, passed explicitly)
MAX_SENTENCE_BYTES = 4192


def too_long_to_learn(text: str) -> bool:
    """A line tokenizer training leaves out: over sentencepiece's max_sentence_length. The limit stays, since one
    long line of rare characters can alone need more pieces than the vocabulary holds (character_coverage 1.0);
    `prepare` reports how many lines it left out."""
    return len(text.encode("utf-8", "surrogatepass")) > MAX_SENTENCE_BYTES


def _trainable(texts: Iterable[str], failure: list[BaseException]) -> Iterator[str]:
    """Lines sentencepiece learns from, as they come (a corpus larger than memory streams through): empty lines carry
    no statistics, over-long ones it would skip. An error of the reader behind `texts` (a bad byte on line 3 000 000)
    or a Ctrl-C ends the lines and lands in `failure`, to be raised as itself once sentencepiece has returned (it
    would report it as its own failure)."""
    try:
        yield from (t for t in texts if t.strip() and not too_long_to_learn(t))
    except (Exception, KeyboardInterrupt) as e:
        failure.append(e)


def language_of(code: str | None) -> str | None:
    """'zh', 'ja' or 'ko' for a code of those languages (zh-Hans, cmn, jpn, ko_KR, ...); None for any other."""
    if not code:
        return None
    return _CJK_CODES.get(re.split(r"[-_]", code.strip().lower())[0])


def default_normalization(src_lang: str | None, tgt_lang: str | None) -> tuple[str, str]:
    """(rule, why) when no normalization is asked for: `identity` where a side is Chinese or Japanese
    (KEEP_AS_WRITTEN: the text comes back as written, fullwidth punctuation included), DEFAULT_NORMALIZATION
    otherwise (tests/test_cjk_text.py: test_the_languages_choose_the_default_normalization)."""
    for side, code in (("source", src_lang), ("target", tgt_lang)):
        lang = language_of(code)
        if lang in KEEP_AS_WRITTEN:
            return "identity", f"the {side} language {code} is {LANGUAGE_NAMES[lang]}: its fullwidth ，？！ kept"
    return DEFAULT_NORMALIZATION, "the default for languages other than Chinese and Japanese"


class TrainingTextError(DataError):
    """The training text cannot make a vocabulary (as against a file that cannot be read, whose error names it)."""


def _training_error(e: RuntimeError) -> TrainingTextError:
    """sentencepiece's status text (`INTERNAL: trainer_interface.cc(576) [...]`) as a sentence a user can act on."""
    text = str(e).strip()
    if "all_chars_count" in text:
        return TrainingTextError("cannot train tokenizer: the text holds no characters it can learn from "
                                 "(only control, format or whitespace characters?)")
    if "sentences_.empty()" in text:
        return TrainingTextError("cannot train tokenizer: no usable training text")
    return TrainingTextError(f"cannot train tokenizer: {' '.join(text.split())}")


class SubwordTokenizer:
    """Text <-> ids for one language (or both, when trained jointly)."""

    def __init__(self, processor: spm.SentencePieceProcessor):
        self._sp = processor

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        seed: int = 0,
        normalization: str = DEFAULT_NORMALIZATION,
    ) -> SubwordTokenizer:
        """Train on `texts`, any iterable of lines read once (`stream_lines` for a corpus larger than memory:
        sentencepiece keeps a sample of MAX_TRAIN_SENTENCES); `hard_vocab_limit=False` lets tiny corpora yield a
        smaller vocab.

        `character_coverage`: the share of the training text's characters the vocabulary must cover, the rarest
        characters beyond it becoming UNK (sentencepiece suggests 0.9995 for languages with large character sets;
        1.0 keeps every character seen). `normalization`: one of NORMALIZATIONS.
        """
        if vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
        if normalization not in NORMALIZATIONS:
            raise ConfigError(f"unknown normalization {normalization!r} (known: {', '.join(NORMALIZATIONS)})")
        if not 0.0 < character_coverage <= 1.0:
            raise ConfigError(f"character_coverage must be in (0, 1], got {character_coverage:g}")
        failure: list[BaseException] = []
        sentences = _trainable(texts, failure)
        first = next(sentences, None)
        if failure:
            raise failure[0]
        if first is None:
            raise TrainingTextError(f"cannot train tokenizer: every line is empty or longer than {MAX_SENTENCE_BYTES} "
                                    "bytes")
        spm.set_random_generator_seed(seed)  # sentence sampling and unigram EM are random
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=itertools.chain([first], sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                normalization_rule_name=normalization,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                hard_vocab_limit=False,
                byte_fallback=False,
                num_threads=2,
                input_sentence_size=MAX_TRAIN_SENTENCES,
                max_sentence_length=MAX_SENTENCE_BYTES,
                shuffle_input_sentence=True,
                minloglevel=2,
            )
        except RuntimeError as e:  # e.g. only control characters, or an unknown model_type
            if failure:
                raise failure[0] from None
            raise _training_error(e) from None
        if failure:
            raise failure[0]
        return cls.from_bytes(model.getvalue())

    @classmethod
    def from_bytes(cls, b: bytes) -> SubwordTokenizer:
        """Rebuild from a serialized model proto (as stored in files and checkpoints)."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(b)
        except (RuntimeError, OSError) as e:
            raise DataError(f"not a sentencepiece model: {e}") from None
        return cls(processor)

    def to_bytes(self) -> bytes:
        return self._sp.serialized_model_proto()

    @classmethod
    def load(cls, path: str | os.PathLike) -> SubwordTokenizer:
        return read_with(path, cls.from_bytes)

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_bytes(path, self.to_bytes())

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, texts: list[str], dropout: float = 0.0) -> list[list[int]]:
        """Ids without BOS/EOS: batching adds them, so the stored corpus stays model-agnostic.

        With `dropout` > 0 a BPE model skips each merge with that probability (BPE-dropout, Provilkov et al. 2020):
        another segmentation of the same text on every call. The draws come from sentencepiece's generator of the
        calling thread, one line at a time: its batch call starts new threads whose generators all begin at the
        same state once anything has set sentencepiece's seed (tokenizer training does), so every call would
        draw the same pieces.
        """
        try:
            if not dropout:
                return self._sp.encode(texts, out_type=int)
            return [self._sp.encode(text, out_type=int, enable_sampling=True, alpha=dropout, nbest_size=-1)
                    for text in texts]
        except TypeError:  # sentencepiece's answer to a lone surrogate: name the text instead
            check_unicode(texts)
            raise

    def decode(self, ids_batch: list[list[int]]) -> list[str]:
        """Text of model outputs: everything from the first EOS on is ignored, PAD/BOS dropped."""
        return self._sp.decode([content_ids(ids) for ids in ids_batch])

    def pieces(self, ids: list[int]) -> list[str]:
        """Subword strings for plot labels, specials included so axes line up with the tensors."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def piece_id(self, piece: str) -> int:
        """The id of a piece (UNK for a piece the model lacks)."""
        return self._sp.piece_to_id(piece)


def read_with(path: str | os.PathLike, from_bytes: Callable[[bytes], T]) -> T:
    """from_bytes of a file's bytes, a DataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    try:
        return from_bytes(path.read_bytes())
    except DataError as e:
        raise DataError(f"{path}: {e}") from None


def content_ids(ids: Iterable[int]) -> list[int]:
    """Ids up to (not including) the first EOS, without PAD and BOS."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out
