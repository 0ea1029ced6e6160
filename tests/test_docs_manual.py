"""docs/ stays a manual for users and benchmarks/results/ holds current tables, not a lab notebook.

A page carries the current tables with the command that regenerates each; the history of how a figure was reached
(commit hashes, dates, which machine on which day) lives in git. These checks fail on a page that narrates it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").glob("*.md"))]
SPEED_PAGE_LINES = 150
RESULT_FILES = 60

# a git commit's short or long hash: 7-40 hex digits holding a letter a-f and a digit (so no English word matches)
COMMIT = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
ISSUE = re.compile(r"(?<![\w&])#\d+\b")  # an issue number ("#42"), not a heading anchor ("cli.md#your-own-data")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a page outside its code blocks, where commands may hold anything."""
    lines, inside = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((n, line))
    return lines


def found(pattern: re.Pattern, path: Path) -> list[str]:
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{name}:{n}: {m.group(0)}" for n, line in _prose(path) for m in pattern.finditer(line)]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_pages_name_no_commit_date_or_issue(path):
    hits = found(COMMIT, path) + found(DATE, path) + found(ISSUE, path)
    assert not hits, "history belongs in git, not in the manual:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_look_for(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("measured at 1e98bf8 on 2026-11-28 (#42)\n```bash\ngit diff 1e98bf8\n```\nsee cli.md#x, "
                    "decade, #1f77b4-coloured lines\n")
    hits = [found(p, page) for p in (COMMIT, DATE, ISSUE)]
    assert [len(h) for h in hits] == [1, 1, 1], hits


def test_the_speed_page_is_short():
    n = len((ROOT / "docs" / "speed.md").read_text(encoding="utf-8").splitlines())
    assert n <= SPEED_PAGE_LINES, f"docs/speed.md has {n} lines: current tables and a paragraph per knob only"


def test_benchmark_results_are_one_file_per_table():
    files = [p for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()]
    assert len(files) <= RESULT_FILES, f"benchmarks/results holds {len(files)} files: one current file per table"
