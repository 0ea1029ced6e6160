"""The hostile-input sweep: every verb that reads text, fed what breaks naive readers, each with its outcome written
down (docs/cli.md, "Text input", states the same rules).

HOSTILE is the table: one row per kind of input (CRLF line ends, a UTF-8 BOM, empty and whitespace-only lines, a
20,000-character line, a lone surrogate, control characters, CJK without spaces, mixed scripts, HTML- and TeX-like
text, and two that only a file can hold: UTF-16 and a BOM alone). A row holds the input as a file (`data`), what
every reader must read from it (`lines`) or the one line every verb must refuse it with (`error`), which lines must
translate to nothing (`empty`), which are truncated with a warning (`truncated`), the rule in words, and the same
input as strings (`texts`: a JSON field, `--src`, `--prompt`) with the status the service answers them with.

The verbs (the columns): prepare and train (one corpus holding every readable row; the refused rows one by one),
translate (a file, stdin, --interactive, a document, a glossary file, and the CTranslate2 engine), score, evaluate,
lm prepare / train / eval / generate, the service's routes (/translate, /explore, and a language model's /explore and
/generate), the explorer page (`plot attention --html`, drawn in Chromium for two rows) and the pictures (`plot
attention`, `plot decoding`).
"Nothing is lost": translate and score give one line per input line, and a refusal leaves no output behind (an
earlier output stays as it was).

One tiny Transformer and one tiny Transformer-XL, trained here on the hostile corpus through the CLI, serve every
test (about 30 s of CPU in all).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from attnkit.cli.main import main
from attnkit.data import read_lines, write_number_corpus
from attnkit.errors import AttnkitError
from conftest import LM_TEXT, LM_TINY, serve_extra

BOM = b"\xef\xbb\xbf"
LONG = "eins " * 4000  # 20,000 characters, about 4,000 tokens: over the model's 1,023 positions
CJK = "你好世界，今天天气很好。"
MIXED = "Ελληνικά русский العربية 日本語 drei"
HTML = "<!--<script>window.hacked = 1</script> &amp; </script>"
TEX = "drei $\\frac{$ vier $x^$"  # matplotlib would parse text between dollars as TeX math, and fail on this
CONTROL = "drei\x00 \x1b[31mvier\x1b[0m acht\x7f zw\u200bei \u202edrei"
SURROGATE_BYTES = b"zw\xed\xa0\x80ei"  # U+D800 as UTF-8 would write it, were it allowed: not UTF-8
UTF16_HINT = "UTF-16 text (it starts with a UTF-16 byte order mark); attnkit reads UTF-8: convert it, e.g. iconv -f " \
             "UTF-16 -t UTF-8"


def lf(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


@dataclass(frozen=True)
class Hostile:
    """One row of the table: an input and what every verb does with it."""

    name: str
    rule: str  # the outcome, in words (as docs/cli.md says it)
    data: bytes  # the input as a file (a source file; score and evaluate read it on both sides)
    lines: tuple[str, ...] | None = None  # what every reader reads from `data`; None: refused
    error: str = ""  # the refusal, one line; {file} is the file's name (or <stdin>)
    empty: tuple[int, ...] = ()  # 1-based lines of `data` whose translation is empty (no content to translate)
    truncated: tuple[int, ...] = ()  # 1-based lines over the model's positions: truncated, with a warning
    texts: tuple[str, ...] = ()  # the same input as strings: a JSON field, --src, --prompt
    status: int = 200  # the service's answer to each of `texts` (a language model's /explore: see LM_STATUS)


HOSTILE = [
    Hostile("crlf", "CRLF line ends read as LF: the same lines without \\r", b"drei\r\nvier\r\n\r\nzwei\r\n",
            ("drei", "vier", "", "zwei"), empty=(3,), texts=("drei\r\n",)),
    Hostile("bom", "a UTF-8 byte order mark is dropped", BOM + lf("drei", "vier"), ("drei", "vier"),
            texts=("\ufeffdrei",)),
    Hostile("blank", "empty and whitespace-only lines are kept: each translates to an empty line",
            lf("drei", "", " \t", "\u3000", "vier"), ("drei", "", " \t", "\u3000", "vier"), empty=(2, 3, 4),
            texts=("", " \t")),
    Hostile("long", "a 20,000-character line is read whole; translate and score truncate it to the model's "
                    "positions with a warning naming its line; the service refuses it (413, --max-chars)",
            lf("drei", LONG, "vier"), ("drei", LONG, "vier"), truncated=(2,), texts=(LONG,), status=413),
    Hostile("control", "control and format characters are kept as read; the tokenizer reads DEL as nothing, "
                       "U+200B as a space, NUL, ESC and U+202E as unknown pieces: a line of DEL alone translates "
                       "to an empty line",
            lf(CONTROL, "\x1b[1mzwei", "\x7f", "vier"), (CONTROL, "\x1b[1mzwei", "\x7f", "vier"), empty=(3,),
            texts=(CONTROL,)),
    Hostile("cjk", "CJK without spaces is one line like any other", lf(CJK, "drei"), (CJK, "drei"), texts=(CJK,)),
    Hostile("mixed", "mixed scripts in one line are one line", lf(MIXED), (MIXED,), texts=(MIXED,)),
    Hostile("html", "HTML-like text is text: written as is, escaped in every page", lf(HTML, "&amp; &lt;b&gt;"),
            (HTML, "&amp; &lt;b&gt;"), texts=(HTML,)),
    Hostile("tex", "TeX-like text is text: every picture draws it as written, never as math", lf(TEX, "drei"),
            (TEX, "drei"), texts=(TEX,)),
    Hostile("surrogate", "a lone surrogate cannot be UTF-8: a file holding its bytes is refused naming the file, "
                         "line and column; JSON's \\ud800 gets 422 naming the field; a command-line argument "
                         "holding its bytes is a usage error",
            b"drei\n" + SURROGATE_BYTES + b"\nvier\n", error="{file}:2: invalid UTF-8 (byte 0xed at column 3)",
            texts=("zw\ud800ei",), status=422),
    Hostile("utf16", "UTF-16 text is refused, saying how to convert it", "drei\nvier\n".encode("utf-16"),
            error="{file}: " + UTF16_HINT),
    Hostile("bom-only", "a file holding a BOM alone is empty", BOM, error="{file} is empty"),
]
READABLE = [c for c in HOSTILE if c.lines is not None]
REFUSED = [c for c in HOSTILE if c.lines is None]
TEXTS = [(c, i) for c in HOSTILE for i in range(len(c.texts))]


def ids(cases) -> list[str]:
    return [c.name if isinstance(c, Hostile) else f"{c[0].name}-{c[1]}" for c in cases]


def argv_form(text: str) -> str:
    """`text` as Python hands it over from a command line: a surrogate arrives as the bytes of its UTF-8-like
    encoding, each escaped (surrogateescape), never as itself."""
    return os.fsdecode(text.encode("utf-8", "surrogatepass"))


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refusal(case: Hostile, name: object) -> str:
    return f"attnkit: error: {case.error.format(file=name)}\n"


def warnings_of(case: Hostile, translator) -> str:
    """The truncation warnings `attnkit translate` prints for the case's lines, in order."""
    encoded = translator.src_tok.encode(list(case.lines))
    return "".join(f"attnkit: warning: input {i} has {len(encoded[i - 1])} tokens; truncated to "
                   f"{translator.max_src_len}\n" for i in case.truncated)


# --- the model and corpus every test shares -----------------------------------------------------------------------
def corpus_file(path: Path, lines: list[str], *, bom: bool, crlf: bool) -> Path:
    path.write_bytes((BOM if bom else b"") + "".join(line + ("\r\n" if crlf else "\n") for line in lines).encode())
    return path


@pytest.fixture(scope="module")
def capsys_module():
    """main() with its stdout and stderr captured, for module fixtures (capsys is per test)."""
    import contextlib

    def call(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
        return code, out.getvalue(), err.getvalue()

    return call


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, one_thread) -> dict:
    """The number corpus with every readable row's lines on both sides of train (BOM + CRLF) and valid (LF; first,
    so that the run's report shows HTML- and TeX-like text), prepared through the CLI; the long line stays out of
    valid, whose every pair is decoded at each evaluation."""
    root = tmp_path_factory.mktemp("hostile")
    numbers = write_number_corpus(root / "numbers", n_train=150, n_valid=10, n_test=10)
    hostile = [line for c in READABLE for line in c.lines]
    shown = {"html": 0, "tex": 1}  # the report draws the first few valid pairs
    first = [line for c in sorted(READABLE, key=lambda c: shown.get(c.name, 2)) for line in c.lines if line != LONG]
    files = {}
    for split, pair in (("train", numbers["train"]), ("valid", numbers["valid"])):
        for side, path in zip(("de", "en"), pair):
            lines = read_lines(path) + hostile if split == "train" else first + read_lines(path)
            files[split, side] = lines
            corpus_file(root / f"{split}.{side}", lines, bom=split == "train", crlf=split == "train")
    return {"root": root, "files": files, "hostile": hostile}


@pytest.fixture(scope="module")
def prepared(corpus, capsys_module) -> dict:
    root = corpus["root"]
    code, _, err = capsys_module(["prepare", "--src", "de", "--tgt", "en", "--train", root / "train", "--valid",
                                  root / "valid", "--vocab-size", "120", "--out", root / "data"])
    assert code == 0, err
    return {"data": root / "data"}


@pytest.fixture(scope="module")
def checkpoint(prepared, capsys_module) -> Path:
    """`attnkit train` on the hostile corpus: its BLEU evaluation decodes and scores every hostile valid line, and
    its report shows the first of them. Outputs of at most 6 tokens keep the decoding short."""
    run_dir = prepared["data"].parent / "run"
    code, out, err = capsys_module(["train", "--data", prepared["data"], "--out", run_dir, "--quiet",
                                    "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
                                    "--model.n_encoder_layers=1", "--model.n_decoder_layers=1",
                                    "--train.max_tokens=400", "--train.max_steps=2", "--train.max_len_a=0",
                                    "--train.max_len_b=6", "--train.device=cpu"])
    assert code == 0, err
    assert "bleu" in out and (run_dir / "report.html").is_file()
    return run_dir / "checkpoints" / "last.safetensors"


@pytest.fixture(scope="module")
def translator(checkpoint):
    from attnkit.decode import Translator

    return Translator.from_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def lm(corpus, capsys_module) -> dict:
    """`attnkit lm prepare` (characters) of a text holding every readable row (BOM + CRLF), and `lm train` of a
    two-step Transformer-XL on it."""
    root = corpus["root"]
    text = corpus_file(root / "lm.txt", LM_TEXT.splitlines() * 3 + [x for x in corpus["hostile"] if x != LONG],
                       bom=True, crlf=True)
    code, _, err = capsys_module(["lm", "prepare", "--train", text, "--valid-fraction", "0.2", "--out",
                                  root / "lmdata"])
    assert code == 0, err
    code, _, err = capsys_module(["lm", "train", "--config", "lm-char-small-xl", "--data", root / "lmdata",
                                  "--out", root / "xl", "--quiet", *[f"--{o}" for o in LM_TINY],
                                  "--train.eval_tgt_len=200"])  # a long prompt read in 100 pieces, not 2,500
    assert code == 0, err
    return {"data": root / "lmdata", "checkpoint": root / "xl" / "checkpoints" / "last.safetensors"}


# --- reading --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_every_reader_reads_the_same_lines_or_refuses(tmp_path, case):
    from attnkit.data.text import iter_lines

    path = tmp_path / "input.de"
    path.write_bytes(case.data)
    if case.lines is None:
        with pytest.raises(AttnkitError) as file_error:
            read_lines(path)
        assert str(file_error.value) == case.error.format(file=path)
        if case.name == "bom-only":  # a stream of a BOM alone holds no line (translate: "<stdin> is empty")
            assert list(iter_lines(io.BytesIO(case.data), "<stdin>")) == []
            return
        with pytest.raises(AttnkitError) as stream_error:
            list(iter_lines(io.BytesIO(case.data), "<stdin>"))
        assert str(stream_error.value) == case.error.format(file="<stdin>")
        return
    assert read_lines(path) == list(case.lines), case.rule
    assert list(iter_lines(io.BytesIO(case.data), "<stdin>")) == list(case.lines), case.rule


# --- prepare and train ----------------------------------------------------------------------------------------------
def test_prepare_reads_the_hostile_corpus_and_counts_what_it_drops(corpus, prepared):
    """Every readable row goes in: train drops the pairs without content (empty, blank, DEL alone) and the long
    one, valid keeps every pair as read (its references), without a \\r or a BOM."""
    data, files = prepared["data"], corpus["files"]
    report = json.loads((data / "prepare.json").read_text(encoding="utf-8"))["report"]
    hostile = corpus["hostile"]
    no_content = sum(1 for x in hostile if not x.strip() or x == "\x7f")
    assert report["train"] == {"kept": len(files["train", "de"]) - no_content - 1, "dropped_empty": no_content,
                               "dropped_too_long": 1, "tokenizer_left_out": 2}
    assert report["valid"]["kept"] == len(files["valid", "de"])
    assert read_lines(data / "valid.src.txt") == files["valid", "de"]
    assert read_lines(data / "valid.tgt.txt") == files["valid", "en"]
    kept = read_lines(data / "train.src.txt")
    assert files["train", "de"][0] == kept[0]  # the BOM is gone from the first line
    assert not any("\r" in x or "\ufeff" in x for x in kept)
    assert {CJK, MIXED, HTML, CONTROL} <= set(kept)


@pytest.mark.parametrize("case", REFUSED, ids=ids(REFUSED))
@pytest.mark.parametrize("side", ["de", "en"])
def test_prepare_refuses_in_one_line_and_writes_nothing(capsys, tmp_path, case, side):
    good = lf("drei", "vier")
    for lang in ("de", "en"):
        (tmp_path / f"train.{lang}").write_bytes(case.data if lang == side else good)
    code, out, err = run(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", tmp_path / "train",
                         "--vocab-size", "30", "--out", tmp_path / "data")
    assert (code, err) == (2, refusal(case, tmp_path / f"train.{side}"))
    assert not (tmp_path / "data").exists()


def test_train_learns_from_the_hostile_corpus_and_reports_it(checkpoint):
    """The run scored BLEU on every hostile valid line, and its report shows the first ones escaped (no text of
    the corpus opens a tag) and drawn (no text is TeX)."""
    run_dir = checkpoint.parents[1]
    report = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<!--<script>" not in report and "&lt;!--&lt;script&gt;" in report
    assert f"<h3>3. {TEX}</h3>" in report and report.count('alt="attention"') == 3  # each sample drawn
    assert "no attention image" not in (run_dir / "train.log").read_text(encoding="utf-8")


# --- translate ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def expected(translator):
    """case name -> the translation of each of its lines, as the Python API gives it for the whole file at once."""
    return {c.name: [t.text for t in translator.translate(list(c.lines))] for c in READABLE}


def check_translations(case: Hostile, outputs: list[str], wanted: list[str]) -> None:
    assert len(outputs) == len(case.lines), f"a line was lost or added; {case.rule}"
    assert outputs == wanted, case.rule
    for i in case.empty:
        assert outputs[i - 1] == "", f"line {i} has no content, yet translates to {outputs[i - 1]!r}"
    for i, out in enumerate(outputs, start=1):
        if i not in case.empty:
            assert out, f"line {i} translates to nothing"


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_a_file(capsys, tmp_path, checkpoint, translator, expected, case):
    src, out = tmp_path / "input.de", tmp_path / "out.en"
    src.write_bytes(case.data)
    code, stdout, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--input", src,
                            "--output", out)
    if case.lines is None:
        assert (code, err) == (2, refusal(case, src))
        assert not out.exists()
        out.write_text("an earlier output\n", encoding="utf-8")  # a refusal leaves it as it was
        assert run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--input", src, "--output",
                   out, "--force")[0] == 2
        assert out.read_text(encoding="utf-8") == "an earlier output\n"
        return
    assert (code, err) == (0, warnings_of(case, translator))
    written = out.read_bytes()
    assert b"\r" not in written and not written.startswith(BOM)
    check_translations(case, written.decode("utf-8").split("\n")[:-1], expected[case.name])


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_a_document(capsys, tmp_path, checkpoint, translator, case):
    """--document reads a file as every verb does (or refuses it in the same line) and gives back its lines: each
    the translation of its sentences, an empty line empty."""
    from attnkit.decode import translate_document

    src, out = tmp_path / "input.de", tmp_path / "out.en"
    src.write_bytes(case.data)
    code, _, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--input", src,
                       "--output", out, "--document")
    if case.lines is None:
        assert (code, err) == (2, refusal(case, src)) and not out.exists()
        return
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert written == translate_document(translator, "\n".join(case.lines)) + "\n"
    lines = written.split("\n")[:-1]
    assert len(lines) == len(case.lines), f"a line was lost or added; {case.rule}"
    assert all(lines[i - 1].strip() == "" for i in case.empty)


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_with_a_glossary(capsys, tmp_path, checkpoint, translator, case):
    """A glossary file is read as every verb reads text, or refused in the same line and nothing written; with each
    of the case's lines as a source term (CRLF line ends), every term is in its line's translation or named on stderr
    with the reason, and the CLI answers as the Python API does."""
    from attnkit.data.glossary import Glossary

    src, terms, out = tmp_path / "input.de", tmp_path / "terms.tsv", tmp_path / "out.en"
    src.write_bytes(lf("drei") if case.lines is None else lf(*case.lines))
    if case.lines is None:  # the glossary is the file that breaks
        terms.write_bytes(case.data)
        code, _, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--input", src,
                           "--output", out, "--glossary", terms)
        assert (code, err) == (2, refusal(case, terms)) and not out.exists()
        return
    entries = [line.strip() for line in case.lines if line.strip()]
    terms.write_bytes(BOM + "".join(f"{e}\tthree\r\n" for e in entries).encode("utf-8"))
    code, _, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--input", src,
                       "--output", out, "--glossary", terms, "--beam", "2")
    assert code == 0, err
    glossary = Glossary.read(terms)
    assert [t.source for t in glossary.terms] == entries and {t.target for t in glossary.terms} <= {"three"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncations and unplaced terms: the CLI's stderr is checked below
        got = translator.translate(list(case.lines), beam=2, glossary=glossary)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == [t.text for t in got]
    uses = [(i, u, t.text) for i, t in enumerate(got, start=1) for u in t.terms]
    assert len(uses) >= len(entries)  # each line holds its own term at least
    for i, use, text in uses:
        if use.placed:
            assert "three" in text
        else:
            assert f"attnkit: warning: input {i}: the glossary term {use.source!r} -> 'three' is not in the " \
                   f"translation ({use.note})" in err


@pytest.fixture(scope="module")
def exported(checkpoint, capsys_module) -> Path:
    pytest.importorskip("ctranslate2")
    out = checkpoint.parents[2] / "ct2"
    code, _, err = capsys_module(["export", "--format", "ctranslate2", "--checkpoint", checkpoint, "--out", out])
    assert code == 0, err
    return out


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_with_ctranslate2_reads_as_attnkit_does(capsys, tmp_path, exported, translator, expected, case):
    """The other engine reads the file by the same rules and answers a line without content with an empty line."""
    src = tmp_path / "input.de"
    src.write_bytes(case.data)
    code, stdout, err = run(capsys, "translate", "--engine", "ctranslate2", "--checkpoint", exported, "--input", src)
    if case.lines is None:
        assert (code, stdout, err) == (2, "", refusal(case, src))
        return
    assert (code, err) == (0, warnings_of(case, translator))
    check_translations(case, stdout.split("\n")[:-1], expected[case.name])


def test_loading_an_export_keeps_torch_threads(exported):
    """Found by the sweep: loading a CTranslate2 model set OpenMP's thread count, which is torch's too, so torch's
    work after it ran on every core (on a busy machine ten times slower) whatever its caller had chosen."""
    import torch

    from attnkit.formats import CT2Translator

    assert torch.get_num_threads() == 1  # one_thread
    CT2Translator.from_dir(exported, device="cpu")
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_stdin(capsys, checkpoint, translator, expected, case):
    with mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(case.data), encoding="utf-8")):
        code, stdout, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu")
    if case.lines is None:
        assert (code, stdout, err) == (2, "", refusal(case, "<stdin>"))
        return
    assert (code, err) == (0, warnings_of(case, translator))
    check_translations(case, stdout.split("\n")[:-1], expected[case.name])


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_translate_interactive(capsys, checkpoint, translator, case):
    """Each line answered as it comes, as the API answers it alone; a bad line ends the session naming it, after
    the lines before it were answered."""
    with mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(case.data), encoding="utf-8")):
        code, stdout, err = run(capsys, "translate", "--checkpoint", checkpoint, "--device", "cpu", "--interactive")
    answered = stdout.split("\n")[:-1]
    if case.name == "bom-only":  # no line: nothing to answer (an empty session is no mistake)
        assert (code, stdout, err) == (0, "", "")
        return
    if case.lines is None:
        assert (code, err) == (2, refusal(case, "<stdin>"))
        good = case.data.split(b"\n")[: int(m[1]) - 1] if (m := re.search(r":(\d+): ", case.error)) else []
        assert answered == [translator.translate([x.decode()])[0].text for x in good]
        return
    assert (code, err) == (0, warnings_of(case, translator))
    check_translations(case, answered, [translator.translate([x])[0].text for x in case.lines])


# --- score and evaluate ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_score_gives_one_score_per_line_pair(capsys, tmp_path, checkpoint, translator, case):
    src, tgt = tmp_path / "s.de", tmp_path / "s.en"
    src.write_bytes(case.data)
    tgt.write_bytes(lf(*case.lines) if case.lines is not None else lf("drei", "vier"))
    code, stdout, err = run(capsys, "score", "--checkpoint", checkpoint, "--device", "cpu", "--src", src,
                            "--tgt", tgt)
    if case.lines is None:
        assert (code, stdout, err) == (2, "", refusal(case, src))
        return
    assert (code, err) == (0, warnings_of(case, translator))
    scores = stdout.split("\n")[:-1]
    assert len(scores) == len(case.lines)
    assert scores == [f"{x:.4f}" for x in translator.score(list(case.lines), list(case.lines))]
    assert all(math.isfinite(float(x)) and float(x) < 0 for x in scores)


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_evaluate_reads_hypotheses_as_every_verb_does(capsys, tmp_path, case):
    """The file beside the same lines written plainly: every line matches (chrF 100, exact match 100%), so no BOM
    or \\r stayed behind."""
    hyp, ref = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp.write_bytes(case.data)
    ref.write_bytes(lf(*case.lines) if case.lines is not None else lf("drei", "vier"))
    code, stdout, err = run(capsys, "evaluate", "--hyp", hyp, "--ref", ref)
    if case.lines is None:
        assert (code, stdout, err) == (2, "", refusal(case, hyp))
        return
    assert (code, err) == (0, "")
    assert ", chrF2 100.00, exact match 100.0%\n" in stdout.split("\n")[0] + "\n", stdout  # BLEU: no 4-grams


def test_evaluate_refuses_files_of_other_lengths(capsys, tmp_path):
    """A lost line would pair every later hypothesis with the wrong reference: refused, naming both files."""
    hyp, ref = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp.write_bytes(lf("three", "four"))
    ref.write_bytes(lf("three", "", "four"))
    code, stdout, err = run(capsys, "evaluate", "--hyp", hyp, "--ref", ref)
    assert (code, stdout) == (2, "")
    assert err == f"attnkit: error: parallel files differ in length: {hyp} has 2 lines, {ref} has 3\n"


# --- language models ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_lm_prepare_reads_the_same_lines(capsys, tmp_path, case):
    from attnkit.data.lm import load_lm_corpus

    text = tmp_path / "text.txt"
    text.write_bytes(case.data)
    code, _, err = run(capsys, "lm", "prepare", "--train", text, "--out", tmp_path / "data")
    if case.lines is None:
        assert (code, err) == (2, refusal(case, text))
        assert not (tmp_path / "data").exists()
        return
    assert code == 0, err
    corpus = load_lm_corpus(tmp_path / "data")
    assert set(corpus.vocab.tokens) == {"<unk>", "\n", *"".join(case.lines)}  # no \r, no BOM
    assert corpus.vocab.decode(corpus.splits["train"].tolist()) == "".join(x + "\n" for x in case.lines)


def test_lm_eval_scores_the_hostile_corpus(capsys, lm):
    code, out, err = run(capsys, "lm", "eval", "--checkpoint", lm["checkpoint"], "--data", lm["data"], "--device",
                         "cpu")
    assert (code, err) == (0, "")
    assert math.isfinite(float(re.search(r"ppl (\S+)", out)[1].replace(",", "")))


@pytest.mark.parametrize("case, i", TEXTS, ids=ids(TEXTS))
def test_lm_generate_continues_any_prompt(capsys, lm, case, i):
    """The prompt is printed as given, then the continuation; a prompt that is not UTF-8 is a usage error."""
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.decode.lm import sample_text

    prompt = case.texts[i]
    code, out, err = run(capsys, "lm", "generate", "--checkpoint", lm["checkpoint"], "--device", "cpu", "--prompt",
                         argv_form(prompt), "--length", "5")
    if case.name == "surrogate":
        assert (code, out) == (2, "")
        assert err == ("attnkit lm generate: error: argument --prompt: invalid UTF-8 (byte 0xed at column 3) (see "
                       "`attnkit lm generate --help`)\n")
        return
    assert (code, err) == (0, "")
    continuation = sample_text(*load_lm_checkpoint(lm["checkpoint"], "cpu"), prompt, 5)
    assert out == prompt + continuation + "\n"


# --- the service ----------------------------------------------------------------------------------------------------
LM_STATUS = {"": 422}  # a language model's /explore needs text to read (its /generate starts a line)
LIMITS = dict(max_chars=1000)  # the defaults of `attnkit serve`


@pytest.fixture(scope="module")
def service(translator):
    httpx = serve_extra()
    from attnkit.serve import create_app
    from serving import running

    with running(create_app(translator, batch_wait_ms=0, **LIMITS)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def lm_service(lm):
    httpx = serve_extra()
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.serve.lm_app import create_lm_app
    from serving import running

    with running(create_lm_app(*load_lm_checkpoint(lm["checkpoint"], "cpu"), **LIMITS)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield client


def post(client, route: str, body: dict):
    """JSON with every non-ASCII character escaped, so that a lone surrogate travels as JSON allows ("\\ud800")."""
    return client.post(route, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def service_error(case: Hostile, field: str) -> str:
    text = case.texts[0]
    if case.status == 413:
        return f"field '{field}' has {len(text)} characters; the limit is {LIMITS['max_chars']}"
    return f"field '{field}': not valid Unicode (a lone surrogate at character 3)"


@pytest.mark.parametrize("case, i", TEXTS, ids=ids(TEXTS))
def test_service_translates_any_text(service, translator, case, i):
    """/translate and /explore answer a text as `attnkit translate` answers that line (sent as is: a \\r\\n or a
    BOM inside a JSON string is the tokenizer's to read), or refuse it with one line naming the field."""
    from attnkit.serve.schema import Limits, TranslateRequest

    text = case.texts[i]
    r, page = post(service, "/translate", {"text": text}), post(service, "/explore", {"text": text})
    if case.status != 200:
        assert (r.status_code, r.json()) == (case.status, {"error": service_error(case, "text")})
        assert (page.status_code, page.json()) == (case.status, {"error": service_error(case, "text")})
        return
    options = TranslateRequest(text=text).options(Limits(**LIMITS))
    wanted = translator.translate([text], options)[0].text
    assert r.status_code == 200 and r.json()["translations"][0]["text"] == wanted
    assert page.status_code == 200
    item = page.json()["items"][0]
    assert item["source"] == text and item["hypotheses"][0]["text"] == wanted
    assert (wanted == "") == (not text.strip())


@pytest.mark.parametrize("case, i", TEXTS, ids=ids(TEXTS))
def test_language_model_service_reads_and_continues_any_text(lm_service, lm, case, i):
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.decode.lm import sample_text
    from serving import events

    text = case.texts[i]
    page = post(lm_service, "/explore", {"text": text})
    status = LM_STATUS.get(text, case.status)
    if status == 200:
        assert page.status_code == 200, page.text
        assert page.json()["items"][0]["hypotheses"][0]["kinds"]
    elif text == "":
        assert (page.status_code, page.json()) == (422, {"error": "the text is empty: a language model needs some "
                                                                  "text to read"})
    else:
        assert (page.status_code, page.json()) == (status, {"error": service_error(case, "text")})
    with lm_service.stream("POST", "/generate", content=json.dumps({"prompt": text, "length": 5}).encode(),
                           headers={"content-type": "application/json"}) as r:
        if case.status != 200:
            r.read()
            assert (r.status_code, r.json()) == (case.status, {"error": service_error(case, "prompt")})
            return
        got = events(r)
    assert [name for name, _ in got] == ["token"] * 5 + ["done"]
    assert got[-1][1]["text"] == sample_text(*load_lm_checkpoint(lm["checkpoint"], "cpu"), text, 5)


# --- the explorer page ----------------------------------------------------------------------------------------------
def page_data(path: Path) -> dict:
    page = path.read_text(encoding="utf-8")
    start = page.index('id="explorer-data">') + len('id="explorer-data">')
    raw = page[start:page.index("</script>", start)]
    assert not set("<>&") & set(raw), "page text in the data element unescaped"
    return json.loads(raw)


EXPLORER_TEXTS = [(c, i) for c, i in TEXTS if c.name != "long"]  # the service caps a text at --max-chars


@pytest.mark.parametrize("case, i", EXPLORER_TEXTS, ids=ids(EXPLORER_TEXTS))
@pytest.mark.parametrize("model", ["translation", "lm"])
def test_plot_attention_html_shows_any_sentence(capsys, tmp_path, checkpoint, lm, case, i, model):
    text = case.texts[i]
    out = tmp_path / "page.html"
    ckpt = checkpoint if model == "translation" else lm["checkpoint"]
    code, stdout, err = run(capsys, "plot", "attention", "--checkpoint", ckpt, "--src", argv_form(text), "--html",
                            "--out", out)
    if case.name == "surrogate":
        assert (code, err) == (2, "attnkit plot attention: error: argument --src: invalid UTF-8 (byte 0xed at column "
                                  "3) (see `attnkit plot attention --help`)\n")
        assert not out.exists()
        return
    if model == "lm" and text == "":
        assert (code, err) == (2, "attnkit: error: the text is empty: a language model needs some text to read\n")
        assert not out.exists()
        return
    assert (code, err) == (0, "")
    item = page_data(out)["items"][0]
    if model == "translation":
        assert item["source"] == text
    assert item["hypotheses"][0]["kinds"]


PICTURES = [("attention", "translation", "cross"), ("attention", "lm", "self"), ("decoding", "translation", None)]


@pytest.mark.parametrize("case, i", EXPLORER_TEXTS, ids=ids(EXPLORER_TEXTS))
@pytest.mark.parametrize("what, model, kind", PICTURES, ids=["attention", "lm-attention", "decoding"])
def test_pictures_draw_any_sentence_as_written(capsys, tmp_path, checkpoint, lm, case, i, what, model, kind):
    """A PNG of any sentence: its text in the title and its tokens on the axes, as written (no TeX)."""
    text = case.texts[i]
    out = tmp_path / "picture.png"
    argv = ["plot", what, "--checkpoint", checkpoint if model == "translation" else lm["checkpoint"],
            "--src", argv_form(text), "--out", out, *(["--kind", kind, "--layer", "-1"] if kind else [])]
    code, stdout, err = run(capsys, *argv)
    if case.name == "surrogate":
        assert (code, err) == (2, f"attnkit plot {what}: error: argument --src: invalid UTF-8 (byte 0xed at column 3) "
                                  f"(see `attnkit plot {what} --help`)\n")
        return
    if model == "lm" and text == "":
        assert (code, err) == (2, "attnkit: error: the text is empty: a language model needs some text to read\n")
        return
    assert code == 0, err
    assert out.read_bytes().startswith(b"\x89PNG")
    if what == "attention" and model == "translation":
        assert stdout.startswith(f"source: {text}\noutput: ")


def test_a_c_locale_reads_and_prints_utf8(lm):
    """Under a C locale without UTF-8 mode Python reads the command line and writes stdout as ASCII: attnkit still
    reads a prompt as UTF-8 and prints it, as it reads and writes files."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    r = subprocess.run([sys.executable, "-m", "attnkit", "lm", "generate", "--checkpoint", str(lm["checkpoint"]),
                        "--device", "cpu", "--prompt", CJK, "--length", "3"], env=env, capture_output=True,
                       timeout=300)
    assert (r.returncode, r.stderr) == (0, b"")
    assert r.stdout.decode("utf-8").startswith(CJK)


@pytest.mark.parametrize("case", HOSTILE, ids=ids(HOSTILE))
def test_plot_attention_html_reads_a_source_file_as_every_verb_does(capsys, tmp_path, checkpoint, case):
    src, out = tmp_path / "input.de", tmp_path / "page.html"
    src.write_bytes(case.data.replace(LONG.encode(), b"eins"))  # a page of 1,023 x 1,023 weights would be slow
    code, _, err = run(capsys, "plot", "attention", "--checkpoint", checkpoint, "--src-file", src, "--html", "--out",
                       out)
    if case.lines is None:
        assert (code, err) == (2, refusal(case, src))
        assert not out.exists()
        return
    assert (code, err) == (0, "")
    assert [item["source"] for item in page_data(out)["items"]] == [x.replace(LONG, "eins") for x in case.lines]


BROWSER_CASES = [c for c in HOSTILE if c.name in ("control", "mixed")]  # HTML-like text: test_browser_hostile.py


@pytest.mark.parametrize("case", BROWSER_CASES, ids=ids(BROWSER_CASES))
def test_the_page_renders_in_a_browser(tmp_path, checkpoint, case):
    from browser import Explorer, chromium, missing

    class OfflinePage(Explorer):  # the written page opened from its file (no server), as test_browser_hostile.py
        def __init__(self, driver, path):
            self.driver = driver
            driver.get(path.as_uri())
            self.wait(lambda d: d.execute_script("return document.body.dataset.state") == "ready", timeout=20)

    if missing():
        pytest.skip(f"no browser: missing {missing()}")
    out = tmp_path / "page.html"
    assert main(["plot", "attention", "--checkpoint", str(checkpoint), "--src", case.texts[0], "--html", "--out",
                 str(out)]) == 0
    hyp = page_data(out)["items"][0]["hypotheses"][0]
    driver = chromium()
    try:
        page = OfflinePage(driver, out)
        assert page.el("source").get_attribute("textContent") == case.texts[0]
        assert page.el("output").get_attribute("textContent") == hyp["text"]
        page.select("kind", "cross")
        assert [t for t, _ in page.tokens("right")] == hyp["kinds"]["cross"]["keys"]
        assert page.js("return document.body.dataset.state") == "ready"
    finally:
        driver.quit()


# --- an interrupted `prepare --force` -----------------------------------------------------------------------------
def test_an_interrupted_prepare_force_leaves_the_old_folder_untouched(capsys, tmp_path, monkeypatch):
    """Ctrl-C half-way through `prepare --force` (the new training split and tokenizer written, the dev split
    being saved): the folder prepared before is byte for byte as it was, and nothing of the new one is left beside
    it. A rerun without the interruption then replaces it."""
    import attnkit.data.dataset as dataset

    files = write_number_corpus(tmp_path / "text", n_train=300, n_valid=20, n_test=20)
    prefix = {name: str(paths[0].with_suffix("")) for name, paths in files.items()}
    out = tmp_path / "data"
    argv = ["prepare", "--src", "de", "--tgt", "en", "--train", prefix["train"], "--valid", prefix["valid"],
            "--test", prefix["test"], "--out", out, "--force"]
    assert run(capsys, *argv, "--vocab-size", "60")[0] == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def interrupted(self, path):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(dataset.EncodedSplit, "save", interrupted)
        assert run(capsys, *argv, "--vocab-size", "80", "--separate-vocab") == (130, "", "attnkit: interrupted\n")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["data", "text"]
    assert run(capsys, *argv, "--vocab-size", "80", "--separate-vocab")[0] == 0
    assert {f.name for f in out.iterdir()} == set(before) - {"tokenizer.model"} | {"src.model", "tgt.model"}


# --- hostile resumes: another recipe, another tokenizer, other training data ----------------------------------------
RESUME_TINY = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_encoder_layers=1",
               "--model.n_decoder_layers=1", "--train.device=cpu", "--train.max_tokens=300"]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def prepare_numbers(capsys, text: Path, data: Path, *more: object, shout: bool = False) -> None:
    """The number corpus prepared into `data`; `shout`: the German in capitals (other pieces, the same size)."""
    files = write_number_corpus(text, n_train=300, n_valid=20, n_test=20)
    if shout:
        for de, _ in files.values():
            de.write_text(de.read_text(encoding="utf-8").upper(), encoding="utf-8")
    code, _, err = run(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", files["train"][0].with_suffix(""),
                       "--valid", files["valid"][0].with_suffix(""), "--vocab-size", "90", "--out", data, *more)
    assert code == 0, err


HOSTILE_RESUMES = {  # name -> (what is done to the data folder, the resume's extra arguments, what the refusal says)
    "another preset": (None, ["--config", "transformer-small", *RESUME_TINY[:5]], "--change-recipe"),
    "another batch": (None, ["--train.max_tokens=600"], "train.max_tokens 300 -> 600"),
    "another tokenizer": (dict(shout=True), [], "other tokenizers"),
    "other training pairs": ("halve", [], "other data"),  # the same tokenizer, half the training pairs
}


def halve_the_training_split(data: Path) -> None:
    from attnkit.data import EncodedSplit, load_split

    split = load_split(data, "train")
    half = [split.pair(i) for i in range(len(split) // 2)]
    EncodedSplit.from_pairs([s.tolist() for s, _ in half], [t.tolist() for _, t in half]).save(
        data / "train.safetensors")


@pytest.mark.parametrize("case", HOSTILE_RESUMES, ids=list(HOSTILE_RESUMES))
def test_a_hostile_resume_is_refused_in_one_line_and_leaves_the_run_as_it_was(capsys, tmp_path, case):
    """Every way a resume could silently change what a run means is refused before anything is written: the
    run folder (checkpoints, config.yaml, logs) is byte for byte what it was (tests/test_resume.py checks each rule)."""
    data, out = tmp_path / "data", tmp_path / "run"
    prepare_numbers(capsys, tmp_path / "text", data)
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--quiet", "--train.max_steps=2", *RESUME_TINY)
    assert code == 0, err
    before = folder_bytes(out)
    again, extra, said = HOSTILE_RESUMES[case]
    if again == "halve":
        halve_the_training_split(data)
    elif again is not None:
        prepare_numbers(capsys, tmp_path / "text2", data, "--force", **again)
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--quiet", "--resume", "--train.max_steps=4",
                       *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
    assert folder_bytes(out) == before
