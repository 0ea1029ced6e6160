"""An HTTP translation service: `POST /translate` in, translations with scores out.

Why a queue. A Transformer translating one sentence spends most of its time in small matmuls that
leave the hardware idle; the same matmuls over a batch of sentences cost little more. So requests are
not translated where they arrive: each handler puts a job on an asyncio queue and awaits a future.
One worker task takes what is pending (waiting at most `batch_wait_ms` for more, up to
`max_batch_sentences` sentences), groups the jobs whose decoding options are identical, runs
`Translator.translate` once per group in a worker thread, and hands each job its slice of the results.
The batch amortises the encoder and decoder matmuls over concurrent clients, while the event loop stays
free to accept requests. Only that one worker touches the model, one group at a time: torch modules are
not meant to be driven from several threads at once, and one batch at a time already uses every core.

Batching never changes an answer: the translator's output limits and masks are per sentence, so a
sentence comes out the same alone or among others. Sampling is the exception (one random generator is
seeded per call), so sampled jobs are never merged: each is what `translate(texts, seed=...)` gives.

Errors are one line of JSON, `{"error": "..."}`: 400 for a body that is not JSON, 415 for one sent
without a JSON Content-Type (FastAPI's guard against cross-site form posts to a local server), 422 for
a body of the wrong shape or invalid decoding options, 413 for too many or too long sentences, 500 if
the translation itself fails. None of them stops the worker or the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, model_validator
    from starlette.exceptions import HTTPException
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"attnkit.serve needs the serve extra: pip install 'attnkit[serve]' ({e})") from e

from attnkit import __version__
from attnkit.decode.translator import DecodeOptions, Translation, Translator
from attnkit.errors import AttnkitError, ConfigError

log = logging.getLogger("attnkit.serve")
_D = DecodeOptions  # its field defaults are the API's defaults: one source of truth


# ---------------------------------------------------------------------------------------------- schema
class TranslateRequest(BaseModel):
    """One sentence (`text`) or several (`texts`), and how to search."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: str | None = None
    texts: list[str] | None = Field(None, min_length=1)
    beam: int = _D.beam
    nbest: int = Field(_D.nbest, description="hypotheses to return (best in the result, the others in .nbest)")
    len_penalty: float = _D.len_penalty
    sampling: bool = _D.sampling
    temperature: float = _D.temperature
    top_k: int = _D.top_k
    top_p: float = _D.top_p
    seed: int = _D.seed
    alignment: bool = Field(False, description="for each target piece, the source piece it attends to most")

    @model_validator(mode="after")
    def _one_of_text_or_texts(self) -> TranslateRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("give exactly one of 'text' (a string) or 'texts' (a list of strings)")
        return self

    def sentences(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])

    def options(self) -> DecodeOptions:
        """The DecodeOptions; ConfigError names the offending field as the API spells it."""
        try:
            return DecodeOptions(beam=self.beam, nbest=self.nbest, len_penalty=self.len_penalty,
                                 sampling=self.sampling, temperature=self.temperature, top_k=self.top_k,
                                 top_p=self.top_p, seed=self.seed)
        except ConfigError as e:  # its messages name CLI flags (--beam); here they are JSON fields
            raise ConfigError(re.sub(r"--([a-z][a-z-]*)", lambda m: m[1].replace("-", "_"), str(e))) from None


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="summed log-probability of the output, EOS included")
    norm_score: float = Field(description="the score the search ranked by")


class TranslationOut(Hypothesis):
    nbest: list[Hypothesis] = Field(description="the other hypotheses, best first")
    alignment: list[int] | None = Field(description="source position per target piece, if asked for")


class TranslateResponse(BaseModel):
    translations: list[TranslationOut]


class Health(BaseModel):
    status: str
    model: str
    device: str
    queue: int = Field(description="requests waiting for the worker")


class ErrorOut(BaseModel):
    error: str


def _to_out(t: Translation, alignment: bool) -> TranslationOut:
    return TranslationOut(text=t.text, score=t.score, norm_score=t.norm_score,
                          nbest=[Hypothesis(text=h.text, score=h.score, norm_score=h.norm_score) for h in t.nbest],
                          alignment=t.alignment if alignment else None)


# --------------------------------------------------------------------------------------------- batcher
@dataclass
class _Job:
    sentences: list[str]
    options: DecodeOptions
    need_attention: bool
    future: asyncio.Future

    def group_key(self) -> tuple:
        # sampled jobs stay alone: one generator per translate() call, so company would change the draw
        return (self.options, self.need_attention, id(self) if self.options.sampling else None)


class Batcher:
    """The queue and its single worker; `submit` is what request handlers await."""

    def __init__(self, translator: Translator, *, max_batch_sentences: int, batch_wait_ms: float):
        self.translator = translator
        self.max_batch_sentences = max_batch_sentences
        self.batch_wait = batch_wait_ms / 1000
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: _Job | None = None  # taken from the queue but did not fit in the last batch
        self._worker: asyncio.Task | None = None
        self._running: list[_Job] = []  # the batch being translated

    @property
    def pending(self) -> int:
        return (self._queue.qsize() if self._queue else 0) + (self._held is not None)

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="attnkit-translate-worker")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        leftovers = self._running + ([self._held] if self._held else [])
        while self._queue is not None and not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for job in leftovers:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        self._worker, self._held = None, None

    async def submit(self, sentences: list[str], options: DecodeOptions, need_attention: bool) -> list[Translation]:
        if self._queue is None:
            raise RuntimeError("the translation worker is not running")
        job = _Job(sentences, options, need_attention, asyncio.get_running_loop().create_future())
        await self._queue.put(job)
        return await job.future

    async def _run(self) -> None:
        while True:
            jobs = self._running = await self._collect()
            try:
                await self._translate(jobs)
            except Exception:  # a bug here must not stop the service: fail these jobs, go on
                log.exception("translation worker")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("internal error in the translation worker"))
            self._running = []

    async def _collect(self) -> list[_Job]:
        """The first pending job, then whatever arrives within batch_wait, up to max_batch_sentences."""
        assert self._queue is not None
        first = self._held if self._held is not None else await self._queue.get()
        self._held = None
        jobs, n = [first], len(first.sentences)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait
        while n < self.max_batch_sentences:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), timeout)
                except asyncio.TimeoutError:  # not the builtin before Python 3.11
                    break
            if n + len(job.sentences) > self.max_batch_sentences:
                self._held = job  # first in the next batch, so order is kept
                break
            jobs.append(job)
            n += len(job.sentences)
        return jobs

    async def _translate(self, jobs: list[_Job]) -> None:
        groups: dict[tuple, list[_Job]] = {}
        for job in jobs:
            if not job.future.done():  # a client that went away is not translated for
                groups.setdefault(job.group_key(), []).append(job)
        for group in groups.values():
            head = group[0]
            sentences = [s for job in group for s in job.sentences]
            try:
                results = await asyncio.to_thread(self.translator.translate, sentences, head.options,
                                                  batch_size=self.max_batch_sentences,
                                                  need_attention=head.need_attention)
            except Exception as e:
                log.exception("translate failed for %d sentences", len(sentences))
                for job in group:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            start = 0
            for job in group:
                if not job.future.done():
                    job.future.set_result(results[start:start + len(job.sentences)])
                start += len(job.sentences)


# ------------------------------------------------------------------------------------------------- app
class ApiError(Exception):
    """A request the service refuses: answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": _one_line(message)}, status_code=status)


def _validation_message(err: dict) -> tuple[int, str]:
    """FastAPI's list of pydantic errors -> (status, one line naming the field)."""
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        where = f" at position {err['loc'][1]}" if len(err.get("loc", ())) > 1 else ""
        return 400, f"malformed JSON body: {detail or err.get('msg')}{where}"
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    msg = re.sub(r"^Value error, ", "", str(err.get("msg", "invalid request")))
    if not loc and err.get("type") == "missing":
        return 422, "the request needs a JSON object body"
    if not loc and isinstance(err.get("input"), bytes):  # FastAPI parses JSON only when the header says so
        return 415, "send the body as JSON, with the header 'Content-Type: application/json'"
    if not loc and err.get("type") == "model_attributes_type":
        return 422, "the request body must be a JSON object"
    if loc and err.get("type") == "extra_forbidden":
        return 422, f"unknown field '{'.'.join(loc)}'"
    return 422, f"field '{'.'.join(loc)}': {msg}" if loc else msg


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        status, message = _validation_message(errors[0]) if errors else (422, "invalid request")
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more)"
        return _error(status, message)

    @app.exception_handler(ApiError)
    async def _refused(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error: %s: %s", type(exc).__name__, exc)
        return _error(500, f"internal error: {type(exc).__name__}")


def create_app(translator: Translator, *, max_batch_sentences: int = 64, max_request_sentences: int = 64,
               max_chars: int = 1000, batch_wait_ms: float = 5.0) -> FastAPI:
    """A FastAPI app serving `translator`; the batching worker lives as long as the app's lifespan."""
    if min(max_batch_sentences, max_request_sentences, max_chars) < 1 or batch_wait_ms < 0:
        raise ConfigError("serve: the sentence and character limits must be at least 1, batch_wait_ms at least 0")
    batcher = Batcher(translator, max_batch_sentences=max_batch_sentences, batch_wait_ms=batch_wait_ms)
    model_kind = getattr(translator.model, "kind", type(translator.model).__name__)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="attnkit", version=__version__, lifespan=lifespan,
                  description="Translate text with an attnkit checkpoint. Errors are `{\"error\": \"...\"}`.")
    app.state.batcher = batcher
    _install_error_handlers(app)
    errors = {code: {"model": ErrorOut} for code in (400, 413, 415, 422, 500)}

    @app.get("/health")
    async def health() -> Health:
        return Health(status="ok", model=model_kind, device=str(translator.device), queue=batcher.pending)

    @app.post("/translate", responses=errors)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        sentences = req.sentences()
        if len(sentences) > max_request_sentences:
            raise ApiError(413, f"{len(sentences)} sentences in one request; the limit is {max_request_sentences}")
        for i, s in enumerate(sentences):
            if len(s) > max_chars:
                raise ApiError(413, f"sentence {i + 1} has {len(s)} characters; the limit is {max_chars}")
        try:
            options = req.options()
            results = await batcher.submit(sentences, options, req.alignment)
        except AttnkitError as e:
            raise ApiError(422, str(e)) from None
        except Exception as e:
            raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None
        return TranslateResponse(translations=[_to_out(t, req.alignment) for t in results])

    return app


def serve(checkpoint: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto", **app_kw) -> None:
    """Load `checkpoint` and serve it over HTTP until interrupted; `app_kw` go to `create_app`."""
    translator = Translator.from_checkpoint(checkpoint, device)
    app = create_app(translator, **app_kw)
    uvicorn.run(app, host=host, port=port, log_level="info")


__all__ = ["Batcher", "TranslateRequest", "TranslateResponse", "create_app", "serve"]
