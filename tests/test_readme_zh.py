"""README.zh-CN.md stays true to README.md: the same `attnkit` and `make` commands in its code blocks, every `attnkit`
command in it parses, every figure in it with a decimal point or a % is one the English README states, its Chinese
demo examples are the ones `attnkit demo --lang zh` prints, and its links lead to files of the repository."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from attnkit.cli.main import build_parser
from attnkit.cli.options import split_overrides
from attnkit.data.demo_corpus import EXAMPLES, spell
from attnkit.viz.fonts import has_cjk

ROOT = Path(__file__).resolve().parents[1]
README, README_ZH = ROOT / "README.md", ROOT / "README.zh-CN.md"
FIGURE = re.compile(r"\d[\d,]*\.\d+%?|\d[\d,]*%")  # 43.19, 5.8k's 5.8, 99.6%; not 0..999,999 nor 1,310


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def commands(markdown: str) -> list[str]:
    """The `attnkit ...` and `make ...` lines of the bash code blocks, without their comments (which are in the
    README's language)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            if line.startswith(("attnkit ", "make ")) or "| attnkit " in line:
                found.append(" ".join(line.split()))
    return found


def inline_commands(markdown: str) -> list[str]:
    """`attnkit ...` in inline code spans (outside the code blocks)."""
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return [span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith("attnkit ")]


def argv(command: str) -> list[str]:
    command = command.split("| attnkit ", 1)[-1].removeprefix("attnkit ").rstrip(" &\\")
    rest, _ = split_overrides(shlex.split(command.replace("$C", "runs/demo/checkpoints/best.safetensors")))
    return rest


def parse_error(words: list[str]) -> str | None:
    """What argparse says about `words` (None: they parse)."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.suppress(SystemExit):
        build_parser()[0].parse_args(words)
        return None
    return said.getvalue().strip().splitlines()[-1]


def names_a_verb(words: list[str]) -> bool:
    """For a span that names a verb without its required options (`attnkit prepare`) or with a placeholder
    (`attnkit train --config 预设名`): its verbs exist and each of its --options is one of the verb's own."""
    parser, verbs = build_parser()[0], 0
    while words and parser._subparsers is not None:
        choices = next(a.choices for a in parser._subparsers._group_actions)
        if words[0] not in choices:
            break
        parser, words, verbs = choices[words[0]], words[1:], verbs + 1
    known = {s for action in parser._actions for s in action.option_strings}
    return verbs > 0 and all(w in known for w in words if w.startswith("-"))


def test_the_chinese_readme_runs_the_english_readmes_commands():
    en, zh = Counter(commands(text(README))), Counter(commands(text(README_ZH)))
    assert zh == en, f"only in README.zh-CN.md: {sorted((zh - en).elements())}; only in README.md: " \
                     f"{sorted((en - zh).elements())}"
    assert "make demo" in zh and any(c.startswith("attnkit translate") for c in zh)


@pytest.mark.parametrize("command", [*commands(text(README_ZH)), *inline_commands(text(README_ZH))])
def test_every_attnkit_command_in_the_chinese_readme_parses(command):
    if command.startswith("make "):
        target = command.split()[1]
        assert re.search(rf"^{target}:", text(ROOT / "Makefile"), flags=re.M), command
        return
    words = argv(command)
    error = parse_error(words)
    placeholder = any(has_cjk(w) for w in words)  # 预设名: "a preset's name"
    inline = command in inline_commands(text(README_ZH))
    if error is not None and inline and ("arguments are required" in error or placeholder):
        assert names_a_verb(words), command
    else:
        assert error is None, f"{command}: {error}"


def test_every_figure_of_the_chinese_readme_is_one_of_the_english_readme():
    english = set(FIGURE.findall(text(README)))
    chinese = FIGURE.findall(text(README_ZH))
    assert len(chinese) > 20  # the demo's output, the results table
    assert sorted(set(chinese) - english) == []


def test_the_chinese_demo_examples_are_what_the_demo_prints():
    zh, english = spell(EXAMPLES, "zh")
    shown = "\n".join(f"  {z}\n    -> {e}" for z, e in zip(zh, english))
    blocks = re.findall(r"```text\n(.*?)```", text(README_ZH), flags=re.S)
    assert any(shown in block for block in blocks), shown
    assert "attnkit demo --lang zh" in inline_commands(text(README_ZH))


def test_the_readmes_link_to_each_other_and_to_files_that_exist():
    assert "(README.zh-CN.md)" in text(README).split("\n## ", 1)[0]  # at the top of the English README
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text(README_ZH))
    assert "README.md" in links
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, missing
