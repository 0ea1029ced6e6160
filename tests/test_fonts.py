"""Chinese tokens in attnkit's pictures are drawn with a CJK font, not as empty boxes: matplotlib warns "Glyph ...
missing from font(s) DejaVu Sans" for every character its font lacks, and these tests fail on that warning.

Skipped, with the reason, where no CJK font is installed (`.ci/run` installs fonts-wqy-microhei); the warn-once
test hides the installed fonts and runs everywhere."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib import font_manager, ft2font

from attnkit.viz import AttentionView, plot_attention, plot_attention_heads
from attnkit.viz.figure import png_bytes
from attnkit.viz.report import attention_figure

SOURCE = "七万零一十七"
SRC_TOKENS = ["▁七万", "零", "一十", "七", "</s>"]
TGT_TOKENS = ["<s>", "▁seventy", "▁thousand", "▁and", "▁seventeen"]


def installed_cjk_fonts() -> set[str]:
    """The font files installed on this machine with the glyph 中 (found without attnkit)."""
    found = set()
    for path in font_manager.findSystemFonts():
        try:
            if ft2font.FT2Font(path).get_char_index(ord("中")):
                found.add(path)
        except (OSError, RuntimeError):
            continue
    return found


def glyphs_missing(record) -> list[str]:
    return [str(w.message) for w in record if "missing from font" in str(w.message)]


def view() -> AttentionView:
    rng = np.random.default_rng(0)
    cross = rng.dirichlet(np.ones(len(SRC_TOKENS)), size=(2, len(TGT_TOKENS))).astype(np.float32)  # (H, T, S)
    return AttentionView(source=SOURCE, output="seventy thousand and seventeen", maps={"cross": [cross]},
                         queries={"cross": TGT_TOKENS}, keys={"cross": SRC_TOKENS})


def draw_everything(tmp_path) -> list:
    """The pictures that show tokens: the demo's heatmap, `plot attention`'s grid (to a file, and returned to a
    caller who saves it), and the report's / TensorBoard's attention figure."""
    v = view()
    figures = [plot_attention_heads(torch.from_numpy(v.maps["cross"][0]), TGT_TOKENS, SRC_TOKENS,
                                    tmp_path / "heads.png", title=f"cross-attention: {SOURCE}")]
    figures.append(plot_attention(v, "cross", tmp_path / "grid.png").figure)
    unsaved = plot_attention(v, "cross", None).figure
    unsaved.savefig(tmp_path / "by-the-caller.png")
    figures.append(unsaved)
    report = attention_figure(v)
    figures.append(report)
    png_bytes(report)
    return figures


@pytest.fixture
def fresh_font_lookup():
    """attnkit looks for a CJK font, and warns, once per process: start and end these tests with a clean slate."""
    from attnkit.viz import fonts

    cached = (fonts.cjk_family, fonts.warn_no_cjk_font)  # a test may monkeypatch them
    for f in cached:
        f.cache_clear()
    yield fonts
    for f in cached:
        f.cache_clear()


@pytest.mark.skipif(not installed_cjk_fonts(),
                    reason="no CJK font installed (Debian: apt-get install fonts-wqy-microhei or fonts-noto-cjk)")
def test_chinese_tokens_are_drawn_with_their_glyphs(tmp_path):
    defaults = dict(matplotlib.rcParams)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        figures = draw_everything(tmp_path)
    assert not glyphs_missing(record), glyphs_missing(record)[:3]
    assert not [w for w in record if "no CJK font" in str(w.message)]
    labels = [t for t in figures[0].axes[0].get_xticklabels() if t.get_text() == "零"]
    family = labels[0].get_fontfamily()
    assert len(family) == 2  # the default family, then the CJK font: an installed one, not matplotlib's boxes
    assert str(font_manager.findfont(font_manager.FontProperties(family=family[1]))) in installed_cjk_fonts()
    for name in ("heads.png", "grid.png", "by-the-caller.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert dict(matplotlib.rcParams) == defaults  # per text, never the process's defaults


def test_without_a_cjk_font_one_warning_names_the_package(tmp_path, monkeypatch, fresh_font_lookup):
    fonts = fresh_font_lookup
    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [e for e in font_manager.fontManager.ttflist if not fonts._holds_probe(e.fname)])
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        figures = draw_everything(tmp_path)
        draw_everything(tmp_path)
    ours = [str(w.message) for w in record if "no CJK font" in str(w.message)]
    assert len(ours) == 1, ours
    assert "apt-get install fonts-wqy-microhei" in ours[0]
    # matplotlib's own warning per missing character only where the caller drew the figure itself (the returned
    # one, saved twice), not from attnkit's draws (three pictures a round)
    drawn_by = {Path(w.filename).name for w in record if "missing from font" in str(w.message)}
    assert drawn_by == {Path(__file__).name}, drawn_by
    assert all(len(t.get_fontfamily()) == 1 for t in figures[0].findobj(matplotlib.text.Text))


def test_latin_pictures_look_for_no_cjk_font(tmp_path, monkeypatch, fresh_font_lookup):
    fonts = fresh_font_lookup
    monkeypatch.setattr(fonts, "cjk_family", lambda: pytest.fail("looked for a CJK font"))
    v = view()
    v.keys["cross"] = ["▁sieb", "zig", "tausend", "sieb", "zehn"]
    v.source = "siebzigtausendsiebzehn"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fig = plot_attention(v, "cross", tmp_path / "latin.png").figure
    assert not record
    assert all(list(t.get_fontfamily()) == list(matplotlib.rcParams["font.family"])
               for t in fig.findobj(matplotlib.text.Text))
