"""The queue in front of the model, and the one worker that translates what it holds.

Why a queue. A Transformer translating one sentence spends most of its time in small matmuls that leave
the hardware idle; the same matmuls over a batch of sentences cost little more. So requests are not
translated where they arrive: each handler puts a job on an asyncio queue and awaits a future. One worker
task takes what is pending (waiting at most `batch_wait_ms` for more, up to `max_batch_sentences`
sentences), groups the jobs whose decoding options are identical, runs `Translator.translate` once per
group in a worker thread, and hands each job its slice of the results. Only that one worker touches the
model, one group at a time: torch modules are not meant to be driven from several threads at once, and one
batch at a time already uses every core.

Batching never changes an answer: the translator's output limits and masks are per sentence, so a sentence
comes out the same alone or among others. Sampling is the exception (one random generator is seeded per
call), so sampled jobs are never merged: each is what `translate(texts, seed=...)` gives.

Faults stay with the job that caused them. A group whose translation fails is translated again job by job,
so only the job that cannot be translated fails. The queue is bounded: past `max_queue` jobs, `submit`
raises `Busy` at once (the service answers 503 with Retry-After) instead of holding ever more requests in
memory; each job's memory is bounded by the translator's `memory_budget`.

The explorer's jobs (`views=True`: each hypothesis with its attention, `translation_views`) wait in the same
queue, count against the same cap and time limit, and are translated within the same budget: model work that
bypassed the queue would make the requests in it late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from attnkit.data.glossary import Glossary
from attnkit.decode.translator import DecodeOptions, Translator
from attnkit.serve.http import TIMEOUTS, Busy, ModelGate
from attnkit.viz.attention import translation_views

log = logging.getLogger("attnkit.serve")


@dataclass
class _Job:
    sentences: list[str]
    options: DecodeOptions
    need_attention: bool
    future: asyncio.Future = field(repr=False)
    views: bool = False  # the explorer's: each sentence's hypotheses with their attention, not Translations
    glossary: Glossary | None = None

    def group_key(self) -> tuple:
        # sampled jobs stay alone: one generator per translate() call, so company would change the draw
        return (self.options, self.need_attention, self.views, self.glossary,
                id(self) if self.options.sampling else None)


class Batcher:
    """The queue and its single worker; `submit` is what request handlers await."""

    def __init__(self, translator: Translator, *, max_batch_sentences: int, batch_wait_ms: float,
                 max_queue: int = 256, memory_budget: int | None = None,
                 on_batch: Callable[[int, float], None] | None = None):
        self.translator = translator
        self.max_batch_sentences = max_batch_sentences
        self.batch_wait = batch_wait_ms / 1000
        self.max_queue = max_queue
        self.memory_budget = memory_budget
        self.on_batch = on_batch
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: _Job | None = None  # taken from the queue but did not fit in the last batch
        self._worker: asyncio.Task | None = None
        self._running: list[_Job] = []  # the batch being translated
        self._seconds_per_sentence = 0.05  # running mean, for Retry-After
        self._queued_sentences = 0
        self.gate = ModelGate()  # the worker's calls hold it until their thread ends, even past a time-out

    @property
    def pending(self) -> int:
        return (self._queue.qsize() if self._queue else 0) + (self._held is not None)

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queue)
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

    async def submit(self, sentences: list[str], options: DecodeOptions, need_attention: bool,
                     timeout: float | None = None, *, views: bool = False, glossary: Glossary | None = None) -> list:
        """The translations of `sentences` (with `views`, each one's hypotheses with their attention, as
        `translation_views` gives them), using `glossary`'s terms; Busy if the queue is full, TimeoutError after
        `timeout` s."""
        if self._queue is None:
            raise RuntimeError("the translation worker is not running")
        job = _Job(sentences, options, need_attention, asyncio.get_running_loop().create_future(), views, glossary)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            waiting = self._queued_sentences + sum(len(j.sentences) for j in self._running)
            raise Busy(max(1, min(60, math.ceil(waiting * self._seconds_per_sentence)))) from None
        self._queued_sentences += len(sentences)
        try:
            return await asyncio.wait_for(job.future, timeout)  # on timeout the job is cancelled, not translated
        except TIMEOUTS:
            if not job.future.cancelled():  # the translation's own time-out: its words say more than ours
                raise
            raise TimeoutError(f"no answer within {timeout:g} s") from None

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
        jobs = await self._take()
        self._queued_sentences -= sum(len(job.sentences) for job in jobs)
        return jobs

    async def _take(self) -> list[_Job]:
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
                except TIMEOUTS:
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
            if not job.future.done():  # a client that gave up (timeout) is not translated for
                groups.setdefault(job.group_key(), []).append(job)
        for group in groups.values():
            try:
                results = await self._call(group)
            except Exception as e:
                if len(group) > 1:  # one job's input may be at fault: each job alone, so the others are answered
                    log.warning("a batch of %d jobs failed (%s: %s); translating them one by one",
                                len(group), type(e).__name__, e)
                    for job in group:
                        await self._translate_alone(job)
                else:
                    _fail(group[0], e)
                continue
            start = 0
            for job in group:
                if not job.future.done():
                    job.future.set_result(results[start:start + len(job.sentences)])
                start += len(job.sentences)

    async def _translate_alone(self, job: _Job) -> None:
        if job.future.done():
            return
        try:
            results = await self._call([job])
        except Exception as e:
            _fail(job, e)
        else:
            if not job.future.done():
                job.future.set_result(results)

    async def _call(self, group: list[_Job]) -> list:
        """Translate the sentences of `group` in a worker thread (the event loop stays free): one result per
        sentence, a Translation or (the explorer's jobs) its hypotheses' attention views."""
        head, sentences = group[0], [s for job in group for s in job.sentences]
        start = time.perf_counter()
        if head.views:
            results = await self.gate.run(translation_views, self.translator, sentences, head.options,
                                          memory_budget=self.memory_budget, glossary=head.glossary)
        else:
            results = await self.gate.run(self.translator.translate, sentences, head.options,
                                          batch_size=self.max_batch_sentences, need_attention=head.need_attention,
                                          memory_budget=self.memory_budget, glossary=head.glossary)
        seconds = time.perf_counter() - start
        self._seconds_per_sentence = 0.8 * self._seconds_per_sentence + 0.2 * seconds / len(sentences)
        if self.on_batch is not None:
            self.on_batch(len(sentences), seconds)
        return results


def _fail(job: _Job, error: Exception) -> None:
    if not job.future.done():
        log.error("translation failed for a job of %d sentences: %s: %s", len(job.sentences),
                  type(error).__name__, error)
        job.future.set_exception(error)


__all__ = ["Batcher", "Busy"]
