"""Headless Chromium reads the explorer page that `attnkit plot attention --html` writes for a sentence that looks
like markup (comments, scripts, CDATA ends, entities) or hold line separators and emoji: the page renders, shows each
text as written, and runs no script but its own.

Skipped, with what is missing, where Chromium, chromedriver or selenium cannot be had (as test_browser.py)."""

from __future__ import annotations

import json

import pytest

from attnkit.cli.main import main
from browser import Explorer, chromium, missing

if missing():
    pytest.skip(f"no browser for the explorer tests: missing {missing()}", allow_module_level=True)

# each its own page: a later "-->" in the same page would end the comment an earlier "<!--" opened; lone
# surrogates cannot be in a UTF-8 file (test_explorer_hostile.py embeds them)
HOSTILE = ["<!--<script>window.hacked = 1</script>", "<!--<script x", "</script><script>window.hacked = 2</script>",
           "]]> --> <!-- <![CDATA[", "line\u2028para\u2029end", "\"double\" 'single' &amp; &lt;b&gt;",
           "dreihundert \U0001f600 ünï </SCRIPT >"]


class OfflinePage(Explorer):
    """The written page opened from its file (no server)."""

    def __init__(self, driver, path):
        self.driver = driver
        driver.get(path.as_uri())
        self.wait(lambda d: d.execute_script("return document.body.dataset.state") == "ready", timeout=20)


@pytest.fixture(scope="module")
def driver():
    d = chromium()
    yield d
    d.quit()


@pytest.mark.parametrize("sentence", HOSTILE)
def test_a_page_of_a_hostile_sentence_renders_and_shows_it(driver, family_checkpoints, tmp_path, sentence):
    out = tmp_path / "hostile.html"
    assert main(["plot", "attention", "--checkpoint", str(family_checkpoints["transformer"]), "--src", sentence,
                 "--html", "--out", str(out), "--device", "cpu"]) == 0
    text = out.read_text(encoding="utf-8")
    start = text.index('id="explorer-data">') + len('id="explorer-data">')
    hyp = json.loads(text[start:text.index("</script>", start)])["items"][0]["hypotheses"][0]

    page = OfflinePage(driver, out)
    assert page.js("return document.querySelectorAll('script').length") == 2  # the data and the page's own code
    assert page.js("return window.hacked === undefined")
    assert page.el("source").get_attribute("textContent") == sentence
    assert page.el("output").get_attribute("textContent") == hyp["text"]
    page.select("kind", "cross")
    assert [t for t, _ in page.tokens("right")] == hyp["kinds"]["cross"]["keys"]
    assert [t for t, _ in page.tokens("left")] == hyp["kinds"]["cross"]["queries"]
    assert page.js("return document.body.dataset.state") == "ready"
