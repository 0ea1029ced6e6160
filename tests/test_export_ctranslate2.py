"""The CTranslate2 export: the network it writes computes what attnkit's does (every configurable variant), and
`--engine ctranslate2` gives attnkit's translations, scores, n-best lists and alignments on a trained model."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ctranslate2", reason="the CTranslate2 export needs the ctranslate2 package "
                                          "(pip install ctranslate2, or attnkit[test])")

from attnkit import config as cfgmod  # noqa: E402 - after the skip: these tests need ctranslate2
from attnkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from attnkit.cli.main import main  # noqa: E402
from attnkit.config import EOS_ID, PAD_ID, RunConfig, TrainConfig  # noqa: E402
from attnkit.data import prepare, read_lines  # noqa: E402
from attnkit.decode import DecodeOptions, Translator  # noqa: E402
from attnkit.decode.scoring import score_targets  # noqa: E402
from attnkit.errors import AttnkitError, ConfigError  # noqa: E402
from attnkit.formats import CT2Translator, export_checkpoint, save_ctranslate2  # noqa: E402
from attnkit.formats import ctranslate2 as ct2_export  # noqa: E402
from attnkit.models import Transformer  # noqa: E402
from attnkit.train.trainer import Trainer  # noqa: E402
from conftest import tiny_model_config  # noqa: E402

NBEST_TIE = 1e-3  # how far apart two engines' later n-best entries may end after a near-tie (assert_same)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_files):
    """(checkpoint, test sources): a small Transformer trained 40 epochs on number words (about 7 s), with a
    source and a target vocabulary of its own, so outputs are words rather than noise."""
    root = tmp_path_factory.mktemp("ct2")
    prepare(root / "data", corpus_files["train"], corpus_files["valid"], corpus_files["test"], vocab_size=120,
            joint=False)
    cfg = RunConfig(model=tiny_model_config(d_model=32, d_ff=64, dropout=0.1),
                    train=TrainConfig(max_tokens=256, lr=3e-3, schedule="inverse_sqrt", warmup=10, eval_bleu=False,
                                      max_epochs=40, device="cpu"))
    Trainer(cfg, root / "data", root / "run", progress=False).fit()
    return root / "run" / "checkpoints" / "last.safetensors", read_lines(corpus_files["test"][0])


@pytest.fixture(scope="module")
def engines(trained, tmp_path_factory):
    """(attnkit's Translator, CTranslate2's) on the same trained model, and the export folder."""
    ckpt, _ = trained
    out = export_checkpoint(ckpt, tmp_path_factory.mktemp("export") / "ct2")
    return Translator.from_checkpoint(ckpt, device="cpu"), CT2Translator.from_dir(out, threads=1), out


def assert_same(ours, theirs, tol: float = 1e-3) -> None:
    """Token for token and scores to `tol`; where the hypotheses differ, it must be a near-tie, and at most one per
    call: the best ones' normalised scores within 1e-4 of each other, a later n-best entry's within NBEST_TIE (a tie
    a few steps earlier lets the two searches keep different partial hypotheses in the beam, whose final scores
    then differ by more than the rounding that decided it)."""
    ties = 0
    for a, c in zip(ours, theirs, strict=True):
        assert len(a.nbest) == len(c.nbest)
        for rank, (x, y) in enumerate(zip([a, *a.nbest], [c, *c.nbest])):
            if x.tgt_pieces != y.tgt_pieces:
                ties += 1
                near = 1e-4 if rank == 0 else NBEST_TIE
                assert abs(x.norm_score - y.norm_score) < near, (x.text, y.text, x.norm_score, y.norm_score)
                continue
            assert x.text == y.text and x.src_pieces == y.src_pieces
            assert x.score == pytest.approx(y.score, abs=tol) and x.norm_score == pytest.approx(y.norm_score, abs=tol)
    assert ties <= 1


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=4, nbest=3), dict(beam=5, len_penalty=0.0, nbest=2),
                                     dict(beam=3, len_penalty=0.6, len_style="gnmt")], ids=str)
def test_float32_export_translates_as_attnkit(engines, trained, options):
    ours, theirs, _ = engines
    sources = trained[1]
    opts = DecodeOptions(**options)
    results = ours.translate(sources, opts)
    assert sum(t.text != "" for t in results) == len(sources)  # a trained model: words, not empty lines
    assert_same(results, theirs.translate(sources, opts))


def test_alignments_limits_and_min_len_follow_attnkit(engines, trained):
    """Alignments (the last layer, heads averaged; beam search included), hypotheses cut at the length limit where
    attnkit forces EOS, greedy search with --min-len, and batching by tokens."""
    ours, theirs, _ = engines
    sources = trained[1][:12]
    for opts in (DecodeOptions(beam=1), DecodeOptions(beam=3, nbest=2)):
        a, c = ours.translate(sources, opts, need_attention=True), theirs.translate(sources, opts, need_attention=True)
        assert_same(a, c)
        assert [t.alignment for t in a] == [t.alignment for t in c]
    for opts in (DecodeOptions(max_len=3), DecodeOptions(min_len=8), DecodeOptions(max_len_a=0.5, max_len_b=1)):
        assert_same(ours.translate(sources, opts), theirs.translate(sources, opts, max_tokens=40))
    assert ours.score(sources, ["one"] * 12) == pytest.approx(theirs.score(sources, ["one"] * 12), abs=1e-3)


def test_greedy_search_that_would_produce_pad_runs_again_without_it(trained, tmp_path):
    """attnkit never produces PAD or BOS; CTranslate2's greedy search runs unconstrained (exact scores) and, for the
    sentences where it chose one, again with them banned, its scores then taken by forced decoding."""
    ckpt, sources = trained
    state = load_checkpoint(ckpt)
    weights = dict(state.model_state)
    table = weights["own_tgt_embed.weight"].clone()
    table[PAD_ID] = 2 * table[EOS_ID]  # PAD now outscores EOS wherever EOS is likely
    weights["own_tgt_embed.weight"] = table
    save_checkpoint(tmp_path / "pad.safetensors", Checkpoint(state.kind, state.config, weights, state.tokenizers))
    ours = Translator.from_checkpoint(tmp_path / "pad.safetensors", device="cpu")
    theirs = CT2Translator.from_dir(export_checkpoint(tmp_path / "pad.safetensors", tmp_path / "ct2"), threads=1)
    unconstrained = theirs.translator.translate_batch([theirs._source(ids) for ids in theirs.encode_sources(sources)],
                                                      beam_size=1, max_decoding_length=20, max_input_length=0)
    assert sum("<pad>" in r.hypotheses[0] for r in unconstrained) >= len(sources) // 2
    assert_same(ours.translate(sources, DecodeOptions()), theirs.translate(sources, DecodeOptions()))


def test_what_the_ctranslate2_engine_cannot_do_is_one_line_error(engines, trained):
    _, theirs, _ = engines
    sources = trained[1][:2]
    with pytest.raises(ConfigError, match="--sampling is not available with --engine ctranslate2"):
        theirs.translate(sources, DecodeOptions(sampling=True))
    with pytest.raises(ConfigError, match="--prefix-file is not available"):
        theirs.translate(sources, DecodeOptions(), prefixes=["one", "two"])
    with pytest.raises(ConfigError, match=r"--alignment-layer 1: .* last decoder layer \(2\) only"):
        theirs.translate(sources, DecodeOptions(attention_layer=0), need_attention=True)
    with pytest.warns(UserWarning, match="renormalised after the ban"):
        theirs.translate(sources, DecodeOptions(beam=2, min_len=2))
    empty = theirs.translate([""], DecodeOptions())[0]  # CTranslate2 does not run a source without content
    assert empty.text == "" and empty.score == pytest.approx(theirs.score([""], [""])[0])


def test_int8_export_is_ctranslate2s_own_quantization_and_scores_near_float(engines, trained, tmp_path):
    """The int8 export holds what CTranslate2 itself makes of the float32 one (quantised on load): the same
    translations and scores; and its scores of the float32 model's translations stay near the float32 ones. Whether
    the two searches then pick the same words depends on the model's margins, which a model this small lacks (on the
    number words a third of the beams agreed), so the bound is on the scores: int8 costs a little precision per
    token, not the ranking of the hypotheses."""
    _, theirs, float_dir = engines
    out = export_checkpoint(trained[0], tmp_path / "int8", "int8")
    assert (out / "model.bin").stat().st_size < 0.6 * (float_dir / "model.bin").stat().st_size
    sources, options = trained[1], DecodeOptions(beam=2)
    quantised = CT2Translator.from_dir(out, threads=1)
    on_load = CT2Translator.from_dir(float_dir, threads=1, compute_type="int8").translate(sources, options)
    assert [(h.text, h.score) for h in quantised.translate(sources, options)] == [(h.text, h.score) for h in on_load]
    exact = [h.text for h in theirs.translate(sources, options)]
    floats, int8s = np.array(theirs.score(sources, exact)), np.array(quantised.score(sources, exact))
    tokens = np.array([len(ids) + 1 for ids in theirs.tgt_tok.encode(exact)])  # EOS included, as the scores
    assert np.isfinite(int8s).all() and (int8s < 0).all()
    assert np.mean(np.abs(int8s - floats) / tokens) < 0.3  # nats per token
    assert np.corrcoef(floats, int8s)[0, 1] > 0.7


VARIANTS = [dict(norm_first=True, activation="gelu"), dict(share_embeddings=False, tie_output=False, tgt_vocab_size=30),
            dict(n_encoder_layers=1, n_decoder_layers=3), dict(positions="learned", max_positions=20),
            dict(positions="none"), dict(variant="no-wo"), dict(variant="kyubyong")]


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_every_variant_of_the_network_exports_exactly(variant, tmp_path):
    """Forced decoding of random targets through CTranslate2's network and attnkit's: pre-LN with its final
    LayerNorms and GELU, separate and untied tables, unequal stacks, learned positions and none (and attention
    without W^O, another epsilon)."""
    import ctranslate2

    torch.manual_seed(0)
    cfg = tiny_model_config(**variant)
    model = Transformer.from_config(cfg).eval()
    vocab = [["<pad>", "<s>", "</s>", "<unk>"] + [f"{side}{i}" for i in range(4, n)]
             for side, n in (("s", cfg.src_vocab_size), ("t", cfg.tgt_vocab_size))]
    save_ctranslate2(model, vocab[0], vocab[1], tmp_path / "m")
    src = torch.randint(4, cfg.src_vocab_size, (6, 9))
    src[:, -1] = 2  # EOS
    tgt = torch.randint(4, cfg.tgt_vocab_size, (6, 7))
    tgt_in, tgt_out = torch.cat([torch.ones(6, 1, dtype=torch.long), tgt], 1), torch.cat([tgt, 2 * torch.ones(
        6, 1, dtype=torch.long)], 1)
    with torch.inference_mode():
        ours = score_targets(model, src, tgt_in, tgt_out)
    results = ctranslate2.Translator(str(tmp_path / "m"), intra_threads=1).score_batch(
        [[vocab[0][i] for i in row] for row in src.tolist()], [[vocab[1][i] for i in row] for row in tgt.tolist()])
    np.testing.assert_allclose([sum(r.log_probs) for r in results], ours.numpy(), atol=1e-4)


def test_cli_export_then_translate_with_either_engine(trained, tmp_path, capsys):
    ckpt, sources = trained
    (tmp_path / "in.txt").write_text("\n".join(sources[:8]) + "\n")
    assert main(["export", "--format", "ctranslate2", "--checkpoint", ckpt, "--out", tmp_path / "ct2"]) == 0
    assert "translate with: attnkit translate --engine ctranslate2" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "ct2").iterdir()) == [
        "attnkit.json", "config.json", "model.bin", "source.model", "source_vocabulary.json", "target.model",
        "target_vocabulary.json"]
    outputs = {}
    for engine, model in (("attnkit", ckpt), ("ctranslate2", tmp_path / "ct2")):
        for fmt in (["--format", "text"], ["--format", "tsv", "--beam", "3", "--nbest", "2", "--print-alignment"]):
            assert main(["translate", "--engine", engine, "--checkpoint", model, "--input", tmp_path / "in.txt",
                         "--device", "cpu", *fmt]) == 0
            outputs[engine, fmt[1]] = capsys.readouterr().out
    assert outputs["attnkit", "text"] == outputs["ctranslate2", "text"] and outputs["attnkit", "text"].count("\n") == 8
    ours, theirs = (outputs[e, "tsv"].splitlines() for e in ("attnkit", "ctranslate2"))
    assert ours[0] == theirs[0] and len(ours) == len(theirs) == 17
    ties = 0
    for a, c in zip(ours[1:], theirs[1:]):
        a, c = a.split("\t"), c.split("\t")
        if a[1] == "2" and a[4:] != c[4:] and abs(float(a[3]) - float(c[3])) < NBEST_TIE:  # as assert_same's
            ties += 1
            continue
        assert a[:2] + a[4:] == c[:2] + c[4:]  # line, rank, translation, pieces, alignment
        assert float(a[2]) == pytest.approx(float(c[2]), abs=2e-3) and float(a[3]) == pytest.approx(float(c[3]),
                                                                                                   abs=2e-3)
    assert ties <= 1


def test_int8_export_from_the_cli_replaces_only_with_force(trained, tmp_path, capsys):
    ckpt, _ = trained
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", ckpt, "--out", out, "--quantization", "int8"]) == 0
    assert '"quantization": "int8"' in (out / "attnkit.json").read_text()
    assert main(["export", "--checkpoint", ckpt, "--out", out]) == 2
    assert capsys.readouterr().err == f"attnkit: error: output folder '{out}' already exists; pass --force to " \
                                      "overwrite it\n"
    assert main(["export", "--checkpoint", ckpt, "--out", out, "--force"]) == 0
    assert '"quantization": "float32"' in (out / "attnkit.json").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # no temp folder left behind
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    assert main(["export", "--checkpoint", ckpt, "--out", other, "--force"]) == 2
    assert "is not a CTranslate2 model folder, so --force will not replace it" in capsys.readouterr().err
    assert (other / "todo.txt").exists()


def test_a_failed_write_keeps_the_previous_export_and_says_why(trained, tmp_path, monkeypatch):
    """The export is written with attnkit.io.atomic_folder, as every folder attnkit writes: a full disk is one line
    naming the folder and the cause, and the export already there is left as it was, with no temp folder beside it."""
    ckpt, _ = trained
    out = export_checkpoint(ckpt, tmp_path / "ct2")
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    write = Path.write_bytes

    def full_disk(self, data):
        if self.name == ct2_export.META_FILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(AttnkitError) as e:
        export_checkpoint(ckpt, out, "int8", force=True)
    assert str(e.value) == f"cannot write '{out}': No space left on device (disk full); the previous ct2 is unchanged"
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]


def test_models_without_a_ctranslate2_equivalent_and_wrong_engines_are_one_line_errors(trained, tmp_path, capsys):
    ckpt, _ = trained
    xl = tmp_path / "xl.safetensors"
    save_checkpoint(xl, Checkpoint("transformer-xl", cfgmod.LMRunConfig(), {}, {"lm_vocab": b"{}"}))
    rnn = tmp_path / "rnn.safetensors"
    save_checkpoint(rnn, Checkpoint("rnn-luong", RunConfig(model=cfgmod.RNNConfig(kind="rnn-luong")), {},
                                    {"src": b"spm"}))

    def error(*argv) -> str:
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    assert "Transformer-XL language model: its relative attention over a memory of earlier segments has no " \
           "CTranslate2 equivalent" in error("export", "--checkpoint", xl, "--out", tmp_path / "a")
    assert "an RNN encoder-decoder ('rnn-luong'): CTranslate2 runs Transformers, and an RNN is not one" in error(
        "export", "--checkpoint", rnn, "--out", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert f"{ckpt} is not a folder: --engine ctranslate2 runs a folder written by `attnkit export" in error(
        "translate", "--engine", "ctranslate2", "--checkpoint", ckpt, "--input", tmp_path / "x")
    export_checkpoint(ckpt, tmp_path / "ct2")
    assert "is a CTranslate2 export: translate with it using --engine ctranslate2" in error(
        "translate", "--checkpoint", tmp_path / "ct2", "--input", tmp_path / "x")
    (tmp_path / "in.txt").write_text("eins\n")
    assert "--sampling is not available with --engine ctranslate2" in error(
        "translate", "--engine", "ctranslate2", "--checkpoint", tmp_path / "ct2", "--input", tmp_path / "in.txt",
        "--sampling")


@pytest.mark.parametrize(("kind", "what"), [
    ("lstm-lm", "an LSTM language model"),
    ("recurrent-vanilla-lm", "a recurrent vanilla Transformer language model (decoder only, with memory)"),
    ("vanilla-lm", "a vanilla Transformer language model (decoder only)")], ids=["lstm-lm", "recurrent", "vanilla"])
def test_a_language_model_is_refused_as_what_it_is_not_for_a_missing_tokenizer(tmp_path, capsys, kind, what):
    """A language model's checkpoint holds its vocabulary (lm_vocab), not a translation tokenizer: the refusal
    names its kind and what CTranslate2 export takes."""
    model = cfgmod.RNNLMConfig() if kind == "lstm-lm" else cfgmod.TransformerXLConfig(kind=kind)
    lm = tmp_path / f"{kind}.safetensors"
    save_checkpoint(lm, Checkpoint(kind, cfgmod.LMRunConfig(model=model), {}, {"lm_vocab": b"{}"}))
    assert main(["export", "--checkpoint", str(lm), "--out", str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err
    assert err == (f"attnkit: error: {lm} holds {what}; CTranslate2 export takes an encoder-decoder Transformer "
                   "translation model\n")
    assert not (tmp_path / "ct2").exists()


def test_ctranslate2_is_imported_only_when_used(monkeypatch):
    script = ("import contextlib, io, sys\nimport attnkit.formats\nfrom attnkit.cli.main import main\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n    main(['export', '--help'])\n"
              "assert 'ctranslate2' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
    with pytest.raises(AttnkitError, match="need the ctranslate2 package: pip install ctranslate2"):
        ct2_export.require_ctranslate2()


def test_the_cli_offers_the_quantizations_the_export_takes():
    from attnkit.cli import export

    assert export.QUANTIZATIONS == ct2_export.QUANTIZATIONS
