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

BUILDING_BLOCKS = 100  # 1..100 hold every irregular word ("elf", "zwölf", "siebzehn"), so train sees them
SPLIT_NAMES = ("train", "valid", "test")


def _draw_numbers(
    n_train: int, n_valid: int, n_test: int, max_number: int, seed: int
) -> dict[str, np.ndarray]:
    """Disjoint number sets per split, with 1..BUILDING_BLOCKS all in train."""
    blocks = np.arange(1, min(BUILDING_BLOCKS, max_number) + 1)
    if n_train < len(blocks):
        raise ConfigError(f"n_train must be at least {len(blocks)} to hold the numbers 1..{len(blocks)}")
    pool = max_number - len(blocks)
    wanted = n_train - len(blocks) + n_valid + n_test
    if wanted > pool:
        raise ConfigError(f"cannot draw {n_train + n_valid + n_test} distinct numbers from 1..{max_number}")
    rng = np.random.default_rng(seed)
    drawn = rng.choice(pool, size=wanted, replace=False) + len(blocks) + 1
    n_rest = n_train - len(blocks)
    train = rng.permutation(np.concatenate([blocks, drawn[:n_rest]]))
    return {
        "train": train,
        "valid": drawn[n_rest : n_rest + n_valid],
        "test": drawn[n_rest + n_valid :],
    }


def _spell(numbers: np.ndarray) -> tuple[list[str], list[str]]:
    ints = [int(n) for n in numbers]
    return [num2words(n, lang="de") for n in ints], [num2words(n, lang="en") for n in ints]


def make_number_corpus(
    n_train: int = 24000, n_valid: int = 1000, n_test: int = 1000, max_number: int = 999_999, seed: int = 0
) -> dict[str, tuple[list[str], list[str]]]:
    """{"train"|"valid"|"test": (German lines, English lines)} over disjoint random numbers."""
    numbers = _draw_numbers(n_train, n_valid, n_test, max_number, seed)
    return {name: _spell(nums) for name, nums in numbers.items()}


def write_number_corpus(out_dir: str | os.PathLike, **kw) -> dict[str, tuple[Path, Path]]:
    """Write `{split}.de` / `{split}.en` under `out_dir`; returns the (de, en) paths per split."""
    out_dir = Path(out_dir)
    paths = {}
    for name, (de, en) in make_number_corpus(**kw).items():
        paths[name] = (out_dir / f"{name}.de", out_dir / f"{name}.en")
        for path, lines in zip(paths[name], (de, en)):
            write_lines(path, lines)
    return paths
