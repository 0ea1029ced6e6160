"""Messages in the user's terms: the truncation warning as docs/cli.md shows it (one line on stderr, the input's line
number in the file or stream, not its place in one call), and `prepare`'s report of the lines tokenizer training
left out for being over sentencepiece's max_sentence_length."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.data.tokenizer import MAX_SENTENCE_BYTES, SubwordTokenizer
from attnkit.decode import Translator
from attnkit.models.transformer import Transformer
from conftest import tiny_model_config, tiny_run_config

WORDS = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn"]
LONG = " ".join(WORDS * 2)  # 20 words: more tokens than a model of 8 positions reads


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Transformer of 8 positions (sources of at most 7 tokens) and its tokenizer."""
    tok = SubwordTokenizer.train([" ".join(WORDS[i:] + WORDS[:i]) for i in range(10)], 40)
    torch.manual_seed(0)
    model = tiny_model_config(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, max_positions=8)
    cfg = cfgmod.replace(tiny_run_config(), model=model)
    path = tmp_path_factory.mktemp("truncation") / "model.safetensors"
    blob = tok.to_bytes()
    save_checkpoint(path, Checkpoint("transformer", cfg, Transformer(model).state_dict(), {"src": blob, "tgt": blob}))
    return path, len(tok.encode([LONG])[0])


def translate(capsys, checkpoint, *argv) -> tuple[list[str], str]:
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(checkpoint), "--device", "cpu", "--max-len-b", "2",
                 *map(str, argv)]) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


def test_the_cli_warns_in_one_line_naming_the_input_line(tmp_path, checkpoint):
    """In a process of its own: as a user sees it, without pytest's capture of warnings."""
    path, n = checkpoint
    src = tmp_path / "in.de"
    src.write_text(f"eins\nzwei\n{LONG}\ndrei\n", encoding="utf-8")
    out = tmp_path / "out.en"
    run = subprocess.run([sys.executable, "-m", "attnkit", "translate", "--checkpoint", str(path), "--device", "cpu",
                          "--max-len-b", "2", "--input", str(src), "--output", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr == f"attnkit: warning: input 3 has {n} tokens; truncated to 7\n"  # as docs/cli.md shows it
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4


def test_interactive_translation_counts_the_lines_of_the_stream(capsys, monkeypatch, checkpoint):
    path, n = checkpoint
    monkeypatch.setattr("sys.stdin", io.StringIO(f"eins\n{LONG}\nzwei\n{LONG}\n"))
    lines, err = translate(capsys, path, "--interactive")
    assert len(lines) == 4
    assert err.splitlines() == [f"attnkit: warning: input {i} has {n} tokens; truncated to 7" for i in (2, 4)]


def test_the_python_api_warns_with_the_callers_numbering(checkpoint):
    path, n = checkpoint
    translator = Translator.from_checkpoint(path, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        translator.translate(["eins", LONG], max_len_b=2)
        translator.translate([LONG], max_len_b=2, number_from=41)  # line 41 of the caller's file
    assert [str(w.message) for w in caught] == [f"input 2 has {n} tokens; truncated to 7",
                                                f"input 41 has {n} tokens; truncated to 7"]
    assert all(w.filename == __file__ for w in caught)  # pointing at the caller's line, not attnkit's


def test_prepare_reports_the_lines_tokenizer_training_left_out(capsys, tmp_path):
    pairs = [(" ".join(WORDS[i:] + WORDS[:i]), " ".join(WORDS[:i])) for i in range(10)] * 3
    huge = " ".join(["einhundertsiebenundzwanzig"] * 200)  # 5,399 bytes: over sentencepiece's limit
    assert len(huge.encode()) > MAX_SENTENCE_BYTES
    pairs += [(huge, "one"), ("zwei", huge), (huge, huge)]
    for side, lang in enumerate(("de", "en")):
        (tmp_path / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
        (tmp_path / f"valid.{lang}").write_text(f"{huge}\neins\n", encoding="utf-8")  # only train teaches it
    capsys.readouterr()
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", tmp_path / "train", "--valid",
                 tmp_path / "valid", "--vocab-size", "60", "--out", tmp_path / "data"]) == 0
    out = capsys.readouterr().out
    assert ("; tokenizer training left out 4 line(s) over 4,192 bytes (sentencepiece's max_sentence_length)"
            in next(line for line in out.splitlines() if line.startswith("train:"))), out
    report = json.loads((tmp_path / "data" / "prepare.json").read_text())["report"]
    assert report["train"]["tokenizer_left_out"] == 4 and report["valid"]["tokenizer_left_out"] == 0
