"""Chinese text through prepare's tokenizer: the normalisation is a recorded choice (prepare.json and the sentencepiece
model itself), `identity` gives Chinese back exactly as written (fullwidth ，？！, fullwidth digits, superscripts,
halfwidth katakana) where sentencepiece's default NFKC rewrites it, docs/cli.md's table of what each choice does is
what it does, and the character coverage decides which rare characters become unknown."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnkit.cli.main import build_parser, main
from attnkit.data import SubwordTokenizer, load_tokenizers, prepare
from attnkit.data.tokenizer import DEFAULT_NORMALIZATION, NORMALIZATIONS
from attnkit.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
WRITTEN = ["你好，世界！", "（注）", "x² 10⁵", "１２３４５", "你好吗？我很忙。", "ｶﾀｶﾅ", "Tom ＡＢＣ",
           "“引号”、「括号」：１０％"]
ENGLISH = ["Hello, world!", "(Note)", "x squared, ten to the fifth", "12345", "How are you? I am busy.", "katakana",
           "Tom ABC", "quotes, brackets: 10%"]


def write_pair(folder: Path, name: str, zh: list[str], en: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.zh").write_text("\n".join(zh) + "\n", encoding="utf-8")
    (folder / f"{name}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return folder / name


def prepared(tmp_path: Path, normalization: str | None, languages: tuple[str, str] = ("zh", "en")) -> Path:
    """`attnkit prepare` of WRITTEN / ENGLISH, the Chinese side under the suffix languages[0], the English under
    languages[1]."""
    src, tgt = languages
    folder = tmp_path / f"text-{src}-{tgt}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"train.{src}").write_text("\n".join(WRITTEN * 20) + "\n", encoding="utf-8")
    (folder / f"train.{tgt}").write_text("\n".join(ENGLISH * 20) + "\n", encoding="utf-8")
    out = tmp_path / f"data-{normalization}-{src}-{tgt}"
    extra = ["--normalization", normalization] if normalization else []
    assert main(["prepare", "--src", src, "--tgt", tgt, "--train", str(folder / "train"), "--valid",
                 str(folder / "train"), "--vocab-size", "90", "--out", str(out), *extra]) == 0
    return out


def round_trip(tok: SubwordTokenizer, texts: list[str]) -> list[str]:
    return tok.decode(tok.encode(texts))


def test_identity_gives_chinese_back_as_written_and_nfkc_rewrites_it(tmp_path):
    """decode(encode(s)) == s under identity, for every string; under nmt_nfkc (the default of other languages)
    the fullwidth punctuation, digits and letters, superscripts and halfwidth katakana come back as NFKC makes
    them."""
    identity, default = prepared(tmp_path, "identity"), prepared(tmp_path, DEFAULT_NORMALIZATION)
    tok, _ = load_tokenizers(identity)
    assert round_trip(tok, WRITTEN) == WRITTEN
    tok, _ = load_tokenizers(default)
    assert round_trip(tok, WRITTEN)[:4] == ["你好,世界!", "(注)", "x2 105", "12345"]
    settings = json.loads((identity / "prepare.json").read_text())["settings"]
    assert (settings["normalization"], settings["character_coverage"]) == ("identity", 1.0)
    assert json.loads((default / "prepare.json").read_text())["settings"]["normalization"] == DEFAULT_NORMALIZATION
    # the references prepare writes beside the encoded splits stay as read, whatever the tokenizer does
    assert (identity / "valid.src.txt").read_text(encoding="utf-8").splitlines()[:8] == WRITTEN


@pytest.mark.parametrize(("languages", "expected", "why"), [
    (("zh", "en"), "identity", "the source language zh is Chinese"),
    (("ja", "en"), "identity", "the source language ja is Japanese"),
    (("de", "zh-Hans"), "identity", "the target language zh-Hans is Chinese"),
    (("de", "en"), DEFAULT_NORMALIZATION, "the default for languages other than Chinese and Japanese"),
    (("ko", "en"), DEFAULT_NORMALIZATION, "the default for languages other than Chinese and Japanese"),
])
def test_the_languages_choose_the_default_normalization(tmp_path, capsys, languages, expected, why):
    """Without --normalization a Chinese or Japanese side keeps the text as written (NFKC would rewrite the
    fullwidth ，？！ its references hold), other languages get sentencepiece's nmt_nfkc; the rule and its reason are in
    prepare.json and on the report's first line, and an explicit --normalization wins."""
    capsys.readouterr()
    out = prepared(tmp_path, None, languages)
    settings = json.loads((out / "prepare.json").read_text())["settings"]
    assert (settings["normalization"], settings["normalization_reason"].split(":")[0]) == (expected, why)
    assert capsys.readouterr().out.splitlines()[0].startswith(f"tokenizer normalization: {expected} ({why}")
    tok, _ = load_tokenizers(out)
    assert (round_trip(tok, WRITTEN[:1]) == WRITTEN[:1]) == (expected == "identity")
    told = prepared(tmp_path, "nfkc", languages)
    settings = json.loads((told / "prepare.json").read_text())["settings"]
    assert (settings["normalization"], settings["normalization_reason"]) == ("nfkc", "chosen with --normalization")
    assert "tokenizer normalization: nfkc (chosen with --normalization)" in capsys.readouterr().out


def test_the_choice_lives_in_the_tokenizer_itself(tmp_path):
    """The rule is inside the sentencepiece model (its normalizer_spec), so a checkpoint's tokenizer normalises at
    translation time as prepare did, without prepare.json."""
    model_pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    for rule in ("identity", "nfkc"):
        tok, _ = load_tokenizers(prepared(tmp_path, rule))
        proto = model_pb2.ModelProto()
        proto.ParseFromString(tok.to_bytes())
        assert proto.normalizer_spec.name == rule
        assert SubwordTokenizer.from_bytes(tok.to_bytes()).decode(tok.encode(["（注）"])) == round_trip(tok, ["（注）"])


def docs_table() -> tuple[list[str], list[list[str]]]:
    """The table under docs/cli.md's "What the normalization does" heading: (rule names, rows of cells)."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("What `--normalization` does to CJK text"):]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip(" `") for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if not line.startswith("| `"):
            break
        rows.append(re.findall(r"`([^`]*)`", line))
    return header, rows


def test_the_docs_table_is_what_prepare_does(tmp_path):
    header, rows = docs_table()
    rules = [h.split()[0] for h in header[1:]]
    assert rules == list(NORMALIZATIONS)
    written = [row[0] for row in rows]
    assert {"，", "。", "？", "！"} <= set("".join(written)) and "１" in "".join(written)
    corpus = written * 30
    for i, rule in enumerate(rules, start=1):
        tok = SubwordTokenizer.train(corpus, 80, normalization=rule)
        assert round_trip(tok, written) == [row[i] for row in rows], rule


def test_the_command_line_offers_every_rule_and_refuses_others(tmp_path, capsys):
    parser, _ = build_parser()
    args = parser.parse_args(["prepare", "--src", "zh", "--tgt", "en", "--train", "x", "--out", "y"])
    assert args.normalization is None and args.character_coverage == 1.0  # None: the languages choose
    prepare_parser = next(a for a in parser._subparsers._group_actions[0].choices.values()
                          if a.prog.endswith(" prepare"))
    choices = next(a.choices for a in prepare_parser._actions if a.dest == "normalization")
    assert tuple(choices) == NORMALIZATIONS
    with pytest.raises(ConfigError, match="unknown normalization 'nfc'"):
        SubwordTokenizer.train(WRITTEN, 40, normalization="nfc")
    with pytest.raises(ConfigError, match="character_coverage must be in"):
        SubwordTokenizer.train(WRITTEN, 40, character_coverage=0.0)


def test_character_coverage_below_one_turns_the_rarest_characters_unknown(tmp_path):
    """1.0 (the default) keeps every character training saw; 0.9995, sentencepiece's advice for large character
    sets, leaves out the rarest 0.05% of the training text's characters (here one seen once in 3,600)."""
    common = ["我很忙。", "你好吗？", "他是学生。", "我们走吧！"] * 200
    text = [*common, "我孑忙。"]
    full = SubwordTokenizer.train(text, 60, character_coverage=1.0, normalization="identity")
    partial = SubwordTokenizer.train(text, 60, character_coverage=0.9995, normalization="identity")
    assert round_trip(full, ["孑"]) == ["孑"]
    assert round_trip(partial, ["孑"]) == [" ⁇ "]  # sentencepiece's unknown piece
    assert round_trip(partial, ["我很忙。"]) == ["我很忙。"]
    prefix = write_pair(tmp_path / "t", "train", text, ["x"] * len(text))
    prepare(tmp_path / "d", (prefix.with_suffix(".zh"), prefix.with_suffix(".en")), vocab_size=60,
            character_coverage=0.9995)
    assert json.loads((tmp_path / "d" / "prepare.json").read_text())["settings"]["character_coverage"] == 0.9995
