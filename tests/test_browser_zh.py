"""The attention explorer shows Chinese: headless Chromium types a Chinese sentence into the page served by
`attnkit serve` of a model trained on Chinese numerals, and the page shows the sentence and its tokens, each
character drawn with its own glyph (without a CJK font every one is the same empty box).

Skipped, with what is missing, where Chromium, chromedriver or selenium (as test_browser.py) or a CJK font cannot be
had (`.ci/run` installs fonts-wqy-microhei)."""

from __future__ import annotations

import pytest

from attnkit.data import prepare, write_number_corpus
from attnkit.decode import DecodeOptions, Translator
from attnkit.train.trainer import Trainer
from attnkit.viz.attention import translation_views
from attnkit.viz.fonts import has_cjk
from browser import Explorer, chromium, missing, served
from conftest import tiny_run_config
from test_fonts import installed_cjk_fonts

if missing():
    pytest.skip(f"no browser for the explorer tests: missing {missing()}", allow_module_level=True)
if not installed_cjk_fonts():
    pytest.skip("no CJK font installed (Debian: apt-get install fonts-wqy-microhei or fonts-noto-cjk)",
                allow_module_level=True)

SENTENCE = "七万零一十七"
NO_GLYPH = "\ue000"  # a private-use character: no font draws it, so it shows what a missing glyph looks like

# Each character drawn alone on a canvas in the font an element uses (Chromium falls back font by font as it does
# for the page's text): the pixels as one string.
DRAWN = """
const [element, chars] = arguments;
const font = getComputedStyle(element).font;
return chars.map((ch) => {
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 48;
  const g = canvas.getContext('2d');
  g.font = font.replace(/\\d+(\\.\\d+)?px/, '32px');
  g.fillText(ch, 4, 38);
  return g.getImageData(0, 0, 48, 48).data.join(',');
});
"""


@pytest.fixture(scope="module")
def chinese_checkpoint(tmp_path_factory):
    """A tiny Transformer trained a few steps on Chinese numerals -> English: its vocabulary holds the characters."""
    root = tmp_path_factory.mktemp("zh")
    files = write_number_corpus(root / "corpus", lang="zh", n_train=300, n_valid=20, n_test=20)
    prepare(root / "data", files["train"], files["valid"], files["test"], vocab_size=120)
    Trainer(tiny_run_config(max_steps=4, max_epochs=1, log_every=1), root / "data", root / "run",
            progress=False).fit()
    return root / "run" / "checkpoints" / "best.safetensors"


def distinct_glyphs(page: Explorer, element, chars: list[str]) -> bool:
    """Whether every character of `chars` draws in `element`'s font as pixels of its own, none as a missing glyph."""
    drawn = page.js(DRAWN, element, [*chars, NO_GLYPH])
    return len(set(drawn)) == len(drawn)


def test_the_explorer_types_and_shows_a_chinese_sentence(chinese_checkpoint):
    translator = Translator.from_checkpoint(chinese_checkpoint, device="cpu")
    ((view, *_),) = translation_views(translator, [SENTENCE], DecodeOptions(beam=1))
    assert any(has_cjk(token) for token in view.keys["cross"])  # the model's own Chinese pieces
    driver = chromium()
    try:
        with served(chinese_checkpoint) as url:
            page = Explorer(driver, url)
            page.ask(SENTENCE)
            assert page.el("text").get_attribute("value") == SENTENCE  # typed, key by key
            assert page.el("source").text == SENTENCE
            assert page.el("output").text == view.output
            page.select("kind", "cross")
            assert [t for t, _ in page.tokens("right")] == view.keys["cross"]
            token = page.driver.find_element("css selector", "#headview text.tok.right")
            assert distinct_glyphs(page, page.el("source"), sorted(set(SENTENCE)))
            assert distinct_glyphs(page, token, sorted({ch for t in view.keys["cross"] for ch in t if has_cjk(ch)}))
            page.view("heatmap")
            header = page.driver.find_element("css selector", "#grid th")
            assert distinct_glyphs(page, header, sorted(set(SENTENCE)))
    finally:
        driver.quit()
