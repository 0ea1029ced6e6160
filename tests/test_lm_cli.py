"""`attnkit lm` end to end on a tiny text file, LM corpora, resumption, and the speed table."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.bench.lm_speed import format_speed_table, speed_table
from attnkit.cli.main import main
from attnkit.data.lm import EOS, UNK, LMVocab, load_lm_corpus, prepare_lm
from attnkit.train.lm_trainer import LMTrainer
from conftest import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")


TEXT = "".join(f"{who}: the {what} is {how}.\n" for who in ("ANNA", "BEN", "CARL") for what in ("cat", "sea", "king")
               for how in ("here", "gone", "old", "new"))
TINY = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_layers=2", "--train.tgt_len=8",
        "--train.mem_len=8", "--train.batch_size=4", "--train.eval_batch_size=2", "--train.device=cpu",
        "--train.eval_interval=3", "--train.log_every=1", "--train.schedule=inverse_sqrt", "--train.warmup=2",
        "--train.lr=0.01"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lmtext") / "tiny.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(TEXT * 3)
    return path


@pytest.fixture(scope="module")
def char_data(tmp_path_factory, text_file) -> Path:
    out = tmp_path_factory.mktemp("lmdata") / "char"
    assert main(["lm", "prepare", "--train", text_file, "--valid-fraction", "0.1", "--level", "char",
                 "--out", out]) == 0
    return out


def test_prepare_char_and_word_levels(tmp_path, text_file, char_data):
    corpus = load_lm_corpus(char_data)
    n = len(TEXT) * 3
    assert corpus.splits["train"].numel() == int(n * 0.9) and corpus.splits["valid"].numel() == n - int(n * 0.9)
    full = corpus.vocab.decode(torch.cat([corpus.splits["train"], corpus.splits["valid"]]).tolist())
    assert full == TEXT * 3  # the 90/10 cut loses and reorders nothing
    word = prepare_lm(tmp_path / "word", text_file, test=text_file, level="word", valid_fraction=0.25)
    lines = (TEXT * 3).splitlines()
    cut = int(len(lines) * 0.75)
    assert word.vocab.tokens[:2] == [UNK, EOS]
    assert word.splits["train"].numel() == sum(len(line.split()) + 1 for line in lines[:cut])
    assert word.vocab.decode(word.splits["test"][:6].tolist()) == "ANNA: the cat is here.\n"
    sub = prepare_lm(tmp_path / "sub", text_file, level="subword", vocab_size=40, valid_fraction=0.25)
    assert LMVocab.from_bytes(sub.vocab.to_bytes()).decode(sub.splits["train"].tolist()) == "".join(
        line + "\n" for line in lines[:cut])
    vocab = LMVocab.from_bytes(word.vocab.to_bytes())
    assert vocab.encode(["ANNA: the dog"]).tolist() == [vocab.index["ANNA:"], vocab.index["the"], 0, 1]


def test_lm_verbs_end_to_end(capsys, tmp_path, char_data):
    run_dir = tmp_path / "xl"
    code, out, err = run(capsys, "lm", "train", "--data", char_data, "--out", run_dir, "--quiet",
                         "--config", "lm-char-small-xl", "--train.max_steps=6", *TINY)
    assert code == 0, err
    assert "loss" in out and (run_dir / "checkpoints" / "best.safetensors").exists()
    assert "kind: transformer-xl" in (run_dir / "config.yaml").read_text()
    ckpt = run_dir / "checkpoints" / "last.safetensors"
    code, out, err = run(capsys, "lm", "eval", "--checkpoint", ckpt, "--data", char_data, "--mem-len", "16",
                         "--device", "cpu")
    assert code == 0, err
    assert "mem_len 16" in out and "bpc" in out and "tok/s" in out
    code, out, err = run(capsys, "lm", "generate", "--checkpoint", ckpt, "--prompt", "ANNA:", "--length", "20",
                         "--top-k", "5", "--device", "cpu")
    assert code == 0, err
    assert out.startswith("ANNA:") and len(out.rstrip("\n")) >= len("ANNA:") + 1
    # --resume without --config continues with the run's own config (plus overrides)
    code, _, err = run(capsys, "lm", "train", "--data", char_data, "--out", run_dir, "--quiet", "--resume",
                       "--train.max_steps=8")
    assert code == 0, err
    assert "starting at step 0" in (run_dir / "train.log").read_text()
    assert "resuming at step 6" in (run_dir / "train.log").read_text()
    assert "d_model: 16" in (run_dir / "config.yaml").read_text()
    # a run folder is never overwritten by accident
    code, _, err = run(capsys, "lm", "train", "--data", char_data, "--out", run_dir, "--quiet",
                       "--config", "lm-char-small-xl", *TINY)
    assert code == 2 and "--resume" in err


def test_vanilla_eval_with_sliding_window(capsys, tmp_path, char_data):
    run_dir = tmp_path / "vanilla"
    code, _, err = run(capsys, "lm", "train", "--data", char_data, "--out", run_dir, "--quiet",
                       "--config", "lm-char-small-vanilla", "--train.max_steps=3", "--train.max_minutes=0", *TINY)
    assert code == 0, err
    code, out, err = run(capsys, "lm", "eval", "--checkpoint", run_dir / "checkpoints" / "last.safetensors",
                         "--data", char_data, "--sliding-window", "8", "--max-tokens", "40", "--device", "cpu")
    assert code == 0, err
    assert "vanilla-lm" in out and "sliding window of 8" in out and "40 tokens" in out


def test_the_default_preset_trains_an_lstm_and_eval_adds_a_cache_chosen_on_valid(capsys, tmp_path, char_data):
    run_dir = tmp_path / "lstm"
    code, out, err = run(capsys, "lm", "train", "--data", char_data, "--out", run_dir, "--quiet",
                         "--train.max_minutes=0", "--train.horizon=steps", "--train.max_steps=4",
                         *(o for o in TINY if "n_heads" not in o and "d_ff" not in o))
    assert code == 0, err
    assert "kind: lstm-lm" in (run_dir / "config.yaml").read_text()
    ckpt = run_dir / "checkpoints" / "last.safetensors"
    code, out, err = run(capsys, "lm", "eval", "--checkpoint", ckpt, "--data", char_data, "--cache", "16",
                         "--device", "cpu")
    assert code == 0, err
    static, cached = out.strip().splitlines()
    assert "lstm-lm on valid, segments of" in static and "with a cache of 16 states" in cached
    assert "chosen on valid" in cached
    code, _, err = run(capsys, "lm", "eval", "--checkpoint", ckpt, "--data", char_data, "--cache", "16",
                       "--cache-theta", "0.1")
    assert code == 2 and "--cache-lambda" in err


def test_bad_input_is_one_line(capsys, tmp_path, char_data):
    code, _, err = run(capsys, "lm", "train", "--data", tmp_path / "nothing", "--out", tmp_path / "r",
                       "--config", "lm-char-small-xl", *TINY)
    assert code == 2 and err.startswith("attnkit: error:") and "lm prepare" in err
    code, _, err = run(capsys, "lm", "train", "--data", char_data, "--out", tmp_path / "r", "--model.kind=lstm")
    assert code == 2 and "model.kind" in err


@pytest.mark.parametrize("kind", ["vanilla-lm", "transformer-xl"])
def test_resume_gives_the_same_parameters_as_training_straight(tmp_path, char_data, kind):
    """Vanilla: resumed mid-pass. XL: resumed at a pass boundary (the memory restarts empty, by design)."""
    data = load_lm_corpus(char_data)
    segments = -(-(data.splits["train"].numel() // 16 - 1) // 32)  # a pass: segments per stream at B 16, T 32
    half = segments if kind == "transformer-xl" else 3
    overrides = [o.removeprefix("--") for o in TINY] + [f"model.kind={kind}", f"train.max_steps={2 * half}",
                                                        "train.eval_interval=1000", "model.dropout=0.1",
                                                        "train.batch_size=16", "train.tgt_len=32"]
    cfg = cfgmod.resolve([], overrides, cls=cfgmod.LMRunConfig)
    straight = LMTrainer(cfg, char_data, tmp_path / "straight", progress=False)
    straight.fit()
    first = LMTrainer(cfgmod.replace(cfg, train=cfgmod.replace(cfg.train, max_steps=half)), char_data,
                      tmp_path / "resumed", progress=False)
    first.fit()
    assert first.state.step == half
    resumed = LMTrainer(cfg, char_data, tmp_path / "resumed", resume=True, progress=False)
    assert resumed.state.step == half and resumed.mems is None
    resumed.fit()
    assert resumed.state.step == straight.state.step == 2 * half
    assert kind == "vanilla-lm" or (resumed.state.epoch == 2 and half >= 3)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_speed_table_and_verb(capsys):
    cfg = cfgmod.TransformerXLConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1)
    rows = speed_table(cfg, (8, 16), runs=1)
    assert [(r.attn_len, r.segment, r.memory) for r in rows] == [(8, 2, 6), (16, 4, 12)]
    assert all(r.vanilla_ms > 0 and r.xl_ms > 0 and r.ratio == r.vanilla_ms / r.xl_ms for r in rows)
    assert 0 < rows[0].peak_mb <= rows[1].peak_mb  # on a CPU: the process's peak RSS after each length
    assert format_speed_table(rows).count("\n") == 3
    code, out, err = run(capsys, "lm", "speed", "--lengths", "8", "16", "--runs", "1", "--model.d_model=16",
                         "--model.n_heads=2", "--model.d_ff=32", "--model.n_layers=1")
    assert code == 0, err
    assert "| 16 | 4 + 12 |" in out and "peak memory (MB) |" in out


@pytest.mark.skipif(not (SHARED_DATA / "tiny_shakespeare" / "input.txt.gz").exists(), reason="no shared data")
def test_tiny_shakespeare_prepares_90_10(tmp_path):
    corpus = prepare_lm(tmp_path / "ts", SHARED_DATA / "tiny_shakespeare" / "input.txt.gz", level="char",
                        valid_fraction=0.1)
    n = corpus.splits["train"].numel() + corpus.splits["valid"].numel()
    assert corpus.splits["train"].numel() == int(n * 0.9) and 60 <= corpus.vocab.vocab_size <= 70
