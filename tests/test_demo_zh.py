"""The Chinese demo: Chinese numerals -> English over the German demo's numbers, its README examples held out in the
test set, and `attnkit demo --lang zh` end to end on a tiny budget (the three full runs are timed separately)."""

from __future__ import annotations

import re

import pytest

from attnkit.cli.main import main
from attnkit.config import resolve
from attnkit.data.dataset import data_languages
from attnkit.data.demo_corpus import EXAMPLES, _draw_numbers, chinese, make_number_corpus, spell, write_number_corpus
from attnkit.demo import run_demo
from attnkit.errors import ConfigError
from test_fonts import installed_cjk_fonts

DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
UNITS = {"十": 10, "百": 100, "千": 1000}


def read_chinese(words: str) -> int:
    """A reader of Chinese numerals below 10**8, written apart from attnkit's speller: digit x unit, 零 skipped,
    a bare 十 is ten, 万 multiplies what came before it."""
    total = section = 0
    digit = None
    for ch in words:
        if ch in DIGITS:
            digit = DIGITS[ch]
        elif ch in UNITS:
            section += (1 if digit is None else digit) * UNITS[ch]
            digit = None
        elif ch == "万":
            total += (section + (digit or 0)) * 10_000
            section, digit = 0, None
        else:
            assert ch == "零", words
    return total + section + (digit or 0)


def test_chinese_numerals_as_they_are_said_and_written():
    said = {0: "零", 10: "十", 12: "十二", 20: "二十", 101: "一百零一", 110: "一百一十", 200: "二百",
            345: "三百四十五", 1001: "一千零一", 1010: "一千零一十", 1100: "一千一百", 2000: "两千",
            2024: "两千零二十四", 10_010: "一万零一十", 12_000: "一万两千", 20_000: "两万", 70_017: "七万零一十七",
            100_000: "十万", 100_500: "十万零五百", 105_000: "十万五千", 110_000: "十一万", 220_000: "二十二万",
            999_999: "九十九万九千九百九十九", 20_000_000: "两千万"}
    assert {n: chinese(n) for n in said} == said
    with pytest.raises(ConfigError, match="outside"):
        chinese(10**8)


def test_every_number_of_the_demo_reads_back_and_keeps_the_rules():
    spelled = [chinese(n) for n in range(1_000_000)]
    assert [read_chinese(w) for w in spelled] == list(range(1_000_000))
    rules = {"one 零 for a run of zeros": "零零", "no trailing 零": ".零$", "十 not 一十 first": "^一十",
             "两 only before 千 or 万": "两(?![千万])", "二 not before 千": "二千",
             "二万 only after 十 (二十二万)": "(?<!十)二万"}
    for rule, pattern in rules.items():
        assert not [w for w in spelled if re.search(pattern, w)], rule


def test_the_chinese_corpus_has_the_german_ones_numbers_and_holds_out_the_examples(tmp_path):
    kw = dict(n_train=300, n_valid=40, n_test=40, seed=3)
    zh, de = make_number_corpus(lang="zh", **kw), make_number_corpus(**kw)
    numbers = _draw_numbers(300, 40, 40, 999_999, seed=3)
    for split in ("train", "valid", "test"):
        assert [read_chinese(w) for w in zh[split][0]] == numbers[split].tolist()
        assert zh[split][1] == de[split][1]  # the same numbers, in English, in the same order
    examples, english = spell(EXAMPLES, "zh")
    assert examples == ["三百四十五", "两千零二十四", "七万零一十七", "九十九万九千九百九十九"]
    assert english[0] == "three hundred and forty-five"
    assert set(examples) <= set(zh["test"][0]) and not set(examples) & set(zh["train"][0] + zh["valid"][0])
    paths = write_number_corpus(tmp_path, lang="zh", n_train=120, n_valid=5, n_test=5, max_number=1000)
    assert paths["train"][0].name == "train.zh" and paths["test"][1].name == "test.en"
    with pytest.raises(ConfigError, match="not 'fr'"):
        make_number_corpus(lang="fr", **kw)


def test_the_chinese_preset_is_the_german_demo_model_and_budget():
    assert resolve(["demo-zh"]) == resolve(["demo"])


def test_demo_lang_zh_end_to_end(capsys, tmp_path):
    out = tmp_path / "demo-zh"
    code = main(["demo", "--lang", "zh", "--out", out, "--n-train", "300", "--n-eval", "8", "--quiet",
                 "--train.max_steps=4", "--train.device=cpu", "--model.d_model=16", "--model.n_heads=2",
                 "--model.d_ff=32"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Chinese->English number corpus" in captured.out and "exact match" in captured.out
    shown = re.findall(r"^  (\S+)\n    -> ", captured.out, flags=re.M)
    assert shown == spell(EXAMPLES, "zh")[0]
    test_sources = (out / "corpus" / "test.zh").read_text(encoding="utf-8").splitlines()
    assert set(shown) <= set(test_sources)
    assert (out / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # prepare was told the languages, so Chinese chose its normalization (identity) and BLEU knows the target's
    assert data_languages(out / "data") == {"src": "zh", "tgt": "en"}
    assert "tokenizer normalization: identity" in captured.out
    if installed_cjk_fonts():
        assert "missing from font" not in captured.err and "no CJK font" not in captured.err
    with pytest.raises(ConfigError, match="one of de, zh"):
        run_demo(tmp_path / "fr", lang="fr")
