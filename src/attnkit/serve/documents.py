"""`POST /translate/document`: a whole text translated a sentence at a time (attnkit.data.sentences), its line
breaks, blank lines and spaces kept, as `attnkit translate --document` does.

The answer is `{"translation": ...}`; with `"stream": true` it is server-sent events instead, `event: sentence` with
`{"index", "source", "text"}` for each sentence in the text's order as soon as it and those before it are
translated, then `event: done` with the whole translation, or `event: error` with `{"error", "status"}` (the status
the request would have had) after the sentences already sent. Each sentence is its own job in the translation
queue, so a long text starts coming back after its first batch and shares the worker with other requests; a client
that goes away cancels the sentences not yet translated. Every sentence counts against `--max-request-sentences`
and `--max-chars`. tests/test_serve_documents.py checks both answers against `translate_document`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import Field

from attnkit.data.sentences import Piece, put_back, sentence_pieces
from attnkit.decode.options import DecodeOptions
from attnkit.errors import AttnkitError
from attnkit.serve.http import ApiError, check_sentences, sse_event
from attnkit.serve.libretranslate import Queue
from attnkit.serve.schema import GlossaryFields, Limits

_D = DecodeOptions()


class DocumentRequest(GlossaryFields):
    """A text of any number of lines and sentences, how to search each sentence, and a glossary if any."""

    text: str
    beam: int = Field(_D.beam, ge=1)
    len_penalty: float = Field(_D.len_penalty, ge=-5.0, le=5.0)
    stream: bool = Field(False, description="server-sent events, a sentence at a time")

    def options(self, limits: Limits) -> DecodeOptions:
        if self.beam > limits.max_beam:
            raise ApiError(422, f"field 'beam': {self.beam} is over this server's limit of {limits.max_beam}")
        return DecodeOptions(beam=self.beam, len_penalty=self.len_penalty, max_len=limits.max_output_tokens)

    def checked_glossary(self, options: DecodeOptions, limits: Limits):
        try:
            return self.glossary_of(options, limits)
        except AttnkitError as e:
            raise ApiError(422, str(e)) from None


def checked_sentences(req: DocumentRequest, caps: Limits, lang: str | None) -> tuple[list[Piece], list[str]]:
    """The text's pieces and its sentences, or ApiError 413 / 422 before any of them is queued."""
    pieces = sentence_pieces(req.text, lang)
    sources = [part for part, move in pieces if move]
    check_sentences(sources, "text", caps.max_request_sentences, caps.max_chars)
    return pieces, sources


def install(app: FastAPI, queue: Queue, caps: Limits, lang: str | None, errors: dict) -> None:
    """The route, on `app`, translating through `queue` (the service's batching queue)."""

    @app.post("/translate/document", responses=errors)
    async def translate_document(req: DocumentRequest):
        """A whole text, a sentence at a time (module docstring); `"stream": true` for server-sent events."""
        options = req.options(caps)
        glossary = req.checked_glossary(options, caps)
        pieces, sources = checked_sentences(req, caps, lang)
        if not req.stream:
            results = await queue(sources, options, False, glossary=glossary) if sources else []
            return {"translation": put_back(pieces, [t.text for t in results])}
        jobs = [asyncio.ensure_future(queue([s], options, False, glossary=glossary)) for s in sources]
        return StreamingResponse(_events(pieces, sources, jobs), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(pieces: list[Piece], sources: list[str], jobs: list[asyncio.Future]) -> AsyncIterator[str]:
    texts = []
    try:
        for i, job in enumerate(jobs):
            try:
                texts.append((await job)[0].text)
            except ApiError as e:
                yield sse_event("error", {"error": str(e), "status": e.status})
                return
            yield sse_event("sentence", {"index": i, "source": sources[i], "text": texts[-1]})
        yield sse_event("done", {"translation": put_back(pieces, texts)})
    finally:  # the client went away or a sentence failed: the rest are not translated
        for job in jobs:
            if not job.cancel() and not job.cancelled():
                job.exception()  # a failure after the one reported: read, so that asyncio does not log it
