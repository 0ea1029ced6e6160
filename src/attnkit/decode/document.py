"""A document translated sentence by sentence: its sentences (attnkit.data.sentences) through a Translator in one
call, each translation put back where its sentence was, with the line breaks, blank lines and spaces between them as
they were. `attnkit translate --document` and LibreTranslate's route use it; tests/test_documents.py checks it."""

from __future__ import annotations

from attnkit.data.sentences import sentence_pieces
from attnkit.decode.options import DecodeOptions
from attnkit.decode.translator import Translator


def translate_document(translator: Translator, text: str, options: DecodeOptions | None = None, *,
                       lang: str | None = None, **kw) -> str:
    """`text` translated a sentence at a time (`lang`: its language's sentence rules); `kw` go to
    Translator.translate (batch_size, max_tokens)."""
    pieces = sentence_pieces(text, lang)
    sources = [part for part, move in pieces if move]
    done = iter(translator.translate(sources, options, **kw) if sources else [])
    return "".join(next(done).text if move else part for part, move in pieces)
