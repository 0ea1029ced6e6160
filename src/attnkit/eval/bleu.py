"""Corpus scores with sacreBLEU on detokenised text against raw references, tokenised for the target language.

sacreBLEU's default tokeniser, 13a, splits at spaces and punctuation. Chinese and Japanese are written without
spaces, so under 13a a sentence is one or a few "words", hardly any 4-gram ever matches and BLEU is about 0
whatever the system wrote. sacreBLEU's own answer is a tokeniser per target language (`zh` splits every Chinese
character off, `ja-mecab` / `ko-mecab` segment with MeCab); `bleu_tokenizer` picks it from the target language's
code, which `attnkit prepare` records, and without a code from the references' script. The choice is made once per
corpus (never per sentence or per length bucket, whose scores must stay comparable) and printed with sacreBLEU's
signature, which names it (`tok:zh`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from attnkit.errors import ConfigError, DataError

# sacreBLEU's tokenisers that work offline (spm / flores* download their model on first use)
TOKENIZERS = ("13a", "zh", "ja-mecab", "ko-mecab", "char", "intl", "none")
DEFAULT_TOKENIZER = "13a"

# codes (ISO 639-1 / -2 / -3, the primary subtag of a BCP 47 tag) of the languages written without spaces between
# words, or with MeCab's segmentation as the usual unit, -> the language sacreBLEU has a tokeniser for
_CJK_CODES = {
    **dict.fromkeys(("zh", "zho", "chi", "cmn", "yue", "wuu", "lzh", "hak", "nan", "gan", "hsn", "cjy"), "zh"),
    **dict.fromkeys(("ja", "jpn"), "ja"),
    **dict.fromkeys(("ko", "kor"), "ko"),
}
_LANGUAGE_NAMES = {"zh": "Chinese", "ja": "Japanese", "ko": "Korean"}

# character classes of the scripts that decide a CJK target (Unicode blocks; compatibility and extension blocks too)
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_KANA = re.compile("[\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
_HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters


@dataclass(frozen=True)
class TokenizerChoice:
    """The sacreBLEU tokeniser a corpus is scored with, and why (printed beside the scores)."""

    name: str
    reason: str

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def language_of(code: str | None) -> str | None:
    """'zh', 'ja' or 'ko' for a code of those languages (zh-Hans, cmn, jpn, ko_KR, ...); None for any other."""
    if not code:
        return None
    return _CJK_CODES.get(re.split(r"[-_]", code.strip().lower())[0])


def script_language(texts: Sequence[str]) -> tuple[str | None, str]:
    """('zh' | 'ja' | 'ko' | None, what the script says) from the writing of `texts`.

    A CJK character is counted against a word of any other script (a Chinese character carries about what an
    English word does), and the target is CJK when they are at least half: Latin names and numbers do not outvote
    the sentence around them. Then Hangul ahead of the others is Korean, kana at 10% or more of the CJK characters
    Japanese (Japanese prose is about 30-60% kana, Chinese has none), the rest Chinese.
    """
    text = "".join(texts)
    han, kana, hangul = (len(p.findall(text)) for p in (_HAN, _KANA, _HANGUL))
    cjk = han + kana + hangul
    other_words = len(_WORD.findall(_HANGUL.sub(" ", _KANA.sub(" ", _HAN.sub(" ", text)))))
    share = f"{100 * cjk / max(cjk + other_words, 1):.0f}%"
    if not cjk or cjk < other_words:
        return None, f"the references are {share} CJK characters (other scripts counted by word)"
    lang = "ko" if hangul > han + kana else "ja" if 10 * kana >= cjk else "zh"
    return lang, f"the references are {share} CJK characters: {_LANGUAGE_NAMES[lang]}"


@functools.cache
def tokenizer_available(name: str) -> bool:
    """Whether sacreBLEU can build the tokeniser here: ja-mecab and ko-mecab need their extras installed."""
    try:
        BLEU(tokenize=name)
    except (RuntimeError, ImportError):  # sacreBLEU's answer to a missing MeCab / dictionary
        return False
    return True


def _language_tokenizer(lang: str | None, why: str) -> TokenizerChoice:
    """The tokeniser of a CJK language (or 13a), falling back where MeCab is not installed."""
    if lang is None:
        return TokenizerChoice(DEFAULT_TOKENIZER, why)
    if lang == "zh":
        return TokenizerChoice("zh", why)
    mecab = f"{lang}-mecab"
    if tokenizer_available(mecab):
        return TokenizerChoice(mecab, why)
    # Japanese has no spaces: by characters, as Chinese is scored; Korean writes spaces between words: 13a
    fallback = "char" if lang == "ja" else DEFAULT_TOKENIZER
    return TokenizerChoice(fallback, f"{why}; sacreBLEU's {mecab} needs `pip install sacrebleu[{lang}]`")


def bleu_tokenizer(refs: Sequence[str] = (), *, lang: str | None = None, tokenize: str | None = None
                   ) -> TokenizerChoice:
    """The sacreBLEU tokeniser for references `refs` in target language `lang`: `tokenize` when given (an
    override); else the tokeniser of a Chinese, Japanese or Korean `lang`; else, for any other code or none
    (a folder prepared before languages were recorded, plain files), the references' script decides."""
    if tokenize:
        check_tokenizer(tokenize)
        return TokenizerChoice(tokenize, "chosen with --tokenize")
    known = language_of(lang)
    if known:
        return _language_tokenizer(known, f"target language {lang}")
    detected, why = script_language(refs)
    where = f"target language {lang}, " if lang else "no target language recorded, "
    return _language_tokenizer(detected, f"{where}{why}")


def check_tokenizer(name: str) -> None:
    if name not in TOKENIZERS:
        raise ConfigError(f"unknown BLEU tokenizer {name!r} (known: {', '.join(TOKENIZERS)})")
    if not tokenizer_available(name):
        lang = name.split("-")[0]
        raise ConfigError(f"sacreBLEU's {name} tokenizer needs MeCab: pip install sacrebleu[{lang}]")


@dataclass(frozen=True)
class Scores:
    bleu: float  # cased sacreBLEU, tokenised as `tokenizer` says
    bleu_lc: float  # lowercased
    chrf: float  # chrF2 (characters: no tokeniser involved)
    exact: float  # share of hypotheses equal to their reference, in percent
    signature: str
    signature_lc: str
    signature_chrf: str
    tokenizer: TokenizerChoice

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f} (cased) / {self.bleu_lc:.2f} (lowercased), chrF2 {self.chrf:.2f}, "
                f"exact match {self.exact:.1f}%")

    def signatures(self) -> str:
        """sacreBLEU's signatures of the three scores and the tokeniser's reason, one per line."""
        return (f"BLEU signature: {self.signature}\nlowercased:     {self.signature_lc}\n"
                f"chrF signature: {self.signature_chrf}\ntokenizer:      {self.tokenizer.describe()}")


def exact_match(hyps: list[str], refs: list[str]) -> float:
    return 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs)) / max(1, len(refs))


def score_corpus(hyps: list[str], refs: list[str], *, lang: str | None = None, tokenize: str | None = None,
                 tokenizer: TokenizerChoice | None = None) -> Scores:
    """BLEU (cased, lowercased), chrF and exact match of `hyps` against `refs`. The BLEU tokeniser: `tokenizer`
    when given (one choice for several subsets of a corpus), else `bleu_tokenizer(refs, lang=..., tokenize=...)`."""
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: the files must be line-aligned")
    choice = tokenizer or bleu_tokenizer(refs, lang=lang, tokenize=tokenize)
    bleu, bleu_lc, chrf = BLEU(tokenize=choice.name), BLEU(tokenize=choice.name, lowercase=True), CHRF()
    return Scores(
        bleu=bleu.corpus_score(hyps, [refs]).score,
        bleu_lc=bleu_lc.corpus_score(hyps, [refs]).score,
        chrf=chrf.corpus_score(hyps, [refs]).score,
        exact=exact_match(hyps, refs),
        signature=str(bleu.get_signature()),
        signature_lc=str(bleu_lc.get_signature()),
        signature_chrf=str(chrf.get_signature()),
        tokenizer=choice,
    )
