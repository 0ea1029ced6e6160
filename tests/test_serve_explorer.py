"""The service's explorer side: the page at `/`, POST /explore for translation and language models, and POST /generate
streaming a Transformer-XL's tokens as server-sent events, equal to `attnkit lm generate` with the same seed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from attnkit.checkpoint import load_lm_checkpoint  # noqa: E402
from attnkit.cli.main import main  # noqa: E402
from attnkit.decode import DecodeOptions, Translator  # noqa: E402
from attnkit.serve import create_app  # noqa: E402
from attnkit.serve.lm_app import create_lm_app  # noqa: E402
from attnkit.viz.attention import load_views, translation_views  # noqa: E402
from serving import events, running  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "BEN: the "


@pytest.fixture(scope="module")
def lm_url(family_checkpoints):
    with running(create_lm_app(*load_lm_checkpoint(family_checkpoints["transformer-xl"]), max_output_tokens=64)) as url:
        yield url


@pytest.fixture(scope="module")
def mt_url(family_checkpoints):
    translator = Translator.from_checkpoint(family_checkpoints["transformer"], device="cpu")
    with running(create_app(translator, max_beam=4)) as url:
        yield url


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (7, 0.7)])
def test_streamed_tokens_are_lm_generate_with_the_same_seed(lm_url, family_checkpoints, capsys, seed, temperature):
    body = {"prompt": PROMPT, "length": 40, "temperature": temperature, "seed": seed}
    with httpx.stream("POST", lm_url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = events(r)
    tokens = [d["text"] for name, d in got if name == "token"]
    assert len(tokens) == 40 and got[-1][0] == "done" and "".join(tokens) == got[-1][1]["text"]
    assert main(["lm", "generate", "--checkpoint", str(family_checkpoints["transformer-xl"]), "--prompt", PROMPT,
                 "--length", "40", "--temperature", str(temperature), "--seed", str(seed), "--device", "cpu"]) == 0
    assert PROMPT + "".join(tokens) + "\n" == capsys.readouterr().out


def test_tokens_arrive_one_event_each_before_the_end(lm_url):
    """Each token is its own event, sent as it is drawn (not the whole text at the end)."""
    with httpx.stream("POST", lm_url + "/generate", json={"prompt": PROMPT, "length": 5}, timeout=60) as r:
        names = [name for name, _ in events(r)]
    assert names == ["token"] * 5 + ["done"]


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": "x" * 1001}, 413, "field 'prompt' has 1001 characters"),
    ({"prompt": "a", "length": 65}, 422, "field 'length': 65 is over this server's limit of 64"),
    ({"prompt": "a", "temperature": -1}, 422, "temperature"),
    ({"prompt": "a", "beam": 2}, 422, "unknown field 'beam'"),
])
def test_bad_generate_requests_are_one_line_json_errors(lm_url, body, status, words):
    r = httpx.post(lm_url + "/generate", json=body, timeout=30)
    assert r.status_code == status and words in r.json()["error"] and "\n" not in r.json()["error"]


def test_lm_explore_is_the_models_self_attention_over_memory_and_segment(lm_url, family_checkpoints):
    r = httpx.post(lm_url + "/explore", json={"text": "ANNA: the cat is here."}, timeout=60)
    assert r.status_code == 200
    (view,) = load_views(family_checkpoints["transformer-xl"], ["ANNA: the cat is here."])
    kinds = r.json()["items"][0]["hypotheses"][0]["kinds"]
    assert kinds["self"]["boundary"] == view.boundary["self"] and kinds["self"]["keys"] == view.keys["self"]
    np.testing.assert_allclose(np.asarray(kinds["self"]["layers"]), np.stack(view.maps["self"]), atol=1e-4)
    for asked in ({"beam": 2}, {"glossary": [["a", "b"]]}):
        r = httpx.post(lm_url + "/explore", json={"text": "a", **asked}, timeout=30)
        assert r.status_code == 422 and f"field '{next(iter(asked))}'" in r.json()["error"]
        assert "beam, nbest and glossary are for translation" in r.json()["error"]


def test_translation_explore_returns_each_hypothesis_with_its_attention(mt_url, family_checkpoints):
    r = httpx.post(mt_url + "/explore", json={"text": "dreihundertvierundfünfzig", "beam": 3, "nbest": 2}, timeout=60)
    assert r.status_code == 200
    translator = Translator.from_checkpoint(family_checkpoints["transformer"], device="cpu")
    (hyps,) = translation_views(translator, ["dreihundertvierundfünfzig"], DecodeOptions(beam=3, nbest=2))
    got = r.json()["items"][0]["hypotheses"]
    assert [h["text"] for h in got] == [v.output for v in hyps]
    for h, v in zip(got, hyps):
        assert h["score"] == pytest.approx(v.score)
        for kind in ("encoder", "decoder", "cross"):
            np.testing.assert_allclose(np.asarray(h["kinds"][kind]["layers"]), np.stack(v.maps[kind]), atol=1e-4)
    for body, words in (({"text": "eins", "beam": 5}, "over this server's limit of 4"),
                        ({"text": "eins", "beam": 2, "nbest": 3}, "need a beam of at least 3")):
        r = httpx.post(mt_url + "/explore", json=body, timeout=30)
        assert r.status_code == 422 and words in r.json()["error"]


@pytest.mark.parametrize("which", ["mt_url", "lm_url"])
def test_the_page_at_root_is_the_live_explorer(request, which):
    r = httpx.get(request.getfixturevalue(which) + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="explorer-live"' in r.text and 'id="explorer-data"' not in r.text
    live = json.loads(r.text.split('id="explorer-live">', 1)[1].split("</script>", 1)[0])
    assert live["task"] == ("lm" if which == "lm_url" else "translation")
    health = httpx.get(request.getfixturevalue(which) + "/health", timeout=30).json()
    assert health["model"] == ("transformer-xl" if which == "lm_url" else "transformer")
