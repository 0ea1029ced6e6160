"""The language-model service: `POST /generate` streams sampled tokens as server-sent events, `POST /explore` returns
a text's self-attention for the explorer page at `/`; `/health` and `/metrics` as the translation service has them.

A stream is `event: token` with `{"text": ...}` (what the token adds to the text) for every token as it is drawn,
the memory carried from one token to the next, then `event: done` with the whole continuation, or `event: error`.
Sampling equals `attnkit lm generate` with the same prompt, length, temperature, top_k, top_p and seed. A client that
goes away stops the sampling at the next token.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from attnkit import __version__
from attnkit.config import LMRunConfig
from attnkit.decode.lm import sample_text
from attnkit.errors import AttnkitError, ConfigError
from attnkit.serve.http import ApiError, ModelGate, answer, check_input, install_error_handlers, install_metrics, log
from attnkit.serve.metrics import ServiceMetrics
from attnkit.serve.schema import ErrorOut, ExploreRequest, GenerateRequest, Health, Limits, api_words
from attnkit.viz.attention import lm_encode, lm_views
from attnkit.viz.explorer import explorer_data, explorer_page


class _Gone(Exception):
    """The client closed the stream: sampling stops."""


def create_lm_app(model: Any, vocab: Any, cfg: LMRunConfig, *, request_timeout_s: float = 60.0,
                  **limits: Any) -> FastAPI:
    """A FastAPI app serving a language model (`limits`: the fields of `Limits`)."""
    caps = Limits(**limits)
    if request_timeout_s <= 0:
        raise ConfigError("serve: --request-timeout-s must be above 0")
    gate, running = ModelGate(), set()  # running: the sampling tasks of open streams
    metrics = ServiceMetrics(lambda: gate.waiting)
    device = next(model.parameters()).device
    app = FastAPI(title="attnkit", version=__version__,
                  description="Sample from and look inside an attnkit language model. "
                              "Errors are `{\"error\": \"...\"}`.")
    install_error_handlers(app)
    install_metrics(app, metrics)
    errors = {code: {"model": ErrorOut} for code in (400, 413, 415, 422, 500, 504)}
    title = f"attnkit: {model.kind}"
    page = explorer_page(title, live={"task": "lm", "max_output_tokens": caps.max_output_tokens})

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
        if req.beam > 1 or req.nbest > 1:
            raise ApiError(422, "field 'beam': a language model reads its text; beam and nbest are for translation")
        views = await answer(gate.run(_read, model, vocab, cfg, req.text), "reading", request_timeout_s)
        return explorer_data([[v] for v in views], title=title, model=model.kind, task="lm")

    @app.post("/generate", responses=errors)
    async def generate(req: GenerateRequest) -> StreamingResponse:
        """Sample `length` tokens after `prompt`, streamed as server-sent events as they are drawn."""
        check_input(req.prompt, "prompt", caps.max_chars)
        try:
            req.check(caps)
        except AttnkitError as e:
            raise ApiError(422, str(e)) from None
        return StreamingResponse(_stream(gate, running, model, vocab, cfg, req), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def _read(model: Any, vocab: Any, cfg: LMRunConfig, text: str) -> list:
    return lm_views(model, vocab, cfg, [lm_encode(vocab, text)])


def _event(name: str, payload: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream(gate: ModelGate, running: set, model: Any, vocab: Any, cfg: LMRunConfig, req: GenerateRequest
                  ) -> AsyncIterator[str]:
    """The events of one sampling run: a worker thread draws the tokens (holding the gate) and hands each one's
    text to the event loop, which sends it at once."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
    gone = threading.Event()

    def on_text(delta: str) -> None:
        if gone.is_set():
            raise _Gone
        loop.call_soon_threadsafe(queue.put_nowait, ("token", {"text": delta}))

    async def produce() -> None:
        try:
            text = await gate.run(sample_text, model, vocab, cfg, req.prompt, req.length, temperature=req.temperature,
                                  top_k=req.top_k, top_p=req.top_p, seed=req.seed, on_text=on_text)
            queue.put_nowait(("done", {"text": text}))
        except _Gone:
            pass
        except AttnkitError as e:
            queue.put_nowait(("error", {"error": api_words(str(e))}))
        except Exception as e:
            log.error("sampling failed: %s: %s", type(e).__name__, e)
            queue.put_nowait(("error", {"error": f"sampling failed: {type(e).__name__}"}))

    task = asyncio.create_task(produce())
    running.add(task)  # held until it ends, whatever the client does
    task.add_done_callback(running.discard)
    try:
        while True:
            name, payload = await queue.get()
            yield _event(name, payload)
            if name != "token":
                break
    finally:
        gone.set()  # the client went away (or the stream ended): the next token stops the sampling


__all__ = ["create_lm_app"]
