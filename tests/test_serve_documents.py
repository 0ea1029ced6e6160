"""`POST /translate/document` on a real server: the answer is `translate_document`'s, the stream gives every sentence
in order and then the same whole translation, and what is over a cap is refused before anything is queued."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from attnkit.decode import DecodeOptions, translate_document  # noqa: E402
from attnkit.serve import create_app  # noqa: E402
from serving import FaultyTranslator, events, running  # noqa: E402

TEXT = "zweitausendvierundzwanzig. achthundertzweiundfünfzig!\n\n  fünfhundertelf \nelf. zwölf."
SENTENCES = ["zweitausendvierundzwanzig.", "achthundertzweiundfünfzig!", "fünfhundertelf", "elf.", "zwölf."]


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> FaultyTranslator:
    return FaultyTranslator.from_checkpoint(trained_checkpoint, "cpu")


@pytest.fixture(scope="module")
def url(translator) -> str:
    app = create_app(translator, max_request_sentences=6, max_chars=60, languages={"src": "de", "tgt": "en"})
    with running(app) as base:
        yield base


def test_the_answer_is_the_documents_translation(url, translator):
    expected = translate_document(translator, TEXT, DecodeOptions(beam=2, max_len=256), lang="de")
    response = httpx.post(f"{url}/translate/document", json={"text": TEXT, "beam": 2}, timeout=60)
    assert response.status_code == 200 and response.json() == {"translation": expected}


def test_the_stream_sends_each_sentence_in_order_then_the_whole(url, translator):
    expected = translate_document(translator, TEXT, DecodeOptions(max_len=256), lang="de")
    alone = [t.text for t in translator.translate(SENTENCES, DecodeOptions(max_len=256))]
    with httpx.stream("POST", f"{url}/translate/document", json={"text": TEXT, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = events(r)
    assert got == [*(("sentence", {"index": i, "source": s, "text": t}) for i, (s, t) in
                     enumerate(zip(SENTENCES, alone))), ("done", {"translation": expected})]


@pytest.mark.parametrize("body, status, words", [
    ({"text": "eins. " * 7}, 413, "field 'text' holds 7 sentences; the limit is 6"),
    ({"text": "eins " * 20}, 413, "field 'text' has 99 characters; the limit is 60"),
    ({"text": "eins", "beam": 99}, 422, "field 'beam': 99 is over this server's limit of 16"),
    ({"texts": ["eins"]}, 422, "field 'text': Field required"),
], ids=str)
def test_what_is_over_a_cap_is_refused_in_one_line(url, translator, body, status, words):
    before = len(translator.calls)
    response = httpx.post(f"{url}/translate/document", json=body, timeout=60)
    assert response.status_code == status and words in response.json()["error"], response.text
    assert len(translator.calls) == before  # nothing was queued


def test_an_empty_document_stays_empty(url):
    response = httpx.post(f"{url}/translate/document", json={"text": " \n\n"}, timeout=60)
    assert response.json() == {"translation": " \n\n"}


def test_streams_and_libretranslate_requests_at_once_do_not_mix(url, translator):
    """Four clients at once on the two routes: each gets what it gets alone."""
    texts = [TEXT, "elf. zwölf.", "fünfhundertelf", TEXT.replace("elf", "zwölf")]

    def stream(text: str) -> str:
        with httpx.stream("POST", f"{url}/translate/document", json={"text": text, "stream": True}, timeout=60) as r:
            return events(r)[-1][1]["translation"]

    def libre(text: str) -> str:
        body = {"q": text, "source": "de", "target": "en"}
        return httpx.post(f"{url}/libretranslate/translate", json=body, timeout=60).json()["translatedText"]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda job: job[0](job[1]), [(stream, texts[0]), (libre, texts[1]), (stream, texts[2]),
                                                         (libre, texts[3])]))
    alone = [translate_document(translator, t, DecodeOptions(max_len=256), lang="de") for t in texts]
    assert got == alone
