"""The language-model service: `POST /generate` streams sampled tokens as server-sent events, `POST /explore` returns
a text's self-attention for the explorer page at `/`; `/health` and `/metrics` as the translation service has them.

A stream is `event: token` with `{"text": ...}` (what the token adds to the text) for every token as it is drawn,
the memory carried from one token to the next, then `event: done` with the whole continuation, or `event: error`
with `{"error": ..., "status": ...}` (the status the request would have had if it had failed before its stream began).
Sampling equals `attnkit lm generate` with the same prompt, length, temperature, top_k, top_p and seed. A client that
goes away stops the sampling at the next token.

The limits are the translation service's. One request uses the model at a time and at most `max_queue` wait for it:
one more gets 503 with Retry-After at once, and one that cannot start within `request_timeout_s` gets 504. The time
limit covers the whole request, as for an answer from /translate: a stream still running when it ends stops at the
next token and ends with `event: error` (status 504) after the tokens already sent, so no request holds the model
longer than the limit and the requests waiting behind it keep their turn. The server refuses to start when the
largest request the caps allow could not be read within the memory budget.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from attnkit import __version__
from attnkit.config import LMRunConfig
from attnkit.decode.lm import sample_text
from attnkit.decode.memory import FLOAT, gigabytes
from attnkit.errors import AttnkitError, ConfigError
from attnkit.runtime import available_memory
from attnkit.serve.http import (
    TIMEOUTS,
    ApiError,
    Busy,
    ModelGate,
    answer,
    check_input,
    install_error_handlers,
    install_metrics,
    log,
    sse_event,
)
from attnkit.serve.metrics import LMMetrics
from attnkit.serve.schema import ErrorOut, ExploreRequest, GenerateRequest, Health, Limits, api_words
from attnkit.viz.attention import lm_encode, lm_views
from attnkit.viz.explorer import explorer_data, explorer_page


class _Stop(Exception):
    """Raised by the token callback to stop the sampling: `why` is client_gone or time_limit."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


# The translation service's batching options (create_app's): sampling runs one request at a time, a stream each
BATCHING = ("max_batch_sentences", "batch_wait_ms")


def refuse_batching(options: dict[str, Any], what: str) -> None:
    """A one-line ConfigError when `options` give a batching option (None: not given), `what` naming the model, so
    that `attnkit serve --max-batch-sentences` on a language model says it cannot batch rather than being ignored
    (tests/test_cli.py)."""
    given = [f"--{name.replace('_', '-')}" for name in BATCHING if options.get(name) is not None]
    if given:
        raise ConfigError(f"{' and '.join(given)} batch translation requests; {what}, whose service samples one "
                          "request at a time (a stream each): leave them out")


def create_lm_app(model: Any, vocab: Any, cfg: LMRunConfig, *, max_queue: int = 256, request_timeout_s: float = 60.0,
                  memory_budget_mb: float | None = None, **limits: Any) -> FastAPI:
    """A FastAPI app serving a language model (`limits`: the fields of `Limits`); the memory budget defaults to half
    the memory available at start. The translation service's batching options are refused (`refuse_batching`)."""
    refuse_batching(limits, f"a {model.kind} is a language model")
    limits = {name: value for name, value in limits.items() if name not in BATCHING}  # None: not given
    caps = Limits(**limits)
    if max_queue < 1 or request_timeout_s <= 0:
        raise ConfigError("serve: --max-queue must be at least 1, --request-timeout-s above 0")
    device = next(model.parameters()).device
    available = available_memory(device)
    budget = int(memory_budget_mb * 2**20) if memory_budget_mb else (available // 2 if available else None)
    check_lm_memory(model, cfg, caps, budget)
    gate, running = ModelGate(max_waiting=max_queue), set()  # running: the sampling tasks of open streams
    metrics = LMMetrics(lambda: gate.waiting)
    app = FastAPI(title="attnkit", version=__version__,
                  description="Sample from and look inside an attnkit language model. "
                              "Errors are `{\"error\": \"...\"}`.")
    install_error_handlers(app)
    install_metrics(app, metrics)
    errors = {code: {"model": ErrorOut} for code in (400, 413, 415, 422, 500, 503, 504)}
    title = f"attnkit: {model.kind}"
    page = explorer_page(title, live={"task": "lm", "max_output_tokens": caps.max_output_tokens})

    async def admitted(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except Busy:
            metrics.rejected.labels("queue_full").inc()
            raise

    @app.get("/health")
    async def health() -> Health:
        return Health(status="ok", model=model.kind, device=str(device), queue=gate.waiting)

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        """The attention explorer: type a text, see the model's self-attention over it, or stream a continuation."""
        return HTMLResponse(page)

    @app.post("/explore", responses=errors)
    async def explore(req: ExploreRequest) -> dict:
        """The self-attention of the model over `text` (its first half read as the memory by Transformer-XL) and
        its greedy continuation, as the explorer page draws them."""
        check_input(req.text, "text", caps.max_chars)
        asked = [name for name, given in (("beam", req.beam > 1), ("nbest", req.nbest > 1),
                                          ("glossary", bool(req.glossary))) if given]
        if asked:
            raise ApiError(422, f"field '{asked[0]}': a language model reads its text; beam, nbest and glossary are "
                                "for translation")
        views = await admitted(answer(gate.run(_read, model, vocab, cfg, req.text), "reading", request_timeout_s))
        return explorer_data([[v] for v in views], title=title, model=model.kind, task="lm")

    @app.post("/generate", responses=errors)
    async def generate(req: GenerateRequest) -> StreamingResponse:
        """Sample `length` tokens after `prompt`, streamed as server-sent events as they are drawn; the stream ends
        with an error event if the request's time limit runs out first."""
        deadline = time.monotonic() + request_timeout_s
        check_input(req.prompt, "prompt", caps.max_chars)
        try:
            req.check(caps)
        except AttnkitError as e:
            raise ApiError(422, str(e)) from None
        try:  # before the stream begins, so that a full queue or a late start is a status, not an event
            await admitted(gate.enter(request_timeout_s))
        except TIMEOUTS:
            raise ApiError(504, f"sampling did not start within {request_timeout_s:g} s: the model was busy "
                                "with other requests") from None
        run = _Sampling(gate, model, vocab, cfg, req, deadline=deadline, limit_s=request_timeout_s, metrics=metrics)
        running.add(run.task)  # held until it ends, whatever the client does
        run.task.add_done_callback(running.discard)
        return StreamingResponse(run.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def lm_read_bytes(config: Any, *, tokens: int, memory: int, need_weights: bool) -> int:
    """Peak bytes of one forward pass of a language model over `tokens` new positions after `memory` remembered ones
    (batch 1, float32): an upper estimate, every buffer of a layer counted as live at once (a test measures it)."""
    d, layers = config.d_model, config.n_layers
    heads, ffn = getattr(config, "n_heads", 0), getattr(config, "d_ff", 4 * d)  # an LSTM: no heads, 4 D of gates
    t, s = tokens, tokens + memory
    layer = (5 * heads * t * s  # content and position scores, their sum, the masked scores, the softmax
             + t * (8 * d + ffn) + 2 * s * d)  # projections, FFN, residuals and norms; the context's keys and values
    kept = layers * (t * d + 3 * s * d)  # per layer: its input (the next memory), keys, values, position keys
    logits = 3 * t * config.vocab_size  # the logits and their (log-)softmax, every position
    return FLOAT * (layer + kept + logits + (layers * heads * t * s if need_weights else 0))  # the explorer's maps


def check_lm_memory(model: Any, cfg: LMRunConfig, limits: Limits, budget: int | None) -> None:
    """Refuse to start when the largest request the caps allow could not be served within `budget`: a text of
    --max-chars characters (a token covers one or more) read at once after the longest memory the model is run with,
    its attention kept for the explorer. Sampling reads no more at once (the prompt, then a token or a window at a
    time), so --max-output-tokens adds only the tokens themselves."""
    train = cfg.train
    memory = max(train.mem_len, train.eval_lengths[1]) if model.attends_to_memory else 0
    tokens = max(limits.max_chars + 1, train.tgt_len, *train.eval_lengths)  # a vanilla LM's window is one of these
    need = lm_read_bytes(model.config, tokens=tokens, memory=memory, need_weights=True)
    if budget and need > budget:
        raise ConfigError(f"serve: a text of {tokens} tokens (--max-chars {limits.max_chars}) read after {memory} "
                          f"remembered ones needs about {gigabytes(need)}, more than the memory budget of "
                          f"{gigabytes(budget)}: lower --max-chars, or raise --memory-budget-mb")


def _read(model: Any, vocab: Any, cfg: LMRunConfig, text: str) -> list:
    return lm_views(model, vocab, cfg, [lm_encode(vocab, text)])


class _Sampling:
    """One /generate run, started by a caller that holds the gate: a worker thread draws the tokens and hands each
    one's text to the event loop, which sends it at once. The thread stops at the next token once the client has
    gone or the request's time is up (`deadline`, on time.monotonic()); the gate opens when the thread ends."""

    def __init__(self, gate: ModelGate, model: Any, vocab: Any, cfg: LMRunConfig, req: GenerateRequest, *,
                 deadline: float, limit_s: float, metrics: LMMetrics):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        self.gone = threading.Event()
        self.req, self.deadline, self.limit_s, self.metrics = req, deadline, limit_s, metrics
        self.tokens = 0  # sent so far; written by the thread only
        self.task = gate.start(sample_text, model, vocab, cfg, req.prompt, req.length, temperature=req.temperature,
                               top_k=req.top_k, top_p=req.top_p, seed=req.seed, on_text=self._on_text)
        self.task.add_done_callback(self._ended)

    def _on_text(self, delta: str) -> None:
        """In the worker thread, after each token is drawn."""
        if self.gone.is_set():
            raise _Stop("client_gone")
        if time.monotonic() > self.deadline:
            raise _Stop("time_limit")
        self.tokens += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("token", {"text": delta}))

    def _ended(self, task: asyncio.Future) -> None:
        """In the event loop, once the thread has ended: after every token's event, since those were queued first."""
        end, payload = self._last(task)
        self.metrics.observe_stream(end, time.monotonic() - (self.deadline - self.limit_s), self.tokens)
        self.queue.put_nowait(("done" if end == "done" else "error", payload))

    def _last(self, task: asyncio.Future) -> tuple[str, dict]:
        """How the sampling ended (an LMMetrics.ENDS) and the last event's data."""
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        if error is None:
            return "done", {"text": task.result()}
        if isinstance(error, _Stop) and error.why == "time_limit":
            return error.why, {"error": f"the time limit of {self.limit_s:g} s ran out after {self.tokens} of "
                                        f"{self.req.length} tokens", "status": 504}
        if isinstance(error, _Stop):  # nobody reads this one
            return error.why, {"error": "the client closed the stream"}
        if isinstance(error, AttnkitError):
            return "error", {"error": api_words(str(error)), "status": 422}
        if isinstance(error, TIMEOUTS):
            return "error", {"error": f"sampling took too long: {error}", "status": 504}
        log.error("sampling failed: %s: %s", type(error).__name__, error)
        return "error", {"error": f"sampling failed: {type(error).__name__}", "status": 500}

    async def events(self) -> AsyncIterator[str]:
        try:
            while True:
                name, payload = await self.queue.get()
                yield sse_event(name, payload)
                if name != "token":
                    break
        finally:
            self.gone.set()  # the client went away (or the stream ended): the next token stops the sampling


__all__ = ["BATCHING", "check_lm_memory", "create_lm_app", "lm_read_bytes", "refuse_batching"]
