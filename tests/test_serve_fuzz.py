"""A schema-driven fuzz of the HTTP API: requests generated from the service's own OpenAPI schema
(schemathesis; valid ones and ones that break the schema) and from a hypothesis strategy of hostile
values (lone surrogates, control characters, huge numbers), 2,000 in all against a live server.

The property: no 5xx, and every error is one line of JSON, `{"error": "..."}`.
"""

from __future__ import annotations

import json

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnkit.decode.translator import Translator  # noqa: E402
from attnkit.serve import create_app  # noqa: E402
from serving import running  # noqa: E402


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def served(trained):
    translator = Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")
    app = create_app(translator, max_batch_sentences=16, batch_wait_ms=0, max_request_sentences=4, max_chars=40,
                     max_beam=4, max_output_tokens=12, max_top_k=20)
    operation = schemathesis.openapi.from_dict(app.openapi())["/translate"]["POST"]
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, operation


SENT: list[int] = []  # the status of every request sent, to count them


def send(client: httpx.Client, body) -> None:
    """POST `body` as JSON (escaped, so lone surrogates travel as JSON allows) and check the property."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/translate", content=content, headers={"content-type": "application/json"})
    SENT.append(r.status_code)
    assert r.status_code < 500, (body, r.text)
    answer = r.json()
    if r.status_code >= 400:
        assert list(answer) == ["error"] and isinstance(answer["error"], str), (body, r.text)
        assert "\n" not in answer["error"] and answer["error"], (body, r.text)
    else:
        assert isinstance(body, dict)
        asked = [body["text"]] if body.get("text") is not None else body["texts"]
        assert len(answer["translations"]) == len(asked)


@pytest.mark.parametrize("mode, examples", [("positive", 700), ("negative", 700)])
def test_requests_from_the_openapi_schema_never_get_a_5xx(served, mode, examples):
    client, operation = served
    strategy = operation.as_strategy(schemathesis.GenerationMode(mode))

    @fuzz(examples)
    @given(case=strategy)
    def check(case):
        send(client, case.body)

    before = len(SENT)
    check()
    assert len(SENT) - before >= 0.9 * examples  # the schema left room for that many distinct requests


HOSTILE_TEXT = st.text(st.characters(categories=["Cs", "Cc", "Cf", "Zs", "Zl", "Mn", "So", "Lo", "Ll", "Nd"]),
                       max_size=50)
HUGE = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.sampled_from([0, 1, -1, 2**63]))


@fuzz(600)
@given(texts=st.lists(HOSTILE_TEXT, min_size=1, max_size=5),
       options=st.dictionaries(st.sampled_from(["beam", "nbest", "max_len", "top_k", "top_p", "temperature",
                                                "seed", "len_penalty"]), HUGE, max_size=3),
       sampling=st.booleans(), alignment=st.booleans())
def test_hostile_values_never_get_a_5xx(served, texts, options, sampling, alignment):
    client, _ = served
    send(client, {"texts": texts, "sampling": sampling, "alignment": alignment, **options})

