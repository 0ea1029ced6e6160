"""The HTTP service end to end: a real uvicorn server on loopback, concurrent clients, one-line errors."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from attnkit.data.glossary import Glossary  # noqa: E402
from attnkit.serve import create_app  # noqa: E402
from serving import BOOM, FaultyTranslator, free_port, running  # noqa: E402


@pytest.fixture(scope="module")
def translator(trained) -> FaultyTranslator:
    """The tiny run of conftest's `trained` (prepare -> train six steps through the CLI), on the CPU."""
    translator = FaultyTranslator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")
    translator.checkpoint_path = trained[1] / "checkpoints" / "last.safetensors"
    return translator


@pytest.fixture(scope="module")
def url(translator) -> str:
    """A uvicorn server in a background thread on 127.0.0.1; stopped when the module's tests are done."""
    app = create_app(translator, max_batch_sentences=16, max_request_sentences=8, max_chars=60, batch_wait_ms=20)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def sources(corpus_files) -> list[str]:
    return Path(corpus_files["test"][0]).read_text(encoding="utf-8").splitlines()


def post(url: str, body=None, **kw) -> httpx.Response:
    return httpx.post(f"{url}/translate", json=body, timeout=30, **kw)


def test_health_and_openapi(url):
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "model": "transformer", "device": "cpu", "quantize": "none", "kernels": "",
                             "queue": 0}
    spec = httpx.get(f"{url}/openapi.json", timeout=10).json()
    assert "/translate" in spec["paths"] and spec["info"]["title"] == "attnkit"


def test_concurrent_requests_are_batched_without_mixing_answers(url, translator, sources):
    requests = [sources[i: i + 1 + i % 3] for i in range(16)]  # 1 to 3 sentences each, overlapping
    expected = [translator.translate(texts) for texts in requests]  # before the server runs: one user of torch
    translator.calls = []

    def ask(texts: list[str]) -> dict:
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{url}/translate", json={"texts": texts})
            assert r.status_code == 200, r.text
            return r.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, requests))
    for texts, want, got in zip(requests, expected, answers, strict=True):
        assert len(got["translations"]) == len(texts)
        for w, g in zip(want, got["translations"], strict=True):
            assert g["text"] == w.text and abs(g["score"] - w.score) < 1e-4
            assert g["alignment"] is None and g["nbest"] == []
    sentences = sum(len(t) for t in requests)
    assert sum(translator.calls) == sentences and len(translator.calls) < len(requests), translator.calls
    assert max(translator.calls) <= 16  # max_batch_sentences


def test_single_text_beam_nbest_alignment_and_sampling(url, translator, sources):
    r = post(url, {"text": sources[0], "beam": 3, "nbest": 2, "alignment": True})
    assert r.status_code == 200, r.text
    (t,) = r.json()["translations"]
    assert len(t["nbest"]) == 1 and t["norm_score"] >= t["nbest"][0]["norm_score"]
    assert t["text"] != t["nbest"][0]["text"]
    assert t["alignment"] and all(isinstance(a, int) for a in t["alignment"])
    # sampled requests are never merged with others, so a seed reproduces the direct call
    body = {"texts": sources[:3], "sampling": True, "temperature": 1.5, "top_k": 5, "seed": 7}
    got = [t["text"] for t in post(url, body).json()["translations"]]
    assert got == [t.text for t in translator.translate(sources[:3], sampling=True, temperature=1.5, top_k=5, seed=7)]


@pytest.mark.parametrize("body, status, words", [
    (b'{"text": "eins"', 400, "malformed JSON"),
    ({"text": 3}, 422, "'text'"),
    ({"texts": ["eins", 2]}, 422, "'texts.1'"),
    ({"text": "eins", "texts": ["zwei"]}, 422, "exactly one"),
    ({}, 422, "exactly one"),
    ({"texts": []}, 422, "'texts'"),
    ({"text": "eins", "beem": 3}, 422, "unknown field 'beem'"),
    ({"texts": ["eins"] * 9}, 413, "limit is 8"),
    ({"text": "x" * 61}, 413, "61 characters"),
    ({"text": "eins", "beam": 2, "nbest": 3}, 422, "nbest 3 needs beam of at least 3"),
    ({"text": "eins", "sampling": True, "top_p": 0}, 422, "top_p"),
    (b'{"text": "eins", "len_penalty": NaN}', 422, "'len_penalty'"),
    ({"text": BOOM}, 500, "simulated failure"),
    ({"text": "eins", "glossary": [["eins"]]}, 422, "'glossary.0': give [source term, target term]"),
    ({"text": "eins", "glossary": [["eins", "one"], ["zwei", 2]]}, 422, "'glossary.1.1'"),
    ({"text": "eins", "glossary": [["eins", "x" * 61]]}, 422, "'glossary.0': a term of 61 characters"),
    ({"text": "eins", "glossary": [["eins", " "]]}, 422, "glossary[0]: an empty target term"),
    ({"text": "eins", "glossary": [["eins", "one"]], "sampling": True}, 422, "not with sampling"),
    ({"text": "eins", "glossary": [["a", "b"]] * 1001}, 422, "'glossary'"),
])
def test_bad_requests_get_one_line_json_errors(url, body, status, words):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {}
    r = post(url, None if kw else body, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error and "\n" not in error, error


def test_glossary_requests_answer_as_the_translator_does(url, translator, sources):
    glossary = [[sources[0], "seventy-one"], [sources[1], "ninety nine"]]
    r = post(url, {"texts": sources[:3], "beam": 3, "glossary": glossary})
    assert r.status_code == 200, r.text
    got = r.json()["translations"]
    direct = translator.translate(sources[:3], beam=3, glossary=Glossary.from_pairs(glossary))
    assert [t["text"] for t in got] == [t.text for t in direct]
    assert "seventy-one" in got[0]["text"] and got[0]["terms"][0] == {
        "source": sources[0], "target": "seventy-one", "placed": True, "note": ""}
    assert post(url, {"text": sources[0]}).json()["translations"][0]["terms"] is None  # no glossary: no field
    r = httpx.post(f"{url}/explore", json={"text": sources[0], "glossary": glossary[:1]}, timeout=30)
    assert r.json()["items"][0]["hypotheses"][0]["terms"][0]["placed"] is True
    r = httpx.post(f"{url}/translate/document", json={"text": f"{sources[1]}. {sources[2]}", "glossary": glossary},
                   timeout=30)
    assert "ninety nine" in r.json()["translation"]


def test_service_survives_bad_requests(url, sources):
    for body in ({"text": BOOM}, {"texts": [1]}, {"text": "eins", "nbest": 5}):
        assert post(url, body).status_code >= 400
    as_json, as_text = {"content-type": "application/json"}, {"content-type": "text/plain"}
    for content, headers, status in [(b"\xff{", as_json, 400), (b'{"text": "eins"}', as_text, 415),
                                     (b"[1]", as_json, 422)]:
        r = httpx.post(f"{url}/translate", content=content, headers=headers, timeout=10)
        assert r.status_code == status and "error" in r.json(), r.text
    assert httpx.get(f"{url}/nowhere", timeout=10).json() == {"error": "Not Found"}
    assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"
    r = post(url, {"texts": sources[:2]})
    assert r.status_code == 200 and len(r.json()["translations"]) == 2


def test_the_serve_verb_starts_a_server_that_answers(translator):
    import subprocess
    import sys

    port = free_port()
    ckpt = str(translator.checkpoint_path)
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", ckpt, "--port", str(port),
                             "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
        assert health.status_code == 200 and health.json()["model"] == "transformer"
        out = post(f"http://127.0.0.1:{port}", {"text": "eins zwei"})
        assert out.status_code == 200 and isinstance(out.json()["translations"][0]["text"], str)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
