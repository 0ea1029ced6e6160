"""An HTTP translation service: `POST /translate` in, translations with scores out; `GET /` the attention explorer,
which asks `POST /explore` for a sentence's hypotheses and their attention; `POST /translate/document` a whole text
a sentence at a time, streamed on request (documents.py); LibreTranslate's API under
`/libretranslate/` for its clients (libretranslate.py). (Language models: lm_app.py.)

Requests are checked against the server's caps (`Limits`) and their text validated before they join a
batch (schema.py); a bounded queue and one worker translate them in batches (batcher.py); operators read
`/health` and Prometheus' `/metrics` (metrics.py).

Errors are one line of JSON, `{"error": "..."}`: 400 for a body that is not JSON, 415 for one sent without
a JSON Content-Type (FastAPI's guard against cross-site form posts to a local server), 422 for a body of
the wrong shape, invalid decoding options or a value over a cap, 413 for too many or too long sentences,
503 (with Retry-After) when the queue is full, 504 past the per-request time limit, 500 if the translation
itself fails. None of them stops the worker or the server, and a failure stays with its own request. The
explorer's requests (`POST /explore`) join the same queue, under the same caps, time limit and memory budget.
SIGTERM (and Ctrl-C) stop accepting connections, answer every request already accepted, then exit 0.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator

try:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    from attnkit.serve.http import ApiError, Busy, answer, check_input, install_error_handlers, install_metrics
    from attnkit.serve.metrics import TranslationMetrics
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"attnkit.serve needs the serve extra: pip install 'attnkit[serve]' ({e})") from e

from attnkit import __version__
from attnkit.cpu import int8_kernels
from attnkit.data.glossary import Glossary
from attnkit.decode.memory import gigabytes
from attnkit.decode.translator import DecodeOptions, Translator
from attnkit.errors import AttnkitError, ConfigError
from attnkit.runtime import available_memory
from attnkit.serve import documents, libretranslate
from attnkit.serve.batcher import Batcher
from attnkit.serve.schema import (
    ErrorOut,
    ExploreRequest,
    Health,
    Limits,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
)
from attnkit.viz.explorer import explorer_data, explorer_page


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
               languages: dict[str, str | None] | None = None, **limits) -> FastAPI:
    """A FastAPI app serving `translator`; the batching worker lives as long as the app's lifespan.

    `limits` are the fields of `Limits` (max_request_sentences, max_chars, max_beam, max_output_tokens,
    max_top_k); the memory budget per batch defaults to half the memory available at start. `languages` ({"src",
    "tgt"} codes, as checkpoints record them): documents' sentence rules, what LibreTranslate's routes check.
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
    metrics = TranslationMetrics(lambda: batcher.pending)
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
    install_error_handlers(app)
    install_metrics(app, metrics)
    errors = {code: {"model": ErrorOut} for code in (400, 413, 415, 422, 500, 503, 504)}

    @app.get("/health")
    async def health() -> Health:
        quantize = getattr(translator, "quantize", None) or "none"
        return Health(status="ok", model=model_kind, device=str(translator.device), quantize=quantize,
                      kernels=int8_kernels() if quantize == "int8" else "", queue=batcher.pending)

    async def queued(sentences: list[str], options: DecodeOptions, alignment: bool, views: bool = False,
                     glossary: Glossary | None = None) -> list:
        try:  # the batch's own timeout drops a late job from the queue
            return await answer(batcher.submit(sentences, options, alignment, timeout=request_timeout_s,
                                               views=views, glossary=glossary), "translation")
        except Busy:
            metrics.rejected.labels("queue_full").inc()
            raise

    @app.post("/translate", responses=errors)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        sentences, options, glossary = _checked(req, caps)
        results = await queued(sentences, options, req.alignment, glossary=glossary)
        return TranslateResponse(translations=[TranslationOut.of(t, req.alignment, glossary is not None)
                                               for t in results])

    _install_explorer(app, queued, caps, model_kind, errors)
    languages = languages or {}
    documents.install(app, queued, caps, languages.get("src"), errors)
    libretranslate.install(app, queued, caps, languages, [languages["tgt"]] if languages.get("tgt") else [])
    return app


def _install_explorer(app: FastAPI, queued, caps: Limits, model_kind: str, errors: dict) -> None:
    """`GET /`, the attention explorer, and `POST /explore`, the data it draws, queued like any translation."""
    page = explorer_page(f"attnkit: {model_kind}", live={"task": "translation", "max_beam": caps.max_beam})

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        """The attention explorer: type a sentence, see its translations and every attention map."""
        return HTMLResponse(page)

    @app.post("/explore", responses=errors)
    async def explore(req: ExploreRequest) -> dict:
        """One sentence translated with `beam` (`nbest` hypotheses), each with the attention the model computes for
        it, as the explorer page draws it; it waits in the translation queue like a request to /translate."""
        check_input(req.text, "text", caps.max_chars)
        try:
            options = req.options(caps)
            glossary = req.glossary_of(options, caps)
        except AttnkitError as e:
            raise ApiError(422, str(e)) from None
        items = await queued([req.text], options, False, views=True, glossary=glossary)
        return explorer_data(items, title=f"attnkit: {model_kind}", model=model_kind, task="translation")


def _checked(req: TranslateRequest, caps: Limits) -> tuple[list[str], DecodeOptions, Glossary | None]:
    """The request's sentences, options and glossary, or ApiError (413 / 422) before it goes near a batch."""
    sentences = req.sentences()
    if len(sentences) > caps.max_request_sentences:
        raise ApiError(413, f"{len(sentences)} sentences in one request; the limit is {caps.max_request_sentences}")
    for field, s in zip(req.fields(), sentences):
        check_input(s, field, caps.max_chars)
    try:
        options = req.options(caps)
        return sentences, options, req.glossary_of(options, caps)
    except AttnkitError as e:
        raise ApiError(422, str(e)) from None


def serve(checkpoint: str | list[str], *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          quantize: str | None = None, target_tag: str | None = None, **app_kw) -> None:
    """Load `checkpoint` and serve it over HTTP until SIGTERM or Ctrl-C: a translation model (int8 weights with
    quantize="int8"; a multilingual one translating into `target_tag` where a source names no tag), or several as
    one ensemble (`Translator.from_checkpoints`), through `create_app`, a language model through `create_lm_app`;
    `app_kw` go to them.

    On SIGTERM uvicorn stops accepting connections and waits for the requests it has accepted (up to the
    per-request time limit); the process then exits normally (0), not by the signal (143).
    """
    app = _load_app(checkpoint, device, quantize, app_kw, target_tag)
    grace = app_kw.get("request_timeout_s", 60.0) + 5  # the longest an accepted request can still take
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=grace)
    # uvicorn re-raises the signal that stopped it once it has drained; a handler here makes that a no-op
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _load_app(checkpoint: str | list[str], device: str, quantize: str | None, app_kw: dict,
              target_tag: str | None = None) -> FastAPI:
    from pathlib import Path

    from attnkit.checkpoint import checkpoint_languages, load_checkpoint, load_lm_checkpoint
    from attnkit.config import family
    from attnkit.runtime import resolve_device

    paths = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
    checkpoint = paths[0]
    kind = load_checkpoint(checkpoint).kind
    if family(kind, f"{checkpoint}: model kind").task != "lm":
        return create_app(Translator.from_checkpoints(paths, device, quantize=quantize, target_tag=target_tag),
                          languages=checkpoint_languages(checkpoint), **app_kw)
    if len(paths) > 1:
        raise ConfigError(f"{checkpoint} holds a {kind} language model: serve one at a time (ensembles are of "
                          "translation models)")
    from attnkit.serve.lm_app import create_lm_app, refuse_batching

    refuse_batching(app_kw, f"{checkpoint} holds a {kind} language model")
    if quantize not in (None, "none"):
        raise ConfigError(f"--quantize {quantize} is for translation models; {checkpoint} holds a {kind} "
                          "language model")
    if target_tag:
        raise ConfigError(f"--target-tag is for multilingual translation models; {checkpoint} holds a {kind} "
                          "language model")
    return create_lm_app(*load_lm_checkpoint(checkpoint, resolve_device(device)), **app_kw)


__all__ = ["ApiError", "create_app", "serve"]
