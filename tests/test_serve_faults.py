"""The service under hostile and careless clients: caps, isolation, backpressure, time limits, disconnects,
metrics, and a drain on SIGTERM. Each test runs a real uvicorn server on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from attnkit.decode.translator import Translator  # noqa: E402
from attnkit.runtime import resident_mb  # noqa: E402
from attnkit.serve import create_app  # noqa: E402
from serving import BOOM, FaultyTranslator, free_port, running  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(trained) -> Path:
    return trained[1] / "checkpoints" / "last.safetensors"


@pytest.fixture(scope="module")
def translator(checkpoint) -> FaultyTranslator:
    return FaultyTranslator.from_checkpoint(checkpoint, "cpu")


@pytest.fixture(scope="module")
def sources(corpus_files) -> list[str]:
    return Path(corpus_files["test"][0]).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def url(translator):
    with running(create_app(translator, max_batch_sentences=16, batch_wait_ms=20, max_beam=8,
                            max_output_tokens=32, max_top_k=50)) as base:
        yield base


def post(url: str, body, **kw) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{url}/translate", content=body, headers={"content-type": "application/json"},
                          timeout=60, **kw)
    return httpx.post(f"{url}/translate", json=body, timeout=60, **kw)


@pytest.mark.parametrize("body, field", [
    ({"text": "a", "beam": 100000}, "'beam': 100000 is over this server's limit of 8"),
    ({"text": "a", "beam": 100000, "nbest": 100000}, "'beam'"),
    ({"text": "a", "sampling": True, "nbest": 9}, "'nbest'"),
    ({"text": "a", "max_len": 10**9}, "'max_len'"),
    ({"text": "a", "sampling": True, "top_k": 10**9}, "'top_k'"),
    ({"text": "a", "seed": 2**70}, "'seed'"),
    ({"text": "a", "len_penalty": 1e300}, "'len_penalty'"),
    ({"text": "a", "sampling": True, "temperature": 1e6}, "'temperature'"),
])
def test_options_over_a_cap_are_refused_with_422_and_memory_stays_flat(url, body, field):
    before = resident_mb()
    r = post(url, body)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"] and "\n" not in r.json()["error"]
    if before is not None:
        assert resident_mb() - before < 100
    assert post(url, {"text": "eins"}).status_code == 200


def test_the_output_length_a_client_asks_for_is_kept(url, sources):
    long = max(sources, key=len)
    (t,) = post(url, {"text": long, "max_len": 2}).json()["translations"]
    assert len(t["text"].split()) <= 2


BAD_INPUTS = [
    (b'{"text": "\\ud800"}', 422, "'text': not valid Unicode"),  # a lone surrogate: valid JSON, not Unicode
    (b'{"texts": ["eins", "zwei \\udfff drei"]}', 422, "'texts.1': not valid Unicode"),
    ({"text": BOOM}, 500, "simulated failure"),  # fails inside the batch: retried alone, fails alone
    ({"texts": ["eins", BOOM]}, 500, "simulated failure"),
    ({"text": "a", "beam": 10**6}, 422, "'beam'"),
]


def test_each_bad_input_fails_alone_while_good_requests_beside_it_are_answered(url, translator, sources):
    good = [sources[i: i + 1 + i % 2] for i in range(24)]
    expected = {tuple(texts): [t.text for t in translator.translate(texts)] for texts in good}
    work = [("good", texts) for texts in good] + [("bad", b) for b in BAD_INPUTS] * 3
    work = work[::2] + work[1::2]  # bad ones spread among the good

    def ask(item):
        kind, what = item
        if kind == "good":
            return kind, what, post(url, {"texts": what})
        return kind, what, post(url, what[0])

    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(ask, work))
    for kind, what, r in answers:
        if kind == "good":
            assert r.status_code == 200, r.text
            assert [t["text"] for t in r.json()["translations"]] == expected[tuple(what)]
        else:
            _, status, words = what
            assert r.status_code == status and words in r.json()["error"], r.text


def test_a_full_queue_answers_503_with_retry_after_then_recovers(translator, sources):
    slow = FaultyTranslator(translator.model, translator.src_tok, translator.tgt_tok, device="cpu")
    slow.delay = 0.3
    with running(create_app(slow, max_batch_sentences=1, batch_wait_ms=0, max_queue=2)) as base:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda s: post(base, {"text": s}), sources[:12]))
        codes = sorted(r.status_code for r in answers)
        assert 503 in codes and 200 in codes and set(codes) == {200, 503}, codes
        busy = next(r for r in answers if r.status_code == 503)
        assert int(busy.headers["retry-after"]) >= 1 and "busy" in busy.json()["error"]
        time.sleep(0.5)
        assert post(base, {"text": sources[0]}).status_code == 200
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert 'attnkit_rejected_total{reason="queue_full"}' in metrics


class StuckTranslator(Translator):
    """Waits for `go` before translating: a request that takes as long as the test wants."""

    go = threading.Event()

    def translate(self, sentences, options=None, **kw):
        assert self.go.wait(30)
        return super().translate(sentences, options, **kw)


def test_a_request_past_the_time_limit_gets_504_and_the_worker_goes_on(translator, sources):
    stuck = StuckTranslator(translator.model, translator.src_tok, translator.tgt_tok, device="cpu")
    with running(create_app(stuck, request_timeout_s=2)) as base:
        r = post(base, {"text": sources[0]})
        assert r.status_code == 504 and "within 2 s" in r.json()["error"]
        stuck.go.set()
        assert post(base, {"text": sources[0]}).status_code == 200


def test_clients_that_hang_up_mid_request_do_not_wedge_the_worker(url, sources):
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"texts": sources[:4], "beam": 4}).encode()
    for cut in (None, 10):  # after sending the whole request, and halfway through the body
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as s:
                head = (f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n").encode()
                s.sendall(head + (body if cut is None else body[:cut]))
    r = post(url, {"texts": sources[:2]})
    assert r.status_code == 200 and len(r.json()["translations"]) == 2


def test_metrics_serve_prometheus_text(url, sources):
    assert post(url, {"texts": sources[:3]}).status_code == 200
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ('attnkit_requests_total{route="/translate",status="200"}', "attnkit_request_seconds_bucket",
                 "attnkit_batch_sentences_bucket", "attnkit_queue_depth", "attnkit_sentences_translated_total"):
        assert name in text, name


def test_sigterm_answers_every_accepted_request_then_exits_0(checkpoint, translator, sources):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", str(checkpoint),
                             "--port", str(port), "--device", "cpu", "--batch-wait-ms", "50",
                             "--max-batch-sentences", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
        expected = {s: t.text for s, t in zip(sources, translator.translate(sources, beam=4), strict=True)}
        first_answer = threading.Event()

        def ask(s: str):
            try:
                r = httpx.post(f"{base}/translate", json={"text": s, "beam": 4}, timeout=60)
            except httpx.TransportError as e:  # refused after the signal: never accepted
                return s, e
            first_answer.set()
            return s, r

        with ThreadPoolExecutor(len(sources)) as pool:
            futures = [pool.submit(ask, s) for s in sources]
            assert first_answer.wait(60)
            os.kill(proc.pid, signal.SIGTERM)
            answers = [f.result() for f in futures]
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    answered = [(s, r) for s, r in answers if isinstance(r, httpx.Response)]
    assert len(answered) > 1
    for s, r in answered:
        assert r.status_code == 200 and r.json()["translations"][0]["text"] == expected[s], r.text
    for _, r in answers:  # the others were refused at the door: the server had stopped accepting
        if not isinstance(r, httpx.Response):
            assert isinstance(r, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError), repr(r)
