"""Prometheus metrics for operators: requests by route and status, latency, requests refused and queue depth for
every service; batch sizes for translation; streams, their length in time and tokens for a language model.

Each app has its own registry (never prometheus_client's global one), so several apps in one process,
as in the tests, count apart. `GET /metrics` serves it in Prometheus' text format.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: N811
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServiceMetrics:
    """What every service counts. `attnkit_request_seconds` runs to the response's start: for a stream, the time
    it waited for the model (its whole length is the language model's `attnkit_stream_seconds`)."""

    def __init__(self, queue_depth: Callable[[], float]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("attnkit_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.latency = Histogram("attnkit_request_seconds", "time from request to answer", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("attnkit_rejected", "requests refused before the model saw them", ["reason"],
                                registry=r)
        self.queue = Gauge("attnkit_queue_depth", "requests waiting for the model", registry=r)
        self.queue.set_function(queue_depth)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class TranslationMetrics(ServiceMetrics):
    """The translation service's: what each batch held and took."""

    def __init__(self, queue_depth: Callable[[], float]):
        super().__init__(queue_depth)
        r = self.registry
        self.batch_sentences = Histogram("attnkit_batch_sentences", "sentences per translate() call",
                                         buckets=SIZE_BUCKETS, registry=r)
        self.batch_seconds = Histogram("attnkit_batch_seconds", "time per translate() call",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.sentences = Counter("attnkit_sentences_translated", "sentences translated", registry=r)

    def observe_batch(self, sentences: int, seconds: float) -> None:
        self.batch_sentences.observe(sentences)
        self.batch_seconds.observe(seconds)
        self.sentences.inc(sentences)


class LMMetrics(ServiceMetrics):
    """The language-model service's: how each /generate stream ended, how long it ran, the tokens it sent."""

    ENDS = ("done", "time_limit", "client_gone", "error")

    def __init__(self, queue_depth: Callable[[], float]):
        super().__init__(queue_depth)
        r = self.registry
        self.streams = Counter("attnkit_streams", "/generate streams by how they ended", ["end"], registry=r)
        self.stream_seconds = Histogram("attnkit_stream_seconds", "time from a /generate request to its last event",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("attnkit_tokens_generated", "tokens sent by /generate streams", registry=r)
        for end in self.ENDS:  # every series from the start, at 0, so a rate() sees the first one
            self.streams.labels(end)

    def observe_stream(self, end: str, seconds: float, tokens: int) -> None:
        self.streams.labels(end).inc()
        self.stream_seconds.observe(seconds)
        self.tokens.inc(tokens)


__all__ = ["CONTENT_TYPE", "LMMetrics", "ServiceMetrics", "TranslationMetrics"]
