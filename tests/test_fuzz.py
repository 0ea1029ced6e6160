"""Property-based fuzzing (hypothesis) of everything a user can feed attnkit: corpus files, translation input,
config files and overrides. The property everywhere: success, or one clear line `attnkit: error: ...` (exit
code 2) that names the file, line or field at fault -- never a traceback.

Generated examples per test (derandomized, so CI sees the same inputs every run), 1,070 in all:
    test_read_parallel_reads_or_names_the_bad_file       200
    test_config_files_resolve_or_name_the_problem        250
    test_config_overrides_resolve_or_name_the_field      200
    test_prepare_cli_succeeds_or_says_why                120
    test_translate_cli_answers_every_line_or_says_why    120
    test_translator_api_returns_one_result_per_input     170
    test_over_long_inputs_are_truncated_with_a_warning    10
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import re
import sys
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from attnkit import config as cfgmod
from attnkit.cli.main import main
from attnkit.data import read_parallel
from attnkit.errors import AttnkitError


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.large_base_example])


# --- strategies: text ---------------------------------------------------------------------------------------------
# Characters that break naive line handling: NUL, CR, vertical tab, form feed, the file/group/record separators,
# NEL, the Unicode line and paragraph separators, BOM, directional marks and overrides, DEL, escape.
TRICKY = "\x00\r\t\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\ufeff\u200e\u200f\u202e\x7f\x01\x1b"
WORDS = ["eins", "zwei", "drei", "hundert", "tausend", "und", "zwanzig", "sieben", "acht", "neun"]

chars = st.one_of(st.characters(codec="utf-8", exclude_characters="\n"), st.sampled_from(TRICKY))
short_line = st.one_of(
    st.text(chars, max_size=16),  # arbitrary code points (no surrogates: they cannot be written as UTF-8)
    st.just(""),
    st.text(st.sampled_from(" \t\u3000\xa0\u2009"), min_size=1, max_size=4),  # whitespace only
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join),  # words the test model knows
)
long_line = st.builds(lambda unit, n: unit * n, st.sampled_from(["x", "ab ", "ü", "eins ", "\u202e?"]),
                      st.integers(5_000, 50_000))  # one huge word, or thousands of short ones


def lines_of(line: st.SearchStrategy[str], max_size: int) -> st.SearchStrategy[list[str]]:
    return st.lists(line, min_size=0, max_size=max_size)


def exactly(n: int, line: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(line, min_size=n, max_size=n)


@st.composite
def file_bytes(draw, lines: list[str], damaged: bool = True) -> bytes:
    """The lines as a file: LF or CRLF, with or without a final newline; if damaged, maybe a bad UTF-8 byte."""
    data = (draw(st.sampled_from(["\n", "\r\n"]))).join(lines).encode("utf-8")
    if lines and draw(st.booleans()):
        data += b"\n"
    if damaged and draw(st.integers(0, 2)) == 0:  # invalid UTF-8 somewhere (a lone continuation or lead byte)
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xed\xa0\x80"])) + data[cut:]
    return data


@st.composite
def gz_or_plain(draw, data: bytes, damaged: bool = True) -> tuple[str, bytes]:
    """(suffix, bytes): plain or gzip; if damaged, maybe truncated or corrupt gzip, or not gzip despite `.gz`."""
    broken = ["truncated-gz", "not-gz", "corrupt-gz"] if damaged else []
    kind = draw(st.sampled_from(["plain", "plain", "plain", "gz", *broken]))
    if kind == "plain":
        return "", data
    packed = gzip.compress(data, mtime=0)
    if kind == "truncated-gz":
        return ".gz", packed[: draw(st.integers(0, len(packed) - 1))]
    if kind == "not-gz":
        return ".gz", data
    if kind == "corrupt-gz" and len(packed) > 12:
        i = draw(st.integers(10, len(packed) - 1))
        return ".gz", packed[:i] + bytes([packed[i] ^ 0xFF]) + packed[i + 1 :]
    return ".gz", packed


# --- oracles --------------------------------------------------------------------------------------------------------
def first_bad_line(data: bytes) -> int | None:
    """1-based number of the first line that is not valid UTF-8 (lines split on \\n only)."""
    for i, raw in enumerate(data.split(b"\n"), start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return i
    return None


def assert_one_line(message: str) -> None:
    assert message and "\n" not in message.strip("\n"), f"not one line: {message!r}"
    assert "Traceback" not in message


def assert_cli_error(err: str, *names: object) -> None:
    """stderr is exactly one line `attnkit: error: ...` naming at least one of `names`."""
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("attnkit: error: "), err
    assert any(str(n) in err for n in names), f"names none of {names}: {err!r}"


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.showwarning = warning_to_stderr  # as in a shell; pytest would otherwise record them
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse: a usage error
            code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def warning_to_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


# --- 1. reading parallel corpora ------------------------------------------------------------------------------------
@st.composite
def parallel_files(draw, max_lines: int = 6) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    """Two corpus files; often of different lengths, sometimes empty, gzipped or not gzip at all."""
    src = draw(lines_of(st.one_of(short_line, short_line, long_line.map(lambda s: s[:6000])), max_lines))
    n_tgt = len(src) if draw(st.booleans()) else draw(st.integers(0, max_lines))
    tgt = draw(exactly(n_tgt, short_line))
    return draw(gz_or_plain(draw(file_bytes(src)))), draw(gz_or_plain(draw(file_bytes(tgt))))


def expected_lines(data: bytes) -> list[str] | None:
    """What read_lines must return for these (decompressed) bytes; None when it must fail."""
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is no text (docs/cli.md, "Text input")
    if not data or first_bad_line(data) is not None:
        return None
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [(raw[:-1] if raw.endswith(b"\r") else raw).decode("utf-8") for raw in lines]


def decompressed(suffix: str, data: bytes) -> bytes | None:
    if suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except Exception:  # noqa: BLE001 -- any failure here means read_lines must report the file
        return None


def gunzipped_before_damage(data: bytes) -> bytes:
    """What a streaming reader gets out of damaged gzip bytes before the damage stops it: a byte at a time, so that
    it is at least what a reader of any larger chunks gets, and every line such a reader saw is in it."""
    got = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f, contextlib.suppress(Exception):
        while byte := f.read(1):
            got += byte
    return bytes(got)


@fuzz(200)
@given(files=parallel_files())
def test_read_parallel_reads_or_names_the_bad_file(tmp_path, files):
    (s_suffix, s_data), (t_suffix, t_data) = files
    src, tgt = tmp_path / f"c.de{s_suffix}", tmp_path / f"c.en{t_suffix}"
    src.write_bytes(s_data)
    tgt.write_bytes(t_data)
    s_plain, t_plain = decompressed(s_suffix, s_data), decompressed(t_suffix, t_data)
    try:
        got = read_parallel(src, tgt)
    except AttnkitError as e:
        msg = str(e)
        event(f"error: {msg.split(': ')[-1][:30]}")
        assert_one_line(msg)
        bad = src if s_plain is None or expected_lines(s_plain) is None else tgt
        if bad == tgt and t_plain is not None and expected_lines(t_plain) is not None:  # both fine: lengths differ
            assert "differ in length" in msg and str(src) in msg and str(tgt) in msg, msg
            return
        assert str(bad) in msg, msg
        plain = s_plain if bad == src else t_plain
        if plain and first_bad_line(plain):
            assert f"{bad}:{first_bad_line(plain)}: invalid UTF-8" in msg, msg
        return
    assert got == (expected_lines(s_plain), expected_lines(t_plain))
    assert len(got[0]) == len(got[1])


# --- 2. config files and overrides ----------------------------------------------------------------------------------
FIELDS = sorted({f.name for cls in (cfgmod.TransformerConfig, cfgmod.TrainConfig, cfgmod.RNNConfig,
                                    cfgmod.TransformerXLConfig, cfgmod.LMTrainConfig) for f in dataclasses.fields(cls)})
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10_000), st.integers(min_value=2**63, max_value=10**40),
    st.integers(max_value=-(2**63), min_value=-(10**40)), st.floats(allow_nan=True, allow_infinity=True),
    st.text(chars, max_size=8), st.sampled_from(["transformer", "rnn-luong", "transformer-xl", "relu", "noam", "abc"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3)),
                      max_leaves=8)
section = st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(chars, max_size=6)), values, max_size=4)
config_doc = st.one_of(
    st.fixed_dictionaries({}, optional={"model": st.one_of(section, values), "train": st.one_of(section, values),
                                        "base": st.one_of(st.sampled_from(["transformer-small", "rnn-luong", "nope"]),
                                                          values)}),
    st.dictionaries(st.text(chars, max_size=6), values, max_size=3),  # unknown top-level keys
    values,  # a list, a number, a string: not a mapping at all
)
BROKEN_YAML = [
    "model:\n  d_model: [1, 2\n", "model: {d_model: 8", "train:\n\tlr: 1\n", "model: 3\n", "train: {lr: \"abc\"}\n",
    "model:\n  - d_model\n  - 4\n", "train: {lr: 1e-3, lr: 2e-3}\n", "a: &x 1\nb: *y\n",
    "!!python/object:os.system {}\n", "model: {d_model: -8, n_heads: -2}\n", "model: {n_heads: 0}\n",
    "model: {kind: [transformer]}\n", "train: {betas: [[0.9], 0.98]}\n", "base: [1]\n", "base: 3\n",
    "model: {d_model: 100000000000000000000000000000}\n", "train: {max_tokens: .inf}\n", "model: {dropout: .nan}\n",
    "[" * 3000, "{a: " * 2000, "---\n...\n---\n", "model: !!binary aGVsbG8=\n", "? [1, 2]\n: 3\n",
    "model:\n  kind: rnn-luong\n  hidden: 7\n", "\ufeffmodel: {}\n", "model:\n  d_model: 8\n    n_heads: 2\n",
]


@st.composite
def config_file(draw) -> bytes:
    """A YAML document: broken on purpose, generated then dumped (maybe cut short), or random bytes."""
    kind = draw(st.integers(0, 9))
    if kind < 3:
        text = draw(st.sampled_from(BROKEN_YAML))
    elif kind < 8:
        text = yaml.safe_dump(draw(config_doc), allow_unicode=draw(st.booleans()))
        if draw(st.booleans()):
            text = text[: draw(st.integers(0, len(text)))]
    else:
        text = draw(st.text(st.one_of(chars, st.sampled_from(":{}[]-#&*!|>'\"%@`, \n")), max_size=60))
    data = text.encode("utf-8")
    if draw(st.integers(0, 9)) == 0:
        data += draw(st.sampled_from([b"\xff", b"\x00", b"\xc3("]))
    return data


def check_config_error(e: AttnkitError, path: Path | None = None) -> None:
    msg = str(e)
    assert_one_line(msg)
    named = [str(path)] if path else []
    named += ["model", "train", "override", "config", "preset"]
    assert any(n in msg for n in named), msg


@fuzz(250)
@given(data=config_file(), presets=st.sampled_from([[], ["transformer-small"], ["rnn-luong"], ["lm-char-small"]]))
def test_config_files_resolve_or_name_the_problem(tmp_path, data, presets):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    try:
        cfg = cfgmod.resolve([*presets, str(path)])
    except AttnkitError as e:
        event("error")
        check_config_error(e, path)
        if "invalid YAML" in str(e) or "cannot read" in str(e):
            assert str(path) in str(e)
        return
    assert isinstance(cfg, cfgmod.RunConfig | cfgmod.LMRunConfig)


override_key = st.lists(st.one_of(st.sampled_from(["model", "train", *FIELDS]), st.text(chars, max_size=5)),
                        min_size=1, max_size=3).map(".".join)
override_value = st.one_of(
    st.sampled_from(["abc", "", "1e400", "-5", "0", "[1, 2]", "{a: 1}", "null", "true", "nan", ".inf", "[[[", "'",
                     "!!python/object:os.system {}", "rnn-luong", "transformer-xl", "{kind: [1]}", "1" * 50]),
    st.text(chars, max_size=10),
)
override = st.one_of(st.builds(lambda k, v: f"{k}={v}", override_key, override_value), override_key,
                     override_key.map(lambda k: f"--{k}=1"))


@fuzz(200)
@given(overrides=st.lists(override, min_size=1, max_size=4),
       presets=st.sampled_from([[], ["transformer-small"], ["rnn-bahdanau"], ["lm-char-small"], ["nope"]]))
def test_config_overrides_resolve_or_name_the_field(overrides, presets):
    try:
        cfg = cfgmod.resolve(presets, overrides)
    except AttnkitError as e:
        event("error")
        check_config_error(e)
        return
    assert isinstance(cfg, cfgmod.RunConfig | cfgmod.LMRunConfig)


# --- 3. attnkit prepare ---------------------------------------------------------------------------------------------
@st.composite
def corpus_pair(draw, damaged: bool) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    """Line-aligned files of odd text; if damaged, maybe empty, mismatched, not UTF-8 or not gzip."""
    n = draw(st.integers(0 if damaged else 1, 6))
    line = st.one_of(short_line, short_line, short_line, long_line)
    src = draw(exactly(n, line))
    m = draw(st.integers(0, 7)) if damaged and draw(st.booleans()) else n
    tgt = draw(exactly(m, line))
    return tuple(draw(gz_or_plain(draw(file_bytes(lines, damaged)), damaged)) for lines in (src, tgt))


prepare_options = st.fixed_dictionaries({}, optional={
    "--vocab-size": st.sampled_from(["8", "12", "30", "100000"]),
    "--model-type": st.sampled_from(["bpe", "unigram", "char", "word"]),
    "--max-src-len": st.sampled_from(["1", "4", "256"]),
    "--max-tgt-len": st.sampled_from(["1", "256"]),
    "--separate-vocab": st.just(None),
})
bad_prepare_option = st.sampled_from([("--vocab-size", "5"), ("--vocab-size", "0"), ("--vocab-size", "-3"),
                                      ("--vocab-size", "abc"), ("--model-type", "nope"), ("--max-src-len", "0"),
                                      ("--max-tgt-len", "-1"), ("--max-src-len", "x")])


@st.composite
def prepare_case(draw) -> tuple:
    """A quarter of the cases are damaged: their files, and now and then an option, are bad."""
    damaged = draw(st.integers(0, 3)) == 0
    options = draw(prepare_options)
    if damaged and draw(st.integers(0, 3)) == 0:
        options = {**options, **dict([draw(bad_prepare_option)])}
    return draw(corpus_pair(damaged)), draw(st.one_of(st.none(), corpus_pair(damaged))), options


@fuzz(120)
@given(case=prepare_case())
def test_prepare_cli_succeeds_or_says_why(capsys, tmp_path, case):
    train, valid, options = case
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        work = Path(work)
        argv: list[object] = ["prepare", "--src", "de", "--tgt", "en", "--out", work / "data"]
        written: dict[str, bytes | None] = {}  # file -> its decompressed bytes (None: not gzip after all)
        for split, pair in (("train", train), ("valid", valid)):
            if pair is not None:
                for lang, (suffix, data) in zip(("de", "en"), pair):
                    (work / f"{split}.{lang}{suffix}").write_bytes(data)
                    written[str(work / f"{split}.{lang}{suffix}")] = decompressed(suffix, data)
                argv += [f"--{split}", work / split]
        argv += [a for k, v in options.items() for a in (k, v) if a is not None]
        argv += ["--vocab-size", "30"] if "--vocab-size" not in options else []
        code, out, err = run_cli(capsys, *argv)
        event(f"exit {code}")
        if code == 0:
            assert (work / "data" / "train.safetensors").is_file() and "kept" in out
            return
        assert code == 2, (code, err)
        if err.startswith("attnkit prepare: error: argument "):  # argparse: a non-numeric --vocab-size, a wrong
            assert err.count("\n") == 1 and err.endswith("(see `attnkit prepare --help`)\n"), err  # --model-type
            return
        assert_cli_error(err, work, "--vocab-size", "vocab_size", "--max-src-len")
        match = re.search(r"(\S+):(\d+): invalid UTF-8", err)
        if match:  # the named line really is the first bad one of that file (of what gunzips of a damaged one)
            plain = written[match[1]]
            plain = gunzipped_before_damage(Path(match[1]).read_bytes()) if plain is None else plain
            assert first_bad_line(plain) == int(match[2]), err
        assert not (work / "data").exists() or not any((work / "data").iterdir()), "a failed prepare left files"


# --- 4. attnkit translate -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translator(trained, one_thread):
    from attnkit.decode import Translator

    return Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", device="cpu")


def too_long(translator, lines: list[str]) -> list[int]:
    """1-based numbers of the lines the translator must truncate."""
    return [i for i, ids in enumerate(translator.src_tok.encode(lines), 1) if len(ids) > translator.max_src_len]


search_options = st.fixed_dictionaries({}, optional={
    "--beam": st.sampled_from(["1", "2"]),
    "--nbest": st.sampled_from(["1", "2"]),  # 2 needs --beam 2 or --sampling: a clear error otherwise
    "--format": st.sampled_from(["text", "tsv"]),
    "--print-alignment": st.just(None),
    "--alignment-layer": st.sampled_from(["-1", "0", "2", "-3"]),
    "--sampling": st.just(None),
    "--top-p": st.sampled_from(["0.9", "1"]),
    "--min-len": st.sampled_from(["0", "3"]),
    "--max-len-a": st.sampled_from(["0", "0.5"]),
    "--max-len-b": st.sampled_from(["1", "5", "-5"]),
    "--no-repeat-ngram": st.sampled_from(["0", "1", "2"]),
    "--batch-size": st.sampled_from(["1", "2", "0"]),
    "--max-tokens": st.sampled_from(["0", "5", "-1"]),
})
bad_search_option = st.sampled_from([("--beam", "0"), ("--beam", "x"), ("--top-p", "0"), ("--top-p", "1.5"),
                                     ("--min-len", "-1"), ("--max-len-a", "nan"), ("--no-repeat-ngram", "-1"),
                                     ("--alignment-layer", "7"), ("--alignment-layer", "-9"), ("--temperature", "0"),
                                     ("--format", "xml"), ("--lenpen", "inf")])


@fuzz(120)
@given(lines=lines_of(short_line, 4), long=st.integers(0, 11), damaged=st.integers(0, 3).map(lambda i: i == 0),
       options=search_options, data=st.data())
def test_translate_cli_answers_every_line_or_says_why(capsys, tmp_path, trained, translator, lines, long, damaged,
                                                      options, data):
    checkpoint = trained[1] / "checkpoints" / "last.safetensors"
    if long == 0:  # one example in twelve has an over-long line: decoding it takes a second
        lines = [*lines, data.draw(long_line)]
    if damaged and data.draw(st.booleans()):
        options = {**options, **dict([data.draw(bad_search_option)])}
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        work = Path(work)
        suffix, raw = data.draw(gz_or_plain(data.draw(file_bytes(lines, damaged)), damaged))
        src, out = work / f"input.de{suffix}", work / "out.en"
        src.write_bytes(raw)
        stdin = None if suffix else data.draw(st.sampled_from([None, "--input", "--interactive"]))
        argv: list[object] = ["translate", "--checkpoint", checkpoint, "--device", "cpu", "--output", out]
        argv += ["--input", src] if stdin is None else ["--interactive"] if stdin == "--interactive" else []
        argv += [a for k, v in options.items() for a in (k, v) if a is not None]
        prefixes = data.draw(st.one_of(st.none(), st.none(), exactly(len(lines), short_line), lines_of(short_line, 5)))
        if prefixes is not None and stdin != "--interactive":
            (work / "prefix.en").write_bytes("".join(p + "\n" for p in prefixes).encode("utf-8"))
            argv += ["--prefix-file", work / "prefix.en"]
        with mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")):
            code, stdout, err = run_cli(capsys, *argv)
        check_translate_run(code, stdout if stdin == "--interactive" else None, err, out, options,
                            "<stdin>" if stdin else src, decompressed(suffix, raw), translator)


def check_translate_run(code: int, stdout: str | None, err: str, out: Path, options: dict[str, str | None],
                        name: object, plain: bytes | None, translator) -> None:
    """Exit 0 with one output line per input line (per n-best entry; TSV adds a header), or 2 with one line
    saying why. Empty input is an error from a file and from stdin alike (not in interactive mode)."""
    event(f"exit {code}")
    assert code in (0, 2), (code, err)
    if code == 2:
        if err.startswith("attnkit translate: error:"):  # argparse rejected a value (--format x): one line too
            assert err.count("\n") == 1 and err.endswith("(see `attnkit translate --help`)\n"), err
            return
        assert_cli_error(err, name, "prefix", "--", "sampling")
        if plain == b"" and stdout is None and str(name) in err:  # (a bad option may be named before the input)
            assert err == f"attnkit: error: {name} is empty\n"
        if plain and first_bad_line(plain) and "UTF-8" in err:
            assert f"{name}:{first_bad_line(plain)}: invalid UTF-8" in err, err
        return
    assert plain or stdout is not None, "an empty input must be an error"
    text = out.read_text(encoding="utf-8") if stdout is None else stdout
    lines = (expected_lines(plain) or []) if plain else []  # a BOM alone: no line (an interactive session)
    nbest = int(options.get("--nbest") or 1)
    tsv = options.get("--format") == "tsv"
    assert text.count("\n") == nbest * len(lines) + tsv, (text, lines)
    if tsv:
        header, *rows = text.split("\n")[:-1]
        assert header.startswith("line\trank\tscore\t")
        assert [int(row.split("\t")[0]) for row in rows] == [i for i in range(1, len(lines) + 1) for _ in range(nbest)]
    for i in too_long(translator, lines):  # named by its line, in interactive mode too (one line at a time)
        assert f"attnkit: warning: input {i} has" in err and "truncated" in err, err


# --- 5. the Python API ----------------------------------------------------------------------------------------------
api_options = st.fixed_dictionaries({}, optional={
    "beam": st.integers(1, 3), "nbest": st.integers(1, 2), "sampling": st.booleans(), "top_k": st.integers(0, 5),
    "top_p": st.floats(0.05, 1), "temperature": st.floats(0.1, 3), "min_len": st.integers(0, 3),
    "max_len_a": st.one_of(st.none(), st.floats(0, 1)), "max_len_b": st.integers(-3, 6),
    "no_repeat_ngram": st.integers(0, 3), "len_penalty": st.floats(-1, 2), "len_style": st.sampled_from(
        ["length", "gnmt"]), "attention_layer": st.integers(-3, 2),
})
bad_api_option = st.sampled_from([("beam", 0), ("nbest", 0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
                                  ("temperature", 0.0), ("temperature", float("nan")), ("min_len", -1),
                                  ("no_repeat_ngram", -1), ("len_style", "other"), ("len_penalty", float("inf")),
                                  ("max_len_a", float("nan")), ("attention_layer", 3), ("attention_layer", -4)])


@st.composite
def api_case(draw) -> tuple[list[str], list[str] | None, dict]:
    """Sentences, prefixes (mostly one per sentence) and options; a quarter of the cases have one bad option."""
    sentences = draw(lines_of(st.one_of(st.text(chars, max_size=40), short_line), 5))
    prefixes = draw(st.one_of(st.none(), st.none(), exactly(len(sentences), short_line), lines_of(short_line, 5)))
    options = draw(api_options)
    if draw(st.integers(0, 3)) == 0:
        options = {**options, **dict([draw(bad_api_option)])}
    return sentences, prefixes, options


@fuzz(170)
@given(case=api_case(), need_attention=st.booleans(), batch_size=st.integers(1, 4))
def test_translator_api_returns_one_result_per_input(translator, case, need_attention, batch_size):
    sentences, prefixes, options = case
    try:
        results = translator.translate(sentences, prefixes=prefixes, batch_size=batch_size,
                                       need_attention=need_attention, **{"max_len_b": 4, **options})
    except AttnkitError as e:
        event("error")
        assert_one_line(str(e))
        return
    event("translated")
    assert prefixes is None or len(prefixes) == len(sentences)
    assert len(results) == len(sentences)
    for source, t in zip(sentences, results):
        assert t.source == source and isinstance(t.text, str)
        assert len(t.nbest) == options.get("nbest", 1) - 1
        if need_attention:
            assert len(t.alignment) == len(t.tgt_pieces)


@fuzz(10)
@given(sentences=st.lists(short_line, max_size=2), long=long_line, at=st.integers(0, 2), beam=st.integers(1, 2))
def test_over_long_inputs_are_truncated_with_a_warning(translator, sentences, long, at, beam):
    sentences = [*sentences[:at], long, *sentences[at:]]
    assume(too_long(translator, sentences))  # a run of one unknown character is one token
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = translator.translate(sentences, beam=beam)
    assert len(results) == len(sentences)
    messages = [str(w.message) for w in caught]
    for i in too_long(translator, sentences):
        assert any(m.startswith(f"input {i} has") and f"truncated to {translator.max_src_len}" in m
                   for m in messages), messages
