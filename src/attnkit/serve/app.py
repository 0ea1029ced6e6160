"""An HTTP translation service: `POST /translate` in, translations with scores out.

Requests are checked against the server's caps (`Limits`) and their text validated before they join a
batch (schema.py); a bounded queue and one worker translate them in batches (batcher.py); operators read
`/health` and Prometheus' `/metrics` (metrics.py).

Errors are one line of JSON, `{"error": "..."}`: 400 for a body that is not JSON, 415 for one sent without
a JSON Content-Type (FastAPI's guard against cross-site form posts to a local server), 422 for a body of
the wrong shape, invalid decoding options or a value over a cap, 413 for too many or too long sentences,
503 (with Retry-After) when the queue is full, 504 past the per-request time limit, 500 if the translation
itself fails. None of them stops the worker or the server, and a failure stays with its own request.
SIGTERM (and Ctrl-C) stop accepting connections, answer every request already accepted, then exit 0.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import time
from collections.abc import AsyncIterator

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    from attnkit.serve.metrics import CONTENT_TYPE, ServiceMetrics
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"attnkit.serve needs the serve extra: pip install 'attnkit[serve]' ({e})") from e

from attnkit import __version__
from attnkit.decode.memory import gigabytes
from attnkit.decode.translator import DecodeOptions, Translator
from attnkit.errors import AttnkitError, ConfigError
from attnkit.runtime import available_memory
from attnkit.serve.batcher import Batcher, Busy
from attnkit.serve.schema import (
    ErrorOut,
    Health,
    Limits,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
    api_words,
    check_text,
)

log = logging.getLogger("attnkit.serve")


# ------------------------------------------------------------------------------------------------- app
class ApiError(Exception):
    """A request the service refuses: answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": _one_line(message)}, status_code=status, headers=headers)


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
        return _error(exc.status, str(exc), exc.headers)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error: %s: %s", type(exc).__name__, exc)
        return _error(500, f"internal error: {type(exc).__name__}")


def check_memory(translator: Translator, limits: Limits, budget: int | None) -> None:
    """Refuse to start when the largest request the caps allow could not be translated within `budget`."""
    worst = DecodeOptions(beam=limits.max_beam, nbest=limits.max_beam, max_len=limits.max_output_tokens)
    src_len = min(limits.max_chars + 1, translator.max_src_len + 1)  # a subword covers one character or more
    need = translator.search_bytes(1, src_len, worst, need_attention=True)
    if budget and need > budget:
        raise ConfigError(f"serve: one {src_len}-token sentence at --max-beam {limits.max_beam} and "
                          f"--max-output-tokens {limits.max_output_tokens} needs about {gigabytes(need)}, more than "
                          f"the memory budget of {gigabytes(budget)}: lower them, or raise --memory-budget-mb")


def create_app(translator: Translator, *, max_batch_sentences: int = 64, batch_wait_ms: float = 5.0,
               max_queue: int = 256, request_timeout_s: float = 60.0, memory_budget_mb: float | None = None,
               **limits) -> FastAPI:
    """A FastAPI app serving `translator`; the batching worker lives as long as the app's lifespan.

    `limits` are the fields of `Limits` (max_request_sentences, max_chars, max_beam, max_output_tokens,
    max_top_k); the memory budget per batch defaults to half the memory available at start.
    """
    caps = Limits(**limits)
    if max_batch_sentences < 1 or max_queue < 1 or batch_wait_ms < 0 or request_timeout_s <= 0:
        raise ConfigError("serve: --max-batch-sentences and --max-queue must be at least 1, --batch-wait-ms at "
                          "least 0, --request-timeout-s above 0")
    available = available_memory(translator.device)
    budget = int(memory_budget_mb * 2**20) if memory_budget_mb else (available // 2 if available else None)
    check_memory(translator, caps, budget)
    batcher = Batcher(translator, max_batch_sentences=max_batch_sentences, batch_wait_ms=batch_wait_ms,
                      max_queue=max_queue, memory_budget=budget or 0)
    metrics = ServiceMetrics(lambda: batcher.pending)
    batcher.on_batch = metrics.observe_batch
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
    app.state.batcher, app.state.request_timeout_s = batcher, request_timeout_s
    _install_error_handlers(app)
    _install_metrics(app, metrics)
    errors = {code: {"model": ErrorOut} for code in (400, 413, 415, 422, 500, 503, 504)}

    @app.get("/health")
    async def health() -> Health:
        return Health(status="ok", model=model_kind, device=str(translator.device),
                      quantize=getattr(translator, "quantize", None) or "none", queue=batcher.pending)

    @app.post("/translate", responses=errors)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        sentences, options = _checked(req, caps)
        try:
            results = await batcher.submit(sentences, options, req.alignment, timeout=request_timeout_s)
        except Busy as e:
            metrics.rejected.labels("queue_full").inc()
            raise ApiError(503, str(e), {"Retry-After": str(e.retry_after)}) from None
        except TimeoutError as e:
            raise ApiError(504, f"translation took too long: {e}") from None
        except AttnkitError as e:
            raise ApiError(422, api_words(str(e))) from None
        except Exception as e:
            raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None
        return TranslateResponse(translations=[TranslationOut.of(t, req.alignment) for t in results])

    return app


def _checked(req: TranslateRequest, caps: Limits) -> tuple[list[str], DecodeOptions]:
    """The request's sentences and options, or ApiError (413 / 422) before it goes near a batch."""
    sentences = req.sentences()
    if len(sentences) > caps.max_request_sentences:
        raise ApiError(413, f"{len(sentences)} sentences in one request; the limit is {caps.max_request_sentences}")
    try:
        for field, s in zip(req.fields(), sentences):
            if len(s) > caps.max_chars:
                raise ApiError(413, f"field '{field}' has {len(s)} characters; the limit is {caps.max_chars}")
            check_text(s, field)
        return sentences, req.options(caps)
    except AttnkitError as e:
        raise ApiError(422, str(e)) from None


_ROUTES = re.compile(r"^/(translate|health|metrics|docs|openapi\.json)$")


def _install_metrics(app: FastAPI, metrics: ServiceMetrics) -> None:
    @app.middleware("http")
    async def _count(request: Request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        route = request.url.path if _ROUTES.match(request.url.path) else "other"  # bounded label values
        metrics.observe_request(route, response.status_code, time.perf_counter() - start)
        return response

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)


def serve(checkpoint: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          quantize: str | None = None, **app_kw) -> None:
    """Load `checkpoint` (int8 weights with quantize="int8") and serve it over HTTP until SIGTERM or Ctrl-C;
    `app_kw` go to `create_app`.

    On SIGTERM uvicorn stops accepting connections and waits for the requests it has accepted (up to the
    per-request time limit); the process then exits normally (0), not by the signal (143).
    """
    translator = Translator.from_checkpoint(checkpoint, device, quantize=quantize)
    app = create_app(translator, **app_kw)
    grace = app.state.request_timeout_s + 5  # the longest an accepted request can still take
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=grace)
    # uvicorn re-raises the signal that stopped it once it has drained; a handler here makes that a no-op
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["ApiError", "create_app", "serve"]
