"""The built-in demo corpus: German number words (or Chinese numerals) -> English number words.

It needs no download, a small model learns it in minutes, and its attention is easy to read:
"dreihundertfünfundvierzig" -> "three hundred and forty-five" reorders units and tens, so the
attention map shows a clear, checkable crossing. The Chinese source, "三百四十五", keeps the English
order but counts in ten thousands: "七万零一十七" -> "seventy thousand and seventeen".
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from num2words import num2words

from attnkit.data.text import write_lines
from attnkit.errors import ConfigError

BUILDING_BLOCKS = 100  # 0..100 hold every irregular word ("elf", "zwölf", "siebzehn"), so train sees them all
EXAMPLES = (345, 2024, 70_017, 999_999)  # the README's examples: in every default test set, never in train
SPLIT_NAMES = ("train", "valid", "test")
LANGUAGES = ("de", "zh")  # the source languages; the target is English

ZH_DIGITS = "零一二三四五六七八九"
ZH_UNITS = ((1000, "千"), (100, "百"), (10, "十"), (1, ""))


def _zh_group(n: int, first: bool) -> str:
    """1..9999 in Chinese numerals. A zero between digits reads 零 once (一千零一, 一千零一十) and trailing zeros
    are silent (一千一百); `first`: nothing is read before it, so 10..19 are 十, 十一, .. (after 零 or a higher
    unit they are 一十, 一十一, ..); a 2 of thousands is 两 (两千, as it is said; 二千 is rarer)."""
    words, zero = [], False
    for value, unit in ZH_UNITS:
        digit = n // value % 10
        if digit == 0:
            zero = zero or bool(words)
            continue
        if zero:
            words.append("零")
            zero = False
        if value == 10 and digit == 1 and first and not words:
            words.append("十")
        else:
            words.append(("两" if digit == 2 and value == 1000 else ZH_DIGITS[digit]) + unit)
    return "".join(words)


def chinese(n: int) -> str:
    """0 <= n < 10**8 in Chinese numerals (mainland usage): 三百四十五, 两千零二十四, 七万零一十七,
    九十九万九千九百九十九. Counts go by ten thousands (万); the part below 万 reads 零 first when it has no
    thousands (七万零一十七, 十万零五百); 两 stands for a lone 2 before 千 or 万 (两千, 两万, but 二十二万)."""
    if not 0 <= n < 10**8:
        raise ConfigError(f"chinese numerals: {n} is outside 0..99,999,999")
    if n == 0:
        return ZH_DIGITS[0]
    high, low = divmod(n, 10_000)
    if not high:
        return _zh_group(low, first=True)
    words = ("两" if high == 2 else _zh_group(high, first=True)) + "万"
    if low:
        words += ("零" if low < 1000 else "") + _zh_group(low, first=False)
    return words


SPELL = {"de": lambda n: num2words(n, lang="de"), "zh": chinese}


def magnitude_bands(max_number: int) -> list[tuple[int, int]]:
    """The numbers above the building blocks by digit count: [(101, 999), (1000, 9999), ...], inclusive."""
    bands, low = [], BUILDING_BLOCKS + 1
    while low <= max_number:
        high = min(10 ** len(str(low)) - 1, max_number)
        bands.append((low, high))
        low = high + 1
    return bands


def spread(n: int, capacities: list[int]) -> list[int]:
    """n split as evenly as the capacities allow: the smallest bands first, each taking at most an even
    share of what is left (the largest shares go to the last, largest bands)."""
    counts, left = [0] * len(capacities), n
    order = sorted(range(len(capacities)), key=lambda i: (capacities[i], i))
    for k, i in enumerate(order):
        counts[i] = min(capacities[i], left // (len(order) - k))
        left -= counts[i]
    if left > 0:
        raise ConfigError(f"cannot draw that many distinct numbers: {left} more than 0..{sum(capacities)} hold")
    return counts


def _draw_numbers(
    n_train: int, n_valid: int, n_test: int, max_number: int, seed: int
) -> dict[str, np.ndarray]:
    """Disjoint number sets per split: 0..BUILDING_BLOCKS all in train, and every magnitude above them
    (hundreds, thousands, ...) drawn in even shares into every split, so that no digit count dominates.
    The README's EXAMPLES go to test (when they fit the range)."""
    blocks = np.arange(0, min(BUILDING_BLOCKS, max_number) + 1)
    if n_train < len(blocks):
        raise ConfigError(f"n_train must be at least {len(blocks)} to hold the numbers 0..{len(blocks) - 1}")
    bands = magnitude_bands(max_number)
    sizes = [high - low + 1 for low, high in bands]
    eval_counts = {name: spread(n, [size // 3 for size in sizes]) for name, n in (("valid", n_valid), ("test", n_test))}
    left = [size - eval_counts["valid"][i] - eval_counts["test"][i] for i, size in enumerate(sizes)]
    train_counts = spread(n_train - len(blocks), left)
    rng = np.random.default_rng(seed)
    splits: dict[str, list[np.ndarray]] = {"train": [blocks], "valid": [], "test": []}
    for i, (low, high) in enumerate(bands):
        examples = np.array([x for x in EXAMPLES if low <= x <= high][: eval_counts["test"][i]], dtype=np.int64)
        pool = np.setdiff1d(np.arange(low, high + 1), examples)
        wanted = [train_counts[i], eval_counts["valid"][i], eval_counts["test"][i] - len(examples)]
        drawn = rng.choice(pool, size=sum(wanted), replace=False)
        cuts = np.cumsum(wanted)
        splits["train"].append(drawn[: cuts[0]])
        splits["valid"].append(drawn[cuts[0] : cuts[1]])
        splits["test"].append(np.concatenate([examples, drawn[cuts[1] :]]))
    return {name: rng.permutation(np.concatenate(parts)) for name, parts in splits.items()}


def check_language(lang: str) -> str:
    if lang not in SPELL:
        raise ConfigError(f"the demo's source language is one of {', '.join(LANGUAGES)}, not {lang!r}")
    return lang


def spell(numbers, lang: str = "de") -> tuple[list[str], list[str]]:
    """Numbers -> (source words, English words): German as num2words writes it, or Chinese numerals
    (`chinese`: num2words 0.5 has no Chinese); English by num2words."""
    ints = [int(n) for n in numbers]
    source = SPELL[check_language(lang)]
    return [source(n) for n in ints], [num2words(n, lang="en") for n in ints]


def make_number_corpus(
    n_train: int = 24000, n_valid: int = 1000, n_test: int = 1000, max_number: int = 999_999, seed: int = 0,
    lang: str = "de",
) -> dict[str, tuple[list[str], list[str]]]:
    """{"train"|"valid"|"test": (source lines, English lines)} over disjoint random numbers, every
    magnitude (hundreds, thousands, ... up to max_number) in even shares; the source is `lang` (de or zh)."""
    check_language(lang)
    numbers = _draw_numbers(n_train, n_valid, n_test, max_number, seed)
    return {name: spell(nums, lang) for name, nums in numbers.items()}


def write_number_corpus(out_dir: str | os.PathLike, lang: str = "de", **kw) -> dict[str, tuple[Path, Path]]:
    """Write `{split}.{lang}` / `{split}.en` under `out_dir`; returns the (source, English) paths per split."""
    out_dir = Path(out_dir)
    paths = {}
    for name, (source, en) in make_number_corpus(lang=lang, **kw).items():
        paths[name] = (out_dir / f"{name}.{lang}", out_dir / f"{name}.en")
        for path, lines in zip(paths[name], (source, en)):
            write_lines(path, lines)
    return paths
