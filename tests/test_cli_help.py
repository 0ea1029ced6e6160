"""The command line a newcomer meets: help on every option, a fast `--help` that imports no torch,
`--version`, presets, one numbering (layers, lines and alignment positions from 1), and one-line errors
that point at the fix, each checked to its exact wording."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest
import torch

from attnkit import __version__
from attnkit.cli.main import build_parser, main, verbs_taking_overrides


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error(capsys, *argv) -> str:
    """The one line on stderr of a call that must fail with exit code 2."""
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err.rstrip("\n")


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("attnkit",)):
    """(verb path, parser) for the top level and every verb and sub-verb."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                assert helps.get(name), f"{' '.join(path)} {name} has no one-line help"
                yield from parsers(child, (*path, name))


def test_every_option_of_every_verb_has_help_text():
    missing = [f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
               for path, p in parsers(build_parser()[0]) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_help_shows_defaults_presets_and_how_to_override(capsys):
    code, out, _ = run(capsys, "translate", "--help")
    assert code == 0
    assert "sentences per batch (default: 64)" in " ".join(out.split())
    assert "source tokens per batch (0 = no limit) (default: 0)" in " ".join(out.split())
    takers = (["train"], ["demo"], ["lm", "train"], ["lm", "speed"], ["plot", "schedule"], ["experiment", "compare"])
    for verb in takers:
        code, out, _ = run(capsys, *verb, "--help")
        text = " ".join(out.split())
        assert code == 0 and "config overrides: set any field of the config" in text, verb
        if verb != ["demo"] and verb != ["experiment", "compare"]:
            assert "transformer-base, transformer-big, transformer-small; `attnkit presets` describes them" in text
    code, out, _ = run(capsys, "presets")
    assert code == 0 and out.startswith("demo ") and "transformer-base" in out
    code, out, _ = run(capsys, "presets", "demo")
    assert code == 0 and "max_epochs: 10" in out and "d_model: 256" in out


def test_version_and_top_level_description(capsys):
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, f"attnkit {__version__}\n")
    code, out, _ = run(capsys, "--help")
    assert code == 0 and out.splitlines()[2].startswith("attnkit trains, runs, measures and explains attention")


def test_every_top_level_name_of_the_python_api_resolves():
    """`attnkit.Trainer` and the other names `import attnkit` offers load on first use, each the real object."""
    import attnkit

    for name in attnkit.__all__:
        value = getattr(attnkit, name)
        assert getattr(value, "__name__", name) == name, name


def test_help_of_every_verb_imports_no_torch():
    """In a fresh interpreter: the top-level help and every verb's help, and still no torch (nor numpy)."""
    verbs = [list(path[1:]) for path, _ in parsers(build_parser()[0])]
    script = ("import contextlib, io, sys\nfrom attnkit.cli.main import main\n"
              f"for verb in {verbs!r}:\n"
              "    with contextlib.redirect_stdout(io.StringIO()):\n"
              "        assert main([*verb, '--help']) == 0, verb\n"
              "heavy = [m for m in ('torch', 'numpy', 'sentencepiece', 'matplotlib') if m in sys.modules]\n"
              "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- errors that point at the fix ------------------------------------------------------------------------------
def test_usage_errors_are_one_line_that_points_at_help(capsys):
    assert error(capsys, "translate") == ("attnkit translate: error: the following arguments are required: "
                                          "--checkpoint (see `attnkit translate --help`)")
    assert error(capsys, "translate", "--checkpoint", "x", "--beam", "two") == (
        "attnkit translate: error: argument --beam: invalid int value: 'two' (see `attnkit translate --help`)")
    assert error(capsys, "frobnicate").startswith("attnkit: error: argument VERB: invalid choice: 'frobnicate'")
    assert error(capsys, "lm", "train", "--data", "d") == (
        "attnkit lm train: error: the following arguments are required: --out (see `attnkit lm train --help`)")


def test_a_folder_given_as_a_checkpoint_lists_the_checkpoints_inside(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("epoch0001", "last", "best"):
        (run_dir / "checkpoints" / f"{name}.safetensors").write_bytes(b"")
    ckpts = run_dir / "checkpoints"
    assert error(capsys, "translate", "--checkpoint", run_dir, "--input", tmp_path / "x") == (
        f"attnkit: error: {run_dir} is a folder, not a checkpoint; it holds {ckpts / 'best.safetensors'}, "
        f"{ckpts / 'last.safetensors'}, {ckpts / 'epoch0001.safetensors'}")
    assert error(capsys, "lm", "eval", "--checkpoint", tmp_path, "--data", tmp_path) == (
        f"attnkit: error: {tmp_path} is a folder, not a checkpoint; it holds {ckpts / 'best.safetensors'}, "
        f"{ckpts / 'last.safetensors'}, {ckpts / 'epoch0001.safetensors'}")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert error(capsys, "score", "--checkpoint", empty, "--src", "a", "--tgt", "b") == (
        f"attnkit: error: {empty} is a folder with no checkpoint (.safetensors) inside; a checkpoint is a file")


def test_inputs_are_checked_before_the_model_loads(capsys, monkeypatch, tmp_path, trained):
    from attnkit.decode import Translator

    def no_loading(*args, **kw):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(Translator, "from_checkpoint", no_loading)
    ckpt = trained[1] / "checkpoints" / "last.safetensors"
    missing = tmp_path / "missing.de"
    assert error(capsys, "translate", "--checkpoint", ckpt, "--input", missing) == (
        f"attnkit: error: no such file: {missing}")
    assert error(capsys, "translate", "--checkpoint", ckpt, "--input", ckpt, "--prefix-file", missing) == (
        f"attnkit: error: no such file: {missing}")
    assert error(capsys, "score", "--checkpoint", ckpt, "--src", missing, "--tgt", missing) == (
        f"attnkit: error: no such file: {missing}")
    assert error(capsys, "translate", "--checkpoint", ckpt, "--alignment-layer", "-1") == (
        "attnkit: error: --alignment-layer counts decoder layers from 1; got -1")


def test_empty_input_is_the_same_error_from_a_file_and_from_stdin(capsys, monkeypatch, tmp_path, trained):
    ckpt = trained[1] / "checkpoints" / "last.safetensors"
    empty = tmp_path / "empty.de"
    empty.write_bytes(b"")
    assert error(capsys, "translate", "--checkpoint", ckpt, "--input", empty) == f"attnkit: error: {empty} is empty"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"))
    assert error(capsys, "translate", "--checkpoint", ckpt) == "attnkit: error: <stdin> is empty"


def test_unknown_config_keys_and_presets_get_a_did_you_mean(capsys, tmp_path, trained):
    data = trained[0]
    train = ("train", "--data", data, "--out", tmp_path / "r")
    assert error(capsys, *train, "--train.lr_rate=1e-3") == (
        "attnkit: error: unknown config key 'train.lr_rate'; did you mean 'train.lr'?")
    assert error(capsys, *train, "--model.d_modle", "8") == (
        "attnkit: error: unknown config key 'model.d_modle'; did you mean 'model.d_model'?")
    assert error(capsys, *train, "--config", "transfomer-base") == (
        "attnkit: error: unknown preset 'transfomer-base'; did you mean 'transformer-base'?")


def test_the_overrides_message_names_the_verbs_that_take_them(capsys, trained):
    takers = verbs_taking_overrides(build_parser()[0])
    assert takers == ["demo", "train", "lm train", "lm speed", "plot schedule", "experiment compare",
                      "experiment heads", "experiment parts", "experiment ancestors", "experiment lm-ablation",
                      "experiment xl-table6", "experiment recl", "experiment planted-recall"]
    ckpt = trained[1] / "checkpoints" / "last.safetensors"
    assert error(capsys, "translate", "--checkpoint", ckpt, "--train.lr=1") == (
        "attnkit: error: config overrides (--train.lr=1) apply only to: demo, train, lm train, lm speed, "
        "plot schedule, experiment compare, experiment heads, experiment parts, experiment ancestors, "
        "experiment lm-ablation, experiment xl-table6, experiment recl, experiment planted-recall")
    code, _, err = run(capsys, "plot", "schedule", "--out", trained[1] / "s.png", "--train.warmup=50")
    assert code == 0, err


# --- one numbering ----------------------------------------------------------------------------------------------
def test_tsv_has_a_header_lines_and_ranks_from_1_and_alignments_beside_their_pieces(capsys, tmp_path, trained):
    from attnkit.decode import Translator

    ckpt = trained[1] / "checkpoints" / "last.safetensors"
    src = tmp_path / "src.de"
    src.write_text("einundzwanzig\ndreihundertzwölf\n")
    base = ("translate", "--checkpoint", ckpt, "--input", src, "--device", "cpu", "--print-alignment")
    code, out, err = run(capsys, *base, "--format", "tsv", "--beam", "2", "--nbest", "2")
    assert code == 0, err
    header, *rows = [line.split("\t") for line in out.splitlines()]
    assert header == ["line", "rank", "score", "norm_score", "translation", "source_pieces", "target_pieces",
                      "alignment"]
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    layers = translator.model.config.n_decoder_layers
    for layer in (1, layers):
        code, out, err = run(capsys, *base, "--alignment-layer", layer)
        assert code == 0, err
        expected = translator.translate(["einundzwanzig", "dreihundertzwölf"], need_attention=True,
                                        attention_layer=layer - 1)
        for line, t in zip(out.splitlines(), expected):
            text, src_pieces, tgt_pieces, pairs = line.split("\t")
            assert (text, src_pieces.split(), tgt_pieces.split()) == (t.text, t.src_pieces, t.tgt_pieces)
            assert pairs.split() == [f"{s + 1}-{j + 1}" for j, s in enumerate(t.alignment)]
            assert all(1 <= int(p.split("-")[0]) <= len(t.src_pieces) for p in pairs.split())
    assert error(capsys, *base, "--alignment-layer", layers + 1) == (
        f"attnkit: error: --alignment-layer {layers + 1}: the model has {layers} decoder layers")
    assert not torch.equal(*[translator.translate(["dreihundertzwölf"], need_attention=True, attention_layer=k)[0]
                             .attention for k in (0, 1)])  # the option picks a layer


@pytest.mark.parametrize("verb", [["translate"], ["plot", "attention"]])
def test_layers_are_counted_from_1_in_every_help(capsys, verb):
    code, out, _ = run(capsys, *verb, "--help")
    assert code == 0 and "counted from 1" in " ".join(out.split())


def test_option_help_never_splits_a_name_at_its_hyphens(capsys):
    """argparse wraps help at hyphens by default ("lm-char- small-xl"): no preset name or flag may be split."""
    code, out, _ = run(capsys, "lm", "train", "--help")
    assert code == 0
    words = out.split()
    assert not [w for w in words if w.endswith("-") and w not in ("-", "--")], "a word split at a hyphen"
    from attnkit.presets import preset_names
    assert all(name in words or f"{name}," in words or f"{name};" in words for name in preset_names())
