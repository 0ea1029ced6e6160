"""LibreTranslate's API beside attnkit's own, driven as its users drive it: the `libretranslatepy` client from PyPI
against a real server (forms), and JSON bodies as LibreTranslate's web page sends them. Every answer equals what
attnkit's own /translate gives for the same lines."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from attnkit.serve import create_app  # noqa: E402
from attnkit.serve.libretranslate import split_text  # noqa: E402
from serving import FaultyTranslator, running  # noqa: E402

libretranslatepy = pytest.importorskip("libretranslatepy")


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> FaultyTranslator:
    return FaultyTranslator.from_checkpoint(trained_checkpoint, "cpu")


@pytest.fixture(scope="module")
def url(translator) -> str:
    app = create_app(translator, max_request_sentences=8, max_chars=60, max_beam=4,
                     languages={"src": "de", "tgt": "en"})
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def sources(corpus_files) -> list[str]:
    return Path(corpus_files["test"][0]).read_text(encoding="utf-8").splitlines()[:4]


def own(url: str, texts: list[str], **options) -> list[dict]:
    """What attnkit's own /translate answers for `texts`."""
    response = httpx.post(f"{url}/translate", json={"texts": texts, **options}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["translations"]


def libre(url: str, **fields) -> httpx.Response:
    return httpx.post(f"{url}/libretranslate/translate", json=fields, timeout=30)


def test_the_libretranslatepy_client_works_unchanged(url, sources):
    client = libretranslatepy.LibreTranslateAPI(f"{url}/libretranslate/")
    expected = [t["text"] for t in own(url, sources)]
    assert [client.translate(s, "de", "en") for s in sources] == expected
    assert client.translate(sources[0], "auto", "en") == expected[0]
    assert client.languages() == [{"code": "de", "name": "German", "targets": ["en"]}]


def test_json_lists_lines_and_alternatives(url, sources):
    expected = [t["text"] for t in own(url, sources[:2])]
    got = libre(url, q=sources[:2], source="de", target="en").json()
    assert got == {"translatedText": expected}
    text = f"  {sources[0]}\n\n{sources[1]} \n"  # lines translated one at a time, breaks and outer spaces kept
    got = libre(url, q=text, source="de", target="en").json()["translatedText"]
    assert got == f"  {expected[0]}\n\n{expected[1]} \n"
    paragraph = f"{sources[0]}. {sources[1]}!"  # a sentence at a time
    expected = [t["text"] for t in own(url, [f"{sources[0]}.", f"{sources[1]}!"])]
    got = libre(url, q=paragraph, source="de", target="en").json()["translatedText"]
    assert got == f"{expected[0]} {expected[1]}"
    best = own(url, sources[:1], beam=3, nbest=3)[0]  # N alternatives: a beam of N + 1
    got = libre(url, q=sources[0], source="de", target="en", alternatives=2).json()
    assert got == {"translatedText": best["text"], "alternatives": [n["text"] for n in best["nbest"]]}


def test_html_keeps_the_markup_and_translates_the_text_nodes(url, sources):
    expected = [t["text"] for t in own(url, sources[:2])]
    page = (f'<p class="x">{sources[0]}</p><!-- {sources[1]} --><script>var a = "{sources[1]}";</script>'
            f"<b>{sources[1]}</b>")
    got = libre(url, q=page, source="de", target="en", format="html").json()["translatedText"]
    assert got == (f'<p class="x">{expected[0]}</p><!-- {sources[1]} --><script>var a = "{sources[1]}";</script>'
                   f"<b>{expected[1]}</b>")
    # entities are read before translating: "&amp;" is the text "&", as attnkit's own route sees it
    amp = sources[0].replace(" ", " &amp; ", 1)
    want = html.escape(own(url, [sources[0].replace(" ", " & ", 1)])[0]["text"], quote=False)
    assert libre(url, q=amp, source="de", target="en", format="html").json()["translatedText"] == want


@pytest.mark.parametrize("fields, status, words", [
    (dict(source="de", target="en"), 400, "missing q parameter"),
    (dict(q="eins", target="en"), 400, "missing source parameter"),
    (dict(q="eins", source="fr", target="en"), 400, "fr is not supported: this model translates from de"),
    (dict(q="eins", source="de", target="fr"), 400, "fr is not supported: this model translates into en"),
    (dict(q="eins", source="de", target="en", format="pdf"), 400, "format must be text or html"),
    (dict(q="eins", source="de", target="en", alternatives=9), 400, "over this server's limit of 3"),
    (dict(q=["eins"] * 9, source="de", target="en"), 413, "the limit is 8"),
    (dict(q="eins " * 20, source="de", target="en"), 413, "the limit is 60"),
    (dict(q=[1, 2], source="de", target="en"), 400, "q must be a text or a list of texts"),
], ids=str)
def test_bad_requests_get_librertranslates_one_line_errors(url, fields, status, words):
    response = libre(url, **fields)
    assert response.status_code == status and words in response.json()["error"], response.text
    assert "\n" not in response.json()["error"]


def test_other_bodies_are_refused_and_the_service_goes_on(url, sources):
    response = httpx.post(f"{url}/libretranslate/translate", content=b"q=%FF&source=de", timeout=30,
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 400 and "not a valid form" in response.json()["error"]
    response = httpx.post(f"{url}/libretranslate/translate", content=b"<q/>", timeout=30,
                          headers={"content-type": "application/xml"})
    assert response.status_code == 415
    assert libre(url, q=sources[0], source="de", target="en").status_code == 200


@pytest.mark.parametrize("text, markup, pieces", [
    ("a b\n c ", False, [("", False), ("a b", True), ("", False), ("\n", False), (" ", False), ("c", True),
                         (" ", False)]),
    ("<i>x</i> y", True, [("", False), ("<i>", False), ("", False), ("x", True), ("", False), ("</i>", False),
                          (" ", False), ("y", True), ("", False)]),
], ids=["text", "html"])
def test_split_text_joins_back_into_the_text(text, markup, pieces):
    got = split_text(text, markup)
    assert "".join(p for p, _ in got) == text
    assert [p for p in got if p[0]] == [p for p in pieces if p[0]]
