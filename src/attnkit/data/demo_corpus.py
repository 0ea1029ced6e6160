"""The built-in demo corpus: German number words -> English number words.

It needs no download, a small model learns it in minutes, and its attention is easy to read:
"dreihundertfünfundvierzig" -> "three hundred and forty-five" reorders units and tens, so the
attention map shows a clear, checkable crossing.
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


def spell(numbers) -> tuple[list[str], list[str]]:
    """Numbers -> (German words, English words), as num2words writes them."""
    ints = [int(n) for n in numbers]
    return [num2words(n, lang="de") for n in ints], [num2words(n, lang="en") for n in ints]


def make_number_corpus(
    n_train: int = 24000, n_valid: int = 1000, n_test: int = 1000, max_number: int = 999_999, seed: int = 0
) -> dict[str, tuple[list[str], list[str]]]:
    """{"train"|"valid"|"test": (German lines, English lines)} over disjoint random numbers, every
    magnitude (hundreds, thousands, ... up to max_number) in even shares."""
    numbers = _draw_numbers(n_train, n_valid, n_test, max_number, seed)
    return {name: spell(nums) for name, nums in numbers.items()}


def write_number_corpus(out_dir: str | os.PathLike, **kw) -> dict[str, tuple[Path, Path]]:
    """Write `{split}.de` / `{split}.en` under `out_dir`; returns the (de, en) paths per split."""
    out_dir = Path(out_dir)
    paths = {}
    for name, (de, en) in make_number_corpus(**kw).items():
        paths[name] = (out_dir / f"{name}.de", out_dir / f"{name}.en")
        for path, lines in zip(paths[name], (de, en)):
            write_lines(path, lines)
    return paths
