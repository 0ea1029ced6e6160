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

import dataclasses
import functools
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from attnkit.data.text import HAN, HANGUL, KANA
from attnkit.data.tokenizer import LANGUAGE_NAMES, language_of
from attnkit.errors import ConfigError, DataError

# sacreBLEU's tokenisers that work offline (spm / flores* download their model on first use)
TOKENIZERS = ("13a", "zh", "ja-mecab", "ko-mecab", "char", "intl", "none")
DEFAULT_TOKENIZER = "13a"

_WORD = re.compile(r"[^\W\d_]+")  # a run of letters

# what a reference of each language is written in, as the reasons and warnings name it (None: no CJK language)
_SCRIPTS = {"zh": "Han script", "ja": "kana (Japanese)", "ko": "Hangul", None: "other scripts than CJK"}
# (language tokenised for, language a reference reads as) that score alike though they differ: sacreBLEU's zh reads
# text without Han characters as 13a does; Japanese written in kanji alone reads as Chinese; Korean and the other
# scripts are both split at spaces
_READ_ALIKE = {("zh", None), ("ja", "zh"), ("ko", None)}
MIXED_SHARE = 0.1  # the share of references in other scripts than the tokeniser assumes from which BLEU warns


@dataclass(frozen=True)
class TokenizerChoice:
    """The sacreBLEU tokeniser a corpus is scored with, why (printed beside the scores), and the one-line warnings
    said when it was chosen (mixed scripts, MeCab missing)."""

    name: str
    reason: str
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def _script_counts(text: str) -> tuple[int, int, int, int]:
    """(Han, kana, Hangul characters, words of other scripts) in `text`."""
    han, kana, hangul = (len(p.findall(text)) for p in (HAN, KANA, HANGUL))
    other_words = len(_WORD.findall(HANGUL.sub(" ", KANA.sub(" ", HAN.sub(" ", text)))))
    return han, kana, hangul, other_words


def _language_by_script(han: int, kana: int, hangul: int, other_words: int) -> str | None:
    """A CJK character is counted against a word of any other script (a Chinese character carries about what an
    English word does), and the text is CJK when they are at least half: Latin names and numbers do not outvote the
    sentence around them. Then Hangul ahead of the others is Korean, kana at 10% or more of the CJK characters
    Japanese (Japanese prose is about 30-60% kana, Chinese has none), the rest Chinese."""
    cjk = han + kana + hangul
    if not cjk or cjk < other_words:
        return None
    return "ko" if hangul > han + kana else "ja" if 10 * kana >= cjk else "zh"


def script_language(texts: Sequence[str]) -> tuple[str | None, str]:
    """('zh' | 'ja' | 'ko' | None, what the script says) from the writing of all of `texts` together
    (`_language_by_script`)."""
    han, kana, hangul, other_words = _script_counts("".join(texts))
    cjk = han + kana + hangul
    share = f"{100 * cjk / max(cjk + other_words, 1):.0f}%"
    lang = _language_by_script(han, kana, hangul, other_words)
    if lang is None:
        return None, f"the references are {share} CJK characters (other scripts counted by word)"
    return lang, f"the references are {share} CJK characters: {LANGUAGE_NAMES[lang]}"


def reference_languages(refs: Sequence[str]) -> Counter[str | None]:
    """How many references read as Chinese, Japanese, Korean or none of them (None), each by its own script
    (`_language_by_script`); a reference without letters (empty, digits, punctuation) is not counted."""
    counts: Counter[str | None] = Counter()
    for ref in refs:
        letters = _script_counts(ref)
        if any(letters):
            counts[_language_by_script(*letters)] += 1
    return counts


def _percent(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%"


def _guess_language(counts: Counter[str | None], lang: str | None) -> tuple[str | None, str]:
    """(language, why) from the references' scripts, for a target language that is not CJK or not known: CJK when at
    least half the references are, then the CJK language most of them read as. Han characters alone say Chinese, but
    Japanese written only in kanji looks the same: such a choice is called a guess."""
    where = f"target language {lang}, " if lang else "no target language recorded, "
    total = sum(counts.values())
    if not total:
        return None, f"{where}no reference holds a letter"
    other = counts[None]
    if 2 * other > total:
        return None, f"{where}{_percent(other, total)} of the references in {_SCRIPTS[None]}"
    guess = max(("ja", "zh", "ko"), key=lambda code: counts[code])  # a tie: the first
    why = f"{where}{_percent(counts[guess], total)} of the references in {_SCRIPTS[guess]}: {LANGUAGE_NAMES[guess]}"
    if guess == "zh":
        why += " (a guess: Japanese written only in kanji looks the same; name the target language to be sure)"
    return guess, why


@functools.cache
def tokenizer_available(name: str) -> bool:
    """Whether sacreBLEU can build the tokeniser here: ja-mecab and ko-mecab need their extras installed."""
    try:
        BLEU(tokenize=name)
    except (RuntimeError, ImportError):  # sacreBLEU's answer to a missing MeCab / dictionary
        return False
    return True


def _language_tokenizer(lang: str | None, why: str) -> TokenizerChoice:
    """The tokeniser of a CJK language (or 13a), falling back, with a warning, where MeCab is not installed."""
    if lang is None:
        return TokenizerChoice(DEFAULT_TOKENIZER, why)
    if lang == "zh":
        return TokenizerChoice("zh", why)
    mecab = f"{lang}-mecab"
    if tokenizer_available(mecab):
        return TokenizerChoice(mecab, why)
    # Japanese has no spaces: by characters, as Chinese is scored; Korean writes spaces between words: 13a
    fallback = "char" if lang == "ja" else DEFAULT_TOKENIZER
    warning = (f"BLEU tokenised {fallback} for {LANGUAGE_NAMES[lang]}, not {mecab}: sacreBLEU's {mecab} needs MeCab "
               f"(pip install sacrebleu[{lang}]), and the two scores are not comparable")
    return TokenizerChoice(fallback, f"{why}; sacreBLEU's {mecab} needs `pip install sacrebleu[{lang}]`", (warning,))


def _mixed_scripts(counts: Counter[str | None], target: str | None, name: str) -> tuple[str, ...]:
    """A warning when MIXED_SHARE or more of the references read as another language than the tokeniser `name` was
    chosen for (`target`), and it would split them otherwise (`_READ_ALIKE`): one tokeniser scores the corpus, so
    those references are misread (Chinese under 13a: a sentence is one word)."""
    total = sum(counts.values())
    off = {code: n for code, n in counts.items() if code != target and (target, code) not in _READ_ALIKE}
    if not total or sum(off.values()) < MIXED_SHARE * total:
        return ()
    shares = ", ".join(f"{_percent(n, total)} in {_SCRIPTS[code]}" for code, n in sorted(off.items(),
                                                                                        key=lambda kv: -kv[1]))
    hint = "; --tokenize zh splits Han characters and reads the rest as 13a does" if set(off) == {"zh"} else ""
    return (f"BLEU tokenised {name} for {LANGUAGE_NAMES.get(target, 'text written with spaces')}, but of the "
            f"references {shares}, which {name} misreads: name the target language or the tokenizer{hint}",)


def bleu_tokenizer(refs: Sequence[str] = (), *, lang: str | None = None, tokenize: str | None = None
                   ) -> TokenizerChoice:
    """The sacreBLEU tokeniser for references `refs` in target language `lang`, one for the whole corpus: `tokenize`
    when given (an override); else the tokeniser of a Chinese, Japanese or Korean `lang`; else, for any other code
    or none (a folder prepared before languages were recorded, plain files), the references' scripts decide
    (`_guess_language`). Mixed scripts and a MeCab fallback are warned of, once, in one line each
    (tests/test_bleu_languages.py: test_mixed_scripts_and_a_mecab_fallback_are_said)."""
    if tokenize:
        check_tokenizer(tokenize)
        return TokenizerChoice(tokenize, "chosen with --tokenize")
    counts = reference_languages(refs)
    known = language_of(lang)
    target, why = (known, f"target language {lang}") if known else _guess_language(counts, lang)
    choice = _language_tokenizer(target, why)
    choice = dataclasses.replace(choice, warnings=choice.warnings + _mixed_scripts(counts, target, choice.name))
    for line in choice.warnings:
        warnings.warn(line, stacklevel=2)
    return choice


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
        """The scores on one line, BLEU's tokeniser and why it was chosen beside them."""
        return (f"BLEU {self.bleu:.2f} (cased) / {self.bleu_lc:.2f} (lowercased), tok:{self.tokenizer.describe()}, "
                f"chrF2 {self.chrf:.2f}, exact match {self.exact:.1f}%")

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
