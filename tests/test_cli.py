"""The command line end to end on a tiny corpus, and its one-line errors for bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from attnkit.cli.main import main
from conftest import SHARED_DATA, serve_extra


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prepare_train_translate_evaluate(capsys, tmp_path, trained, corpus_files):
    data, run_dir = trained
    assert (run_dir / "checkpoints" / "best.safetensors").exists()
    assert "d_model: 16" in (run_dir / "config.yaml").read_text()
    hyp = tmp_path / "hyp.en"
    code, _, err = run(capsys, "translate", "--checkpoint", run_dir / "checkpoints" / "best.safetensors",
                       "--input", corpus_files["test"][0], "--output", hyp, "--device", "cpu")
    assert code == 0, err
    assert len(hyp.read_text().splitlines()) == 30
    code, out, _ = run(capsys, "evaluate", "--hyp", hyp, "--ref", corpus_files["test"][1])
    assert code == 0 and "BLEU" in out and "nrefs:1|case:mixed|eff:no|tok:13a" in out and "case:lc" in out
    # an existing output is never overwritten without --force
    code, _, err = run(capsys, "translate", "--checkpoint", run_dir / "checkpoints" / "last.safetensors",
                       "--input", corpus_files["test"][0], "--output", hyp)
    assert code == 2 and "--force" in err


def test_translate_reads_stdin(capsys, monkeypatch, trained):
    import io

    _, run_dir = trained
    monkeypatch.setattr("sys.stdin", io.StringIO("einundzwanzig\ndreihundert\n"))
    code, out, _ = run(capsys, "translate", "--checkpoint", run_dir / "checkpoints" / "last.safetensors",
                       "--device", "cpu")
    assert code == 0 and len(out.splitlines()) == 2


def one_line_error(capsys, *argv) -> str:
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: "), err
    return lines[0]


def test_bad_corpus_files_give_one_line_errors(capsys, tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    assert "a.de" in (msg := one_line_error(capsys, "prepare", "--src", "de", "--tgt", "en", "--train",
                                             tmp_path / "a", "--out", tmp_path / "o1")) and "a.en" in msg
    (tmp_path / "b.de").write_bytes(b"eins\nzwei\ndr\xffei\n")
    (tmp_path / "b.en").write_text("one\ntwo\nthree\n")
    assert "b.de:3" in one_line_error(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", tmp_path / "b",
                                      "--out", tmp_path / "o2")
    (tmp_path / "c.de").write_text("")
    (tmp_path / "c.en").write_text("")
    assert "empty" in one_line_error(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", tmp_path / "c",
                                     "--out", tmp_path / "o3")
    assert "no such file" in one_line_error(capsys, "prepare", "--src", "de", "--tgt", "en", "--train",
                                            tmp_path / "missing", "--out", tmp_path / "o4")
    assert "no such file" in one_line_error(capsys, "evaluate", "--hyp", tmp_path / "nope", "--ref", tmp_path / "a.en")
    (tmp_path / "three.txt").write_text("x\ny\nz\n")
    assert "differ in length" in one_line_error(capsys, "evaluate", "--hyp", tmp_path / "three.txt",
                                            "--ref", tmp_path / "a.en")


def test_prepare_never_overwrites_without_force(capsys, tmp_path, corpus_files):
    prefix = Path(corpus_files["train"][0]).with_suffix("")
    out = tmp_path / "data"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    msg = one_line_error(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--vocab-size", "100",
                         "--out", out)
    assert "--force" in msg and (out / "precious.txt").read_text() == "keep me"


def test_bad_options_and_configs_give_one_line_errors(capsys, tmp_path, trained):
    data, _ = trained
    assert "unknown config key 'model.d_modle'" in one_line_error(
        capsys, "train", "--data", data, "--out", tmp_path / "r", "--model.d_modle=8")
    assert "model.d_model" in one_line_error(capsys, "train", "--data", data, "--out", tmp_path / "r",
                                             "--model.d_model=abc")
    assert "unknown preset" in one_line_error(capsys, "train", "--data", data, "--out", tmp_path / "r",
                                              "--config", "transformer-huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: [1, 2\n")
    assert "bad.yaml:" in one_line_error(capsys, "train", "--data", data, "--out", tmp_path / "r", "--config", bad)
    assert "not divisible" in one_line_error(capsys, "train", "--data", data, "--out", tmp_path / "r",
                                             "--model.d_model=10", "--model.n_heads=4")
    assert "attnkit lm train" in one_line_error(capsys, "train", "--data", data, "--out", tmp_path / "r",
                                                "--config", "lm-char-small")
    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    assert "t.safetensors" in one_line_error(capsys, "translate", "--checkpoint", truncated)


def test_all_presets_resolve():
    from attnkit.config import resolve
    from attnkit.presets import PRESET_DIR

    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    assert {"transformer-base", "transformer-big", "transformer-small", "multi30k", "demo"} <= set(names)
    configs = {n: resolve([n]) for n in names}
    base, big = configs["transformer-base"].model, configs["transformer-big"].model
    assert (base.d_model, base.n_heads, base.d_ff, base.n_encoder_layers, base.dropout) == (512, 8, 2048, 6, 0.1)
    assert (big.d_model, big.n_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.3)


def test_demo_runs_end_to_end_on_a_small_budget(capsys, tmp_path):
    code, out, err = run(capsys, "demo", "--out", tmp_path / "demo", "--n-train", "300", "--n-eval", "20", "--quiet",
                         "--train.max_steps=4", "--train.device=cpu")
    assert code == 0, err
    assert "exact match" in out and "BLEU" in out
    png = tmp_path / "demo" / "attention.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not (SHARED_DATA / "multi30k").exists(), reason="../shared/data/multi30k is absent")
def test_multi30k_prepares_and_trains_a_step(capsys, tmp_path):
    d = SHARED_DATA / "multi30k"
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", d / "train", "--valid", d / "val",
                 "--test", d / "test_2016_flickr", "--vocab-size", "2000", "--out", tmp_path / "data"]) == 0
    out = capsys.readouterr().out
    assert "train: 29000 kept" in out
    with gzip.open(d / "val.en.gz", "rt", encoding="utf-8") as f:
        refs = f.read().splitlines()
    assert (tmp_path / "data" / "valid.tgt.txt").read_text(encoding="utf-8").splitlines() == refs
    assert main(["train", "--data", tmp_path / "data", "--out", tmp_path / "run", "--quiet", "--train.max_steps=2",
                 "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--train.max_tokens=512",
                 "--train.eval_max_sentences=16", "--train.device=cpu"]) == 0


def test_translate_beam_nbest_tsv_alignment_and_score(capsys, tmp_path, trained, corpus_files):
    _, run_dir = trained
    ckpt = run_dir / "checkpoints" / "last.safetensors"
    src = tmp_path / "src.de"
    src.write_text("einundzwanzig\ndreihundertzwölf\n")
    code, out, err = run(capsys, "translate", "--checkpoint", ckpt, "--input", src, "--beam", "3", "--nbest", "2",
                         "--format", "tsv", "--print-alignment", "--device", "cpu")
    assert code == 0, err
    _, *rows = [line.split("\t") for line in out.splitlines()]  # the header: test_cli_help.py
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
    assert float(rows[0][3]) >= float(rows[1][3]) and rows[0][4] != rows[1][4]  # sorted, distinct
    for r in rows:  # one src-tgt pair per target piece
        assert len(r[7].split()) == len(r[6].split()) and all("-" in pair for pair in r[7].split())
    # forced decoding (exactness vs the search's own scores is tested at token level in test_decode.py;
    # re-encoding detokenised text may pick other subwords than an untrained model produced)
    hyp = tmp_path / "hyp.en"
    hyp.write_text("twenty-one\nthree hundred and twelve\n")
    code, out, _ = run(capsys, "score", "--checkpoint", ckpt, "--src", src, "--tgt", hyp, "--device", "cpu")
    scores = [float(x) for x in out.split()]
    assert code == 0 and len(scores) == 2 and all(s < 0 for s in scores)
    assert "--beam" in one_line_error(capsys, "translate", "--checkpoint", ckpt, "--input", src, "--nbest", "3")


def test_interactive_translation_answers_line_by_line(capsys, monkeypatch, trained):
    import io

    _, run_dir = trained
    monkeypatch.setattr("sys.stdin", io.StringIO("eins\nzwei\ndrei\n"))
    code, out, _ = run(capsys, "translate", "--checkpoint", run_dir / "checkpoints" / "last.safetensors",
                       "--interactive", "--device", "cpu")
    assert code == 0 and len(out.splitlines()) == 3


def test_average_of_two_checkpoints_is_the_elementwise_mean(capsys, tmp_path, trained):
    from attnkit.checkpoint import epoch_checkpoints, load_checkpoint

    data, _ = trained
    assert main(["train", "--data", data, "--out", tmp_path / "run", "--quiet", "--train.max_epochs=2",
                 "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--train.max_tokens=300",
                 "--train.device=cpu", "--train.eval_bleu=false"]) == 0
    epochs = epoch_checkpoints(tmp_path / "run")
    assert len(epochs) == 2
    code, _, err = run(capsys, "average", "--run", tmp_path / "run", "--last", "2", "--out", tmp_path / "avg.st")
    assert code == 0, err
    a, b, avg = (load_checkpoint(p).model_state for p in (*epochs, tmp_path / "avg.st"))
    for name in avg:
        torch.testing.assert_close(avg[name], (a[name] + b[name]) / 2)
    assert not torch.equal(a["src_embed.weight"], b["src_embed.weight"])
    assert "no such checkpoint" in one_line_error(capsys, "average", epochs[0], tmp_path / "missing.st",
                                                  "--out", tmp_path / "x.st")


def test_translate_names_a_folder_given_as_a_file_of_sentences(capsys, tmp_path, trained):
    _, run_dir = trained
    ckpt = run_dir / "checkpoints" / "last.safetensors"
    (tmp_path / "in.txt").write_text("eins\n")
    assert one_line_error(capsys, "translate", "--checkpoint", ckpt, "--input", tmp_path) == (
        f"attnkit: error: --input {tmp_path} is a folder, not a file: give a file of sentences, one per line")
    assert f"--prefix-file {tmp_path} is a folder, not a file" in one_line_error(
        capsys, "translate", "--checkpoint", ckpt, "--input", tmp_path / "in.txt", "--prefix-file", tmp_path)


def tiny_lm_checkpoint(path: Path) -> Path:
    """A one-layer vanilla LM over three characters, random weights: enough to build its service."""
    from attnkit import config as cfgmod
    from attnkit.checkpoint import LM_VOCAB, Checkpoint, save_checkpoint
    from attnkit.data.lm import LMVocab
    from attnkit.models import build_model

    vocab = LMVocab("char", ["<unk>", "a", "b", "\n"])
    model = cfgmod.TransformerXLConfig(kind="vanilla-lm", vocab_size=vocab.vocab_size, d_model=8, n_heads=2, d_ff=16,
                                       n_layers=1, max_positions=64)
    cfg = cfgmod.LMRunConfig(model=model)
    save_checkpoint(path, Checkpoint("vanilla-lm", cfg, build_model("vanilla-lm", model).state_dict(),
                                     {LM_VOCAB: vocab.to_bytes()}))
    return path


@pytest.fixture
def no_listening(monkeypatch) -> list:
    """The servers `attnkit serve` would run, recorded instead of listening."""
    serve_extra()
    served = []
    monkeypatch.setattr("uvicorn.Server.run", lambda server: served.append(server))
    return served


def test_serve_refuses_the_batching_options_for_a_language_model(capsys, tmp_path, no_listening):
    """A language model's service samples one request at a time: --max-batch-sentences and --batch-wait-ms are
    refused in one line, not dropped; without them it serves."""
    lm = tiny_lm_checkpoint(tmp_path / "lm.safetensors")
    serve = ["serve", "--checkpoint", lm, "--device", "cpu", "--port", "0"]
    assert one_line_error(capsys, *serve, "--max-batch-sentences", "8") == (
        f"attnkit: error: --max-batch-sentences batch translation requests; {lm} holds a vanilla-lm language model, "
        "whose service samples one request at a time (a stream each): leave them out")
    assert "--max-batch-sentences and --batch-wait-ms batch translation requests" in one_line_error(
        capsys, *serve, "--batch-wait-ms", "0", "--max-batch-sentences", "2")
    assert not no_listening
    assert run(capsys, *serve)[0] == 0
    (server,) = no_listening
    assert "/generate" in {route.path for route in server.config.app.routes}


def test_serve_batches_a_translation_model_as_told_and_by_default(capsys, monkeypatch, trained, no_listening):
    """The batching options left out of `serve` for a language model still reach a translation model's batcher,
    and those not given keep their defaults."""
    from attnkit.serve import app as app_mod

    _, run_dir = trained
    batchers, real = [], app_mod.Batcher
    monkeypatch.setattr(app_mod, "Batcher", lambda *a, **kw: batchers.append(kw) or real(*a, **kw))
    assert run(capsys, "serve", "--checkpoint", run_dir / "checkpoints" / "last.safetensors", "--device", "cpu",
               "--max-batch-sentences", "4")[0] == 0
    (kw,) = batchers
    assert (kw["max_batch_sentences"], kw["batch_wait_ms"]) == (4, 5.0)
    assert len(no_listening) == 1
