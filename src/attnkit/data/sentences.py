"""A document as sentences, and back: what a sentence-level translation model is given of a text, and how the text
is put together again.

`sentence_pieces(text, lang)` cuts a text into pieces that join back into it exactly: each line (line breaks and
blank lines, which separate paragraphs, are kept as they are) is split into sentences, pysbd's rules for European
languages (abbreviations such as "Dr." and numbers such as "3.5" do not end a sentence), and for Chinese and
Japanese after 。！？；… and any closing quotes or brackets that follow (pysbd would cut `“他说：好。”` before its
closing quote). The spaces around each sentence are pieces of their own, kept and never translated.
tests/test_documents.py checks the round trip and each rule.
"""

from __future__ import annotations

import functools
import re

import pysbd
from pysbd.languages import LANGUAGE_CODES

SPACELESS = ("zh", "ja")  # written without spaces between words: sentence ends by punctuation alone
_SPACELESS_END = re.compile(r"[。！？；…]+[”’」』）)\]]*")
Piece = tuple[str, bool]  # (text, translate it?)


def sentence_pieces(text: str, lang: str | None = None) -> list[Piece]:
    """(part, translate?) pieces that join back into `text`: its sentences, and everything between them."""
    pieces: list[Piece] = []
    for line in re.split(r"(\n)", text):
        if line == "\n":
            pieces.append((line, False))
            continue
        for sentence in sentences(line, lang):
            words = sentence.strip()
            if not words:
                pieces.append((sentence, False))
                continue
            start = sentence.index(words)
            pieces += [(sentence[:start], False), (words, True), (sentence[start + len(words):], False)]
    return [p for p in pieces if p[0]]


def put_back(pieces: list[Piece], translations: list[str]) -> str:
    """The text of `pieces` with each piece to translate replaced by its translation, in order."""
    done = iter(translations)
    return "".join(next(done) if move else part for part, move in pieces)


def sentences(line: str, lang: str | None = None) -> list[str]:
    """One line's sentences, with the spaces between them: they join back into `line`."""
    if lang in SPACELESS:
        cuts = [m.end() for m in _SPACELESS_END.finditer(line)]
    else:
        cuts, at = [], 0
        for sentence in _segmenter(lang if lang in LANGUAGE_CODES else "en").segment(line):
            found = line.find(sentence.strip(), at) if sentence.strip() else -1
            if found >= 0:  # each sentence located in the line itself, whatever pysbd did to its spaces
                at = found + len(sentence.strip())
                cuts.append(at)
    bounds = [0, *(c for c in cuts if 0 < c < len(line)), len(line)]
    return [line[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


@functools.cache
def _segmenter(lang: str) -> pysbd.Segmenter:
    return pysbd.Segmenter(language=lang, clean=False)
