"""LibreTranslate's API beside attnkit's own, so that its clients work unchanged: give them
`http://HOST:PORT/libretranslate/` as the server's address.

- `POST /libretranslate/translate` takes LibreTranslate's fields, as JSON or as a form (its clients send forms): `q`
  (a text, or a list of them), `source` (the model's source language, or `auto`), `target`, `format` (`text` or
  `html`) and `alternatives` (how many other translations to return); `api_key` is accepted and ignored. It answers
  `{"translatedText": ...}` (a list for a list), with `alternatives` where asked.
- `GET /libretranslate/languages` lists the model's source language with the targets it translates into.

The model translates sentences, so a text is translated a sentence at a time (attnkit.data.sentences: its line
breaks, blank lines and the spaces between sentences kept), and an HTML text so a text node at a time (tags,
attributes, comments and the contents of `<script>` and `<style>` kept as they are; entities read, and written back
escaped). Every piece is checked against the server's caps
and waits in the same queue, under the same time limit and metrics, as a request to `/translate`. Errors are
LibreTranslate's: 400 with `{"error": "..."}` for a missing or wrong field (and attnkit's 413, 415, 503, 504 where
those apply). tests/test_serve_libretranslate.py drives it with the `libretranslatepy` client.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import FastAPI, Request

from attnkit.data.sentences import Piece, put_back, sentence_pieces
from attnkit.decode.options import DecodeOptions, Translation
from attnkit.serve.http import ApiError, check_sentences
from attnkit.serve.schema import Limits

PREFIX = "/libretranslate"
# The names LibreTranslate gives the languages attnkit's corpora and imported models are in; others show their code
NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
         "fr": "French", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish",
         "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}
_TAG = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)  # a comment or a tag; what lies between is text
_RAW = re.compile(r"<(script|style)\b", re.I)  # elements whose contents are not text to translate
Queue = Callable[[list[str], DecodeOptions, bool], Awaitable[list[Translation]]]


@dataclass(frozen=True)
class LibreRequest:
    texts: list[str]
    is_list: bool  # `q` was a list: the answer is too
    html: bool
    alternatives: int
    lang: str | None  # the source language, whose sentence rules split the texts


async def read_fields(request: Request) -> dict:
    """A request's fields, from a JSON object or a form (application/x-www-form-urlencoded), as LibreTranslate reads
    them; ApiError 400 / 415 otherwise."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if kind == "application/json":
        try:
            fields = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the body is not valid JSON") from None
        if not isinstance(fields, dict):
            raise ApiError(400, "the body must be a JSON object")
        return fields
    if kind in ("application/x-www-form-urlencoded", ""):
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body),
                            errors="strict")
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the body is not a valid form") from None
        return {k: v if k == "q" and len(v) > 1 else v[-1] for k, v in form.items()}
    raise ApiError(415, f"send the fields as JSON or as a form, not {kind}")


def parse_request(fields: dict, languages: dict[str, str | None], targets: list[str]) -> LibreRequest:
    """LibreTranslate's fields checked against what the model translates; ApiError 400 naming the field."""
    q = fields.get("q")
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")
    if not (isinstance(q, str) or isinstance(q, list) and all(isinstance(t, str) for t in q)):
        raise ApiError(400, "Invalid request: q must be a text or a list of texts")
    source, target = fields.get("source"), fields.get("target")
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str) or not value:
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    src = languages.get("src")
    if src and source not in ("auto", src):
        raise ApiError(400, f"{source} is not supported: this model translates from {src}")
    if targets and target not in targets:
        raise ApiError(400, f"{target} is not supported: this model translates into {', '.join(targets)}")
    kind = fields.get("format", "text")
    if kind not in ("text", "html"):
        raise ApiError(400, f"Invalid request: format must be text or html, not {kind!r}")
    try:
        alternatives = int(fields.get("alternatives", 0))
    except (TypeError, ValueError):
        raise ApiError(400, "Invalid request: alternatives must be a whole number") from None
    if alternatives < 0:
        raise ApiError(400, "Invalid request: alternatives must be 0 or more")
    return LibreRequest([q] if isinstance(q, str) else list(q), isinstance(q, list), kind == "html", alternatives,
                        src or (None if source == "auto" else source))


def split_text(text: str, markup: bool, lang: str | None = None) -> list[Piece]:
    """(part, translate it?) pieces that join back into `text`: its sentences apart from what lies between them; with
    `markup`, each text node's, the tags and raw elements kept as they are."""
    pieces: list[Piece] = []
    raw = False  # inside <script> or <style>
    for part in _TAG.split(text) if markup else [text]:
        if markup and _TAG.fullmatch(part):
            pieces.append((part, False))
            raw = bool(_RAW.match(part)) or (raw and not part.lower().startswith(("</script", "</style")))
        else:
            pieces += [(part, False)] if raw else sentence_pieces(part, lang)
    return pieces


async def translate_texts(req: LibreRequest, queue: Queue, caps: Limits) -> dict:
    """The texts translated piece by piece (split_text) in one queued batch -> LibreTranslate's answer."""
    split = [split_text(t, req.html, req.lang) for t in req.texts]
    sentences = [html.unescape(p) if req.html else p for pieces in split for p, move in pieces if move]
    check_sentences(sentences, "q", caps.max_request_sentences, caps.max_chars)
    if req.alternatives + 1 > caps.max_beam:
        raise ApiError(400, f"Invalid request: alternatives {req.alternatives} is over this server's limit of "
                            f"{caps.max_beam - 1}")
    options = DecodeOptions(beam=max(DecodeOptions().beam, req.alternatives + 1), nbest=req.alternatives + 1,
                            max_len=caps.max_output_tokens)
    done = iter(await queue(sentences, options, False) if sentences else [])
    outputs = [_versions(pieces, [next(done) for _, move in pieces if move], req) for pieces in split]
    texts = [best for best, _ in outputs]
    answer: dict = {"translatedText": texts if req.is_list else texts[0]}
    if req.alternatives:
        others = [alts for _, alts in outputs]
        answer["alternatives"] = others if req.is_list else others[0]
    return answer


def _versions(pieces: list[Piece], done: list[Translation], req: LibreRequest) -> tuple[str, list[str]]:
    """One text put back together: its best translation, and each alternative (the i-th alternative of every piece
    in the places of the pieces; a piece with fewer alternatives keeps its best)."""
    def text(t: Translation, i: int) -> str:
        options = [t.text, *(n.text for n in t.nbest)]
        chosen = options[i] if i < len(options) else t.text
        return html.escape(chosen, quote=False) if req.html else chosen

    best, *alternatives = (put_back(pieces, [text(t, i) for t in done]) for i in range(req.alternatives + 1))
    return best, alternatives


def install(app: FastAPI, queue: Queue, caps: Limits, languages: dict[str, str | None],
            targets: list[str]) -> None:
    """LibreTranslate's routes under PREFIX; `targets` the languages the model translates into (none: any)."""
    src = languages.get("src")

    @app.post(f"{PREFIX}/translate", tags=["LibreTranslate"])
    async def libre_translate(request: Request) -> dict:
        """LibreTranslate's /translate (module docstring)."""
        req = parse_request(await read_fields(request), languages, targets)
        return await translate_texts(req, queue, caps)

    @app.get(f"{PREFIX}/languages", tags=["LibreTranslate"])
    async def libre_languages() -> list[dict]:
        """The model's source language and the targets it translates into (empty where the checkpoint does not
        record its languages)."""
        return [{"code": src, "name": NAMES.get(src, src), "targets": targets}] if src and targets else []
