"""Helpers for the service's tests: a real uvicorn server on loopback, in a thread of the test process, a
translator that fails on demand, and a reader of server-sent events."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from attnkit.decode.translator import Translator

BOOM = "kaputt"  # the test translator fails on any batch that holds this sentence


class FaultyTranslator(Translator):
    """Records the size of every translate() call (to see requests batched), waits `delay` seconds per call
    (to fill the queue), and fails every batch that holds BOOM."""

    delay = 0.0

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls: list[int] = []

    def translate(self, sentences, options=None, **kw):
        self.calls.append(len(sentences))
        time.sleep(self.delay)
        if BOOM in sentences:
            raise RuntimeError("simulated failure")
        return super().translate(sentences, options, **kw)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 while the block runs; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(300):
        if server.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start within 15 s"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive()


def events(response) -> list[tuple[str, dict]]:
    """The server-sent events of an httpx streaming response as they arrive: (name, data)."""
    out, name, data = [], "message", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            out.append((name, json.loads(data)))
            name, data = "message", ""
    return out
