"""Docstrings and comments say the mechanism and why, and name the test or benchmark that measures it.

A figure timed on one machine on one day (milliseconds, MiB, "1.4x faster", the CPU's model name, the date) is true
of that machine and that day only; it belongs in the benchmark's results, which say the command that makes them. This
test reads every docstring (`ast`) and comment (`tokenize`) under src/attnkit, and the comments of its YAML presets,
and names each such figure by file:line. Numbers that are not timings stay: the papers' constants, format facts
(int8 ranges), thresholds the code uses, units in messages and field names (strings are not read).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"

_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUMBER}(?:\s*(?:-|–|to|against|vs\.?|instead of)\s*{_NUMBER})?"
DATED = re.compile("|".join([
    # a time or a memory size: "3.4 ms", "0.8 us", "60 MiB", "2.4 s" (minutes and hours are also training budgets)
    rf"{_RANGE}\s?(?:ms|us|µs|ns|MiB|GiB|KiB|MB|GB|kB|KB|s|sec|seconds)\b(?!-)",
    # a speed ratio: "1.4x", "2.5 x", "12x slower", "1.45×", "6% faster"
    r"(?<![\w.])\d+\.\d+\s?[x×](?!\w)(?!\s*\d)",
    rf"{_NUMBER}\s?[x×]\s+(?:faster|slower|less|more|smaller|larger|the time)\b",
    rf"{_NUMBER}\s?%\s+(?:faster|slower|less|more|lower|higher)\b",
    # a machine: a CPU or GPU model, "on 2 cores", a date
    r"\b(?:EPYC|Xeon|Ryzen|Zen\s?\d|Sapphire Rapids|Ice Lake|Cascade Lake|Skylake|Core i\d|H100|H200|A100)\b",
    r"\bon \d+ (?:cores|threads)\b",
    rf"{_NUMBER}k?\s(?:training\s)?(?:tok/s|tokens/s)",
    r"\b20\d\d-(?:0[1-9]|1[0-2])\b",
]))


def _hits(text: str, first_line: int, where: str) -> list[str]:
    """`where:line: match` for each dated figure in `text`, whose first line is `first_line` of the file."""
    return [f"{where}:{first_line + text.count(chr(10), 0, m.start())}: {m.group(0)!r}" for m in DATED.finditer(text)]


def _python(path: Path, name: str) -> list[str]:
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                found += _hits(first.value.value, first.value.lineno, name)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found += _hits(tok.string, tok.start[0], name)
    return found


def _yaml(path: Path, name: str) -> list[str]:
    found = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        at = 0 if line.lstrip().startswith("#") else line.find(" #") + 1
        if at or line.lstrip().startswith("#"):
            found += _hits(line[at:], lineno, name)
    return found


def dated_figures(root: Path) -> list[str]:
    """Every dated figure in the docstrings and comments of the package at `root` (.py and .yaml files)."""
    found = []
    for path in sorted(root.rglob("*.py")) + sorted(root.rglob("*.yaml")):
        name = str(path.relative_to(root.parent))
        found += _python(path, name) if path.suffix == ".py" else _yaml(path, name)
    return found


def test_no_dated_figures_in_docstrings_or_comments():
    found = dated_figures(SRC)
    assert not found, ("docstrings and comments name the mechanism and the test or benchmark that measures it, "
                       "not a figure of one machine:\n" + "\n".join(found))


def test_the_guard_sees_figures():
    source = '"""Took 3.4 ms instead of 6.5 ms on 2 cores of an EPYC."""\n\n\ndef f():\n    """1.4x faster."""\n' \
             "    return 1  # 60 MiB less; 6% faster\n"
    hits = [m.group(0) for m in DATED.finditer(source)]
    assert hits == ["3.4 ms", "6.5 ms", "on 2 cores", "EPYC", "1.4x", "60 MiB", "6% faster"], hits
    for clean in ("d_model 512, dropout 0.1 (section 3.3)", "int8 inputs 0..255, 2 x 255 x 127 = 64,770",
                  "a (64, 512) x (512, 2048) product", "the 4x wider hidden layer", "B x S rows, 2 x 2 rotations",
                  "AVX-512 VNNI and AMX kernels", "peak_rss_mb", "0.2.x", "sentencepiece 0.2.x"):
        assert not DATED.search(clean), (clean, DATED.findall(clean))
