"""The explorer page embeds its data so that no text in it can change the page's structure: sources, outputs and
tokens that look like HTML, comments, scripts, CDATA ends, line separators, emoji and lone surrogates come back
exactly, and the page around them is the same as for harmless text. (A real browser reads such a page in
test_browser_hostile.py.)"""

from __future__ import annotations

import json
import re

import numpy as np

from attnkit.viz.attention import AttentionView
from attnkit.viz.explorer import explorer_data, explorer_page, write_explorer

HOSTILE = ["<!--<script>", "</script><script>window.hacked = 1</script>", "<!--<script x", "]]>", "--> <!-- -->",
           "line\u2028para\u2029end", "\"double\" 'single' `back`", "&amp; &lt;b&gt;", "emoji \U0001f600 ünï",
           "lone \ud800 surrogate \udfff", "</SCRIPT >", "<![CDATA[x]]>"]
HARMLESS = [f"text {i}" for i in range(len(HOSTILE))]


def view(text: str) -> AttentionView:
    tokens = [text, "</s>"]
    weights = np.full((2, 2, 2), 0.5)  # (H, Tq, Tk)
    return AttentionView(source=text, output=text, maps={"cross": [weights]}, queries={"cross": tokens},
                         keys={"cross": tokens})


def page_of(texts: list[str]) -> tuple[str, dict]:
    data = explorer_data([[view(t)] for t in texts], title="t", model="m", task="translation")
    return explorer_page("t", data), data


def embedded(page: str) -> str:
    """The text of the data element: from its start tag to the first "</script" after it."""
    start = page.index('<script type="application/json" id="explorer-data">') + \
        len('<script type="application/json" id="explorer-data">')
    return page[start:page.index("</script", start)]


def test_hostile_text_round_trips_and_cannot_reach_the_markup():
    page, data = page_of(HOSTILE)
    text = embedded(page)
    assert json.loads(text) == data  # everything, the lone surrogates included, comes back as it was
    assert not re.search("[<>&\u2028\u2029\ud800-\udfff]", text)  # no character the HTML parser acts on
    page.encode("utf-8")  # a lone surrogate has no UTF-8: it must not reach the page raw
    harmless_page, _ = page_of(HARMLESS)
    assert page.replace(text, "") == harmless_page.replace(embedded(harmless_page), "")  # the same structure
    assert page.count("<script") == harmless_page.count("<script") == 2


def test_the_written_page_holds_hostile_text(tmp_path):
    data = write_explorer([[view(t)] for t in HOSTILE], tmp_path / "e.html", title="t", model="m",
                          task="translation")
    page = (tmp_path / "e.html").read_text(encoding="utf-8")
    assert json.loads(embedded(page)) == data
    assert [item["source"] for item in data["items"]] == HOSTILE


def test_live_settings_are_embedded_the_same_way():
    live = {"task": "translation", "note": "</script><!--<script>"}
    page = explorer_page("t", live=live)
    start = page.index('id="explorer-live">') + len('id="explorer-live">')
    text = page[start:page.index("</script", start)]
    assert json.loads(text) == live and "<" not in text
