"""A document translated sentence by sentence: its sentences (attnkit.data.sentences) through a Translator in one
call, each translation put back where its sentence was, with the line breaks, blank lines and spaces between them as
they were. A sentence longer than the model reads (its positions) is cut into parts it reads whole, at the clause
punctuation nearest the middle (else a space, else the middle), and their translations joined, where translating
it whole would truncate it. `attnkit translate --document` uses it (the services split their texts by the same
sentence rules and keep each sentence within --max-chars); tests/test_documents.py checks it."""

from __future__ import annotations

import re

from attnkit.data.sentences import SPACELESS, put_back, sentence_pieces
from attnkit.decode.options import DecodeOptions
from attnkit.decode.translator import Translator

_CLAUSE_END = re.compile(r"[,;:，；：、]\s*")
_MAX_PIECES_PER_CHAR = 5


def translate_document(translator: Translator, text: str, options: DecodeOptions | None = None, *,
                       lang: str | None = None, tgt_lang: str | None = None, **kw) -> str:
    """`text` translated a sentence at a time (`lang`: its language's sentence rules; `tgt_lang`: the output's, which
    joins the parts of a cut sentence with a space or, for Chinese and Japanese, without); `kw` go to
    Translator.translate (batch_size, max_tokens)."""
    pieces = sentence_pieces(text, lang)
    parts = [fitting_parts(translator, part) for part, move in pieces if move]
    flat = [p for sentence in parts for p in sentence]
    done = iter(translator.translate(flat, options, **kw) if flat else [])
    joiner = "" if tgt_lang in SPACELESS else " "
    return put_back(pieces, [joiner.join(next(done).text for _ in sentence) for sentence in parts])


def fitting_parts(translator: Translator, sentence: str) -> list[str]:
    """`sentence` alone where the model reads it whole, else its halves' parts (cut at `_cut`), stripped. A character
    makes at most five pieces (a word-start piece and, where a tokenizer falls back to bytes, four UTF-8 bytes), and a
    target tag one more, so a sentence of up to (max_src_len - 1) / 5 characters fits without being encoded here."""
    if _MAX_PIECES_PER_CHAR * len(sentence) + 1 <= translator.max_src_len or len(sentence) < 2:
        return [sentence]
    if len(translator.lang_tags.encode([sentence])[0]) <= translator.max_src_len:
        return [sentence]
    at = _cut(sentence)
    return [p for half in (sentence[:at], sentence[at:]) if half.strip()
            for p in fitting_parts(translator, half.strip())]


def _cut(sentence: str) -> int:
    """Where to cut a sentence in two: after the clause punctuation nearest its middle, else at the space nearest it,
    else in the middle."""
    middle = len(sentence) / 2
    for candidates in ([m.end() for m in _CLAUSE_END.finditer(sentence)],
                       [m.start() for m in re.finditer(r"\s+", sentence)]):
        inside = [c for c in candidates if 0 < c < len(sentence)]
        if inside:
            return min(inside, key=lambda c: abs(c - middle))
    return len(sentence) // 2
