"""The one font choice behind every picture: text holding Chinese, Japanese or Korean characters falls back to
an installed CJK font, because matplotlib's default font (DejaVu Sans) has no CJK glyphs and draws empty boxes.

The fallback is set per text artist of the figure being drawn (matplotlib >= 3.6 falls back glyph by glyph along
a family list), never in the global rcParams, so importing or calling attnkit leaves other figures as they were.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from pathlib import Path

import matplotlib
from matplotlib import font_manager, ft2font
from matplotlib.figure import Figure
from matplotlib.text import Text

# Debian's CJK font packages, smallest first (.ci/run installs the first, a small fraction of fonts-noto-cjk's size).
CJK_PACKAGES = ("fonts-wqy-microhei", "fonts-noto-cjk")
# Sans-serif fonts with CJK glyphs by their family names, Simplified Chinese first (attnkit's likely readers),
# Linux then macOS and Windows ones. matplotlib reads the first face of a .ttc: fonts-noto-cjk is "Noto Sans CJK JP".
CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
                "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans CJK KR", "Droid Sans Fallback", "PingFang SC",
                "Hiragino Sans GB", "Heiti SC", "Microsoft YaHei", "SimHei", "Arial Unicode MS")
# Hangul Jamo, the CJK radicals .. unified ideographs (with kana, bopomofo and CJK punctuation), Hangul syllables,
# compatibility ideographs, vertical and fullwidth forms, the supplementary ideograph planes.
CJK = re.compile("[\u1100-\u11ff\u2e80-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe10-\ufe1f\ufe30-\ufe4f"
                 "\uff00-\uffef\U00020000-\U0003ffff]")
PROBE = ord("中")  # a glyph every CJK font has
# matplotlib's warning for a character its fonts lack, "Glyph 21435 (\N{CJK UNIFIED IDEOGRAPH-53BB}) missing from
# font(s) DejaVu Sans.", where the character is one of CJK's (by its Unicode name)
CJK_GLYPH_MISSING = r"Glyph \d+ \(\\N\{(CJK|IDEOGRAPHIC|HIRAGANA|KATAKANA|HANGUL|BOPOMOFO|FULLWIDTH|HALFWIDTH)"
NO_CJK_FONT = "_attnkit_no_cjk_font"  # set on a figure whose CJK text has no font to draw it


def has_cjk(text: str) -> bool:
    return CJK.search(text) is not None


def _holds_probe(path: str) -> bool:
    if Path(path).is_relative_to(matplotlib.get_data_path()):  # its Last Resort font maps 中 to a box
        return False
    try:
        return ft2font.FT2Font(path).get_char_index(PROBE) != 0
    except (OSError, RuntimeError, ValueError):  # an unreadable or unsupported font file: not a candidate
        return False


@functools.cache
def cjk_family() -> str | None:
    """The family name of an installed font with CJK glyphs, or None: the first of CJK_FAMILIES that matplotlib
    knows, else any font known or installed (not matplotlib's own) that has the glyph 中. Looked up once per
    process."""
    known = font_manager.fontManager.ttflist
    names = {entry.name for entry in known}
    for name in CJK_FAMILIES:
        if name in names:
            return name
    for entry in known:
        if _holds_probe(entry.fname):
            return entry.name
    # matplotlib's font list is cached on disk when first built: a font installed since then is not in it
    listed = {entry.fname for entry in known}
    for path in sorted(font_manager.findSystemFonts()):
        if path not in listed and _holds_probe(path):
            font_manager.fontManager.addfont(path)  # makes the family findable by name; changes no default
            return font_manager.ttfFontProperty(ft2font.FT2Font(path)).name
    return None


@functools.cache
def warn_no_cjk_font() -> None:
    """Said once per process, the first time CJK text must be drawn without a CJK font."""
    warnings.warn(f"no CJK font is installed, so Chinese, Japanese and Korean tokens draw as empty boxes in the "
                  f"pictures; install one (Debian: apt-get install {CJK_PACKAGES[0]} or {CJK_PACKAGES[1]})",
                  stacklevel=2)


def fit_fonts(fig: Figure) -> Figure:
    """When any text of `fig` holds CJK characters, give every text of it the CJK font after its own families
    (every text: tick labels a draw adds copy the first tick's font). Idempotent; returns `fig`."""
    texts = fig.findobj(Text)
    if not any(has_cjk(t.get_text()) for t in texts):
        return fig
    family = cjk_family()
    if family is None:
        warn_no_cjk_font()
        setattr(fig, NO_CJK_FONT, True)
        return fig
    for t in texts:
        own = list(t.get_fontfamily())
        if family not in own:
            t.set_fontfamily([*own, family])
    return fig


@contextlib.contextmanager
def said_once(fig: Figure):
    """Around attnkit's own drawing of `fig`: where its CJK text has no font, `warn_no_cjk_font` has said so once,
    so matplotlib's warning per missing CJK character and per draw (dozens a picture, again at every epoch of a
    training run) is left out. Other missing glyphs, and a caller's own draws, still warn."""
    if not getattr(fig, NO_CJK_FONT, False):
        yield
        return
    with warnings.catch_warnings():  # restores the filters on the way out
        warnings.filterwarnings("ignore", message=CJK_GLYPH_MISSING, category=UserWarning)
        yield
