"""The README stays true: its demo examples are what the demo checks, its commands parse, it stays short."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from attnkit.cli.main import build_parser
from attnkit.cli.options import split_overrides
from attnkit.data.demo_corpus import EXAMPLES, spell

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_is_a_short_front_door():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300


def test_the_readme_examples_are_the_ones_the_demo_translates_and_checks():
    """The demo prints EXAMPLES (test sentences by construction, see test_data.py) with their references;
    the README shows exactly those lines, so a demo run that gets one wrong says so."""
    german, english = spell(EXAMPLES)
    shown = "\n".join(f"  {g}\n    -> {e}" for g, e in zip(german, english))
    assert any(shown in block for block in blocks("text")), shown
    assert german[0] == "dreihundertfünfundvierzig" and english[0] == "three hundred and forty-five"


@pytest.mark.parametrize("line", [line for block in blocks("bash") for line in block.splitlines()
                                  if line.lstrip().startswith("attnkit ") or "| attnkit " in line])
def test_every_attnkit_command_in_the_readme_parses(line):
    command = line.split("| attnkit ", 1)[-1].removeprefix("attnkit ").split("#")[0].rstrip(" &\\")
    argv = shlex.split(command.replace("$C", "runs/demo/checkpoints/best.safetensors"))
    rest, _ = split_overrides(argv)
    build_parser()[0].parse_args(rest)  # argparse exits on an unknown verb or option


def lines_in(*folders: str) -> int:
    src = README.parent / "src" / "attnkit"
    files = [f for folder in folders for f in (src / folder).glob("*.py")] if folders else list(src.rglob("*.py"))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def test_the_readme_s_size_sentence_is_true():
    """'src/attnkit is about N lines ... the papers' code ... about M': each within 10% of the files' line counts."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    total, core = (int(n.replace(",", "")) for n in re.findall(r"about (\d[\d,]*)(?: lines)?", text)[:2])
    assert abs(total - lines_in()) <= 0.1 * lines_in(), lines_in()
    papers = lines_in("nn", "models", "decode", "train")
    assert abs(core - papers) <= 0.1 * papers, papers
