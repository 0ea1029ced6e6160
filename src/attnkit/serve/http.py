"""What the translation and the language-model services share: one-line JSON errors, Prometheus metrics, and the
gate that lets one request at a time use the model, with a cap on the requests waiting for it.

Errors are `{"error": "..."}`: 400 for a body that is not JSON, 415 for one sent without a JSON Content-Type
(FastAPI's guard against cross-site form posts to a local server), 422 for a body of the wrong shape or a value over
a cap, and whatever status an `ApiError` carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from attnkit.errors import AttnkitError
from attnkit.serve.metrics import CONTENT_TYPE, ServiceMetrics
from attnkit.serve.schema import api_words, check_text

log = logging.getLogger("attnkit.serve")


# The exceptions a time-out raises: one class from Python 3.11 (the declared floor), two before it, where
# asyncio.wait_for raised asyncio.TimeoutError and a builtin TimeoutError went past an `except asyncio.TimeoutError`.
TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


class ModelGate:
    """One model, one call at a time: each call runs in a worker thread (the event loop stays free) while it holds
    the gate. A caller that gives up (a timeout, a closed connection) does not open the gate early: it opens when
    the thread is done, so two calls never share the model's threads and caches.

    Callers wait in line, first come first served, and at most `max_waiting` of them (None: any number): one more
    is refused at once with Busy (503 and Retry-After), so a queue cannot grow without bound behind a long call.
    A caller that finds the gate open takes it without waiting, so it is never counted as waiting."""

    def __init__(self, max_waiting: int | None = None) -> None:
        self.max_waiting = max_waiting
        self._held = False
        self._line: deque[asyncio.Future] = deque()  # one future per waiting caller, set when it is its turn
        self._seconds_per_call = 1.0  # running mean, for Retry-After

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def enter(self, timeout: float | None = None) -> None:
        """Wait for the gate, then hold it: the caller must `start` its call at once. Busy when `max_waiting`
        callers already wait; TimeoutError when its turn has not come within `timeout` s."""
        if not self._held and not self._line:
            self._held = True
            return
        if self.max_waiting is not None and self.waiting >= self.max_waiting:
            raise Busy(max(1, min(60, math.ceil((self.waiting + 1) * self._seconds_per_call))))
        turn = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            await asyncio.wait_for(turn, timeout)
        except BaseException as e:  # a time-out, or the caller cancelled: it leaves the line
            if turn.done() and not turn.cancelled():
                self._open()  # its turn came as it gave up: the gate goes to the next caller
            with contextlib.suppress(ValueError):
                self._line.remove(turn)
            if isinstance(e, TIMEOUTS):
                raise TimeoutError(f"not started within {timeout:g} s") from None
            raise

    def start(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> asyncio.Future:
        """fn(*args, **kw) in a worker thread, for the caller that has entered; the gate opens when it returns."""
        began = time.perf_counter()
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kw))
        task.add_done_callback(lambda _: self._leave(time.perf_counter() - began))
        return task

    async def run(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Enter (Busy past `max_waiting`), then fn(*args, **kw) in a worker thread: its result."""
        await self.enter()
        return await asyncio.shield(self.start(fn, *args, **kw))

    def _leave(self, seconds: float) -> None:
        self._seconds_per_call = 0.8 * self._seconds_per_call + 0.2 * seconds
        self._open()

    def _open(self) -> None:
        """Hand the gate to the first caller still in line, or leave it open."""
        while self._line:
            turn = self._line.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._held = False


class ApiError(Exception):
    """A request the service refuses: answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Busy(ApiError):
    """The queue is full (503); `retry_after` is the seconds until it has likely drained."""

    def __init__(self, retry_after: int):
        super().__init__(503, f"the server is busy; retry in {retry_after} s", {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


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


def sse_event(name: str, payload: dict) -> str:
    """One server-sent event: its name and a JSON payload."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def check_sentences(sentences: list[str], field: str, max_sentences: int, max_chars: int) -> None:
    """ApiError 413 for more sentences than the cap in one field (a text split into its sentences), else each one's
    check_input."""
    if len(sentences) > max_sentences:
        raise ApiError(413, f"field '{field}' holds {len(sentences)} sentences; the limit is {max_sentences}")
    for sentence in sentences:
        check_input(sentence, field, max_chars)


def check_input(text: str, field: str, max_chars: int) -> None:
    """ApiError 413 for a text over the cap, 422 for one the tokenizer cannot take."""
    if len(text) > max_chars:
        raise ApiError(413, f"field '{field}' has {len(text)} characters; the limit is {max_chars}")
    try:
        check_text(text, field)
    except AttnkitError as e:
        raise ApiError(422, str(e)) from None


async def answer(call: Any, what: str, timeout: float | None = None) -> Any:
    """Await `call` (model work: a batch's future, or a call through the gate), within `timeout` s if given; its
    failures become ApiErrors: 504 late, 422 for what the library refuses, 500 for anything else (the service goes
    on). An ApiError it raises (a full queue: 503) passes unchanged."""
    try:
        return await (asyncio.wait_for(call, timeout) if timeout else call)
    except ApiError:
        raise
    except TIMEOUTS as e:
        raise ApiError(504, f"{what} took too long: {e or f'no answer within {timeout:g} s'}") from None
    except AttnkitError as e:
        raise ApiError(422, api_words(str(e))) from None
    except Exception as e:
        log.error("%s failed: %s: %s", what, type(e).__name__, e)
        raise ApiError(500, f"{what} failed: {type(e).__name__}: {e}") from None


def install_error_handlers(app: FastAPI) -> None:
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


_ROUTES = re.compile(r"^/(|translate|explore|generate|health|metrics|docs|openapi\.json)$")


def install_metrics(app: FastAPI, metrics: ServiceMetrics) -> None:
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
