"""Resume continues the run's own recipe on the data it was trained on: `train --resume` without --config reads the
run's config back, and a config, an override or a data folder that would change what the run means is refused in
one line (train.base.TrainerBase.check_resumable)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from attnkit import config as cfgmod
from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main
from attnkit.data import EncodedSplit, load_split
from attnkit.errors import AttnkitError
from attnkit.train.trainer import Trainer
from conftest import LM_TINY, tiny_run_config

# The multi30k recipe in small: transformer-small's network with other dropouts, batching, decay and
# best metric, so that falling back to transformer-small on resume builds the same network and fits the weights
RECIPE = """base: transformer-small
model: {dropout: 0.3, attention_dropout: 0.0, activation_dropout: 0.0, d_model: 32, n_heads: 2, d_ff: 64,
        n_encoder_layers: 1, n_decoder_layers: 1}
train: {max_tokens: 300, weight_decay: 0.0001, best_metric: bleu, eval_max_sentences: 4, max_steps: 2,
        device: cpu}
"""
TINY_SMALL = ["--model.d_model=32", "--model.n_heads=2", "--model.d_ff=64", "--model.n_encoder_layers=1",
              "--model.n_decoder_layers=1", "--train.device=cpu"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def prepare(capsys, corpus: dict, out: Path, *more) -> None:
    prefix = Path(corpus["train"][0]).with_suffix("")
    code, _, err = run(capsys, "prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--valid",
                       prefix.parent / "valid", "--vocab-size", "100", "--out", out, *more)
    assert code == 0, err


@pytest.fixture
def started(tmp_path, capsys, corpus_files) -> tuple[Path, Path, Path]:
    """A run of RECIPE stopped after 2 updates: (recipe file, data folder, run folder)."""
    recipe, data, out = tmp_path / "recipe.yaml", tmp_path / "data", tmp_path / "run"
    recipe.write_text(RECIPE)
    prepare(capsys, corpus_files, data)
    code, _, err = run(capsys, "train", "--config", recipe, "--data", data, "--out", out, "--quiet")
    assert code == 0, err
    return recipe, data, out


def saved_config(out: Path) -> dict:
    return load_checkpoint(out / "checkpoints" / "last.safetensors").config


def test_resume_without_config_continues_the_runs_own_recipe(capsys, started):
    recipe, data, out = started
    before = saved_config(out)
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--resume", "--quiet", "--train.max_steps=4")
    assert code == 0, err
    after = saved_config(out)
    assert load_checkpoint(out / "checkpoints" / "last.safetensors").train_state["step"] == 4
    assert after.model == before.model and after.model.dropout == 0.3
    assert after.train == before.train.__class__(**{**vars(before.train), "max_steps": 4})
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["train"]["max_tokens"] == 300 and written["train"]["best_metric"] == "bleu"
    assert "resumed with train.max_steps 2 -> 4" in (out / "train.log").read_text()


def test_resume_refuses_a_config_that_changes_the_recipe_unless_asked(capsys, started):
    _, data, out = started
    code, _, err = run(capsys, "train", "--config", "transformer-small", *TINY_SMALL, "--data", data, "--out", out,
                       "--resume", "--quiet", "--train.max_steps=3")
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    for change in ("model.dropout 0.3 -> 0.1", "train.max_tokens 300 -> 4096", "train.best_metric bleu -> loss",
                   "train.weight_decay 0.0001 -> 0.0"):
        assert change in err
    assert "--change-recipe" in err and "max_steps" not in err  # the budget may change
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--resume", "--quiet", "--train.lr=1e-4")
    assert code != 0 and "train.lr 0.001 -> 0.0001" in err  # an override alone, too
    assert saved_config(out).train.max_steps == 2  # nothing written by a refusal

    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--resume", "--quiet", "--train.lr=1e-4",
                       "--train.max_steps=3", "--change-recipe")
    assert code == 0, err
    assert saved_config(out).train.lr == 1e-4
    assert "resumed with a changed recipe (--change-recipe): train.lr 0.001 -> 0.0001" in \
        (out / "train.log").read_text()


def test_change_recipe_needs_resume(capsys, tmp_path, started):
    _, data, _ = started
    code, _, err = run(capsys, "train", "--data", data, "--out", tmp_path / "new", "--change-recipe", "--quiet")
    assert code != 0 and "needs --resume" in err


def test_resume_refuses_a_tokenizer_prepared_again_on_other_text(capsys, tmp_path, corpus_files, started):
    _, data, out = started
    other = {}
    for split, (de, en) in corpus_files.items():  # the same English, the German in capitals: other pieces
        other[split] = (tmp_path / "other" / de.name, tmp_path / "other" / en.name)
        other[split][0].parent.mkdir(exist_ok=True)
        other[split][0].write_text(de.read_text(encoding="utf-8").upper(), encoding="utf-8")
        other[split][1].write_text(en.read_text(encoding="utf-8"), encoding="utf-8")
    prepare(capsys, other, data, "--force")  # the same vocabulary size
    code, _, err = run(capsys, "train", "--data", data, "--out", out, "--resume", "--quiet", "--train.max_steps=3")
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "other tokenizers" in err and str(data) in err
    assert load_checkpoint(out / "checkpoints" / "last.safetensors").train_state["step"] == 2


def test_resume_refuses_another_training_split_of_the_same_tokenizer(started, tmp_path):
    _, data, out = started
    cfg = saved_config(out)
    trimmed = tmp_path / "trimmed"
    shutil.copytree(data, trimmed)  # the same tokenizer, half the training pairs
    split = load_split(data, "train")
    half = [split.pair(i) for i in range(len(split) // 2)]
    EncodedSplit.from_pairs([s.tolist() for s, _ in half], [t.tolist() for _, t in half]).save(
        trimmed / "train.safetensors")
    with pytest.raises(AttnkitError, match="other data"):
        Trainer(cfgmod.replace(cfg, train=cfgmod.replace(cfg.train, max_steps=3)), trimmed, out, resume=True,
                progress=False)


def test_the_api_refuses_another_recipe_and_accepts_it_when_asked(tmp_path, data_dir):
    Trainer(tiny_run_config(max_steps=2), data_dir, tmp_path / "r", progress=False).fit()
    with pytest.raises(AttnkitError, match=r"train.lr 0.003 -> 0.001"):
        Trainer(tiny_run_config(max_steps=4, lr=1e-3), data_dir, tmp_path / "r", resume=True, progress=False)
    resumed = Trainer(tiny_run_config(max_steps=4, lr=1e-3), data_dir, tmp_path / "r", resume=True,
                      progress=False, change_recipe=True)
    assert resumed.state.step == 2 and resumed.cfg.train.lr == 1e-3


def test_resume_of_an_empty_folder_without_config_is_refused(capsys, tmp_path, data_dir):
    code, _, err = run(capsys, "train", "--data", data_dir, "--out", tmp_path / "nothing", "--resume", "--quiet")
    assert code != 0 and "no run to resume" in err and "--config" in err


def test_lm_resume_refuses_a_vocabulary_prepared_again(capsys, tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("abcab cabba\n" * 40)
    data, out = tmp_path / "data", tmp_path / "run"
    code, _, err = run(capsys, "lm", "prepare", "--train", text, "--valid-fraction", "0.1", "--level", "char",
                       "--out", data)
    assert code == 0, err
    code, _, err = run(capsys, "lm", "train", "--data", data, "--out", out, "--quiet", "--config", "lm-char-small-xl",
                       *[f"--{o}" for o in LM_TINY])
    assert code == 0, err
    text.write_text("xyzxy zyxxz\n" * 40)  # as many characters (so the same vocabulary size), other ones
    code, _, err = run(capsys, "lm", "prepare", "--train", text, "--valid-fraction", "0.1", "--level", "char",
                       "--out", data, "--force")
    assert code == 0, err
    code, _, err = run(capsys, "lm", "train", "--data", data, "--out", out, "--quiet", "--resume",
                       "--train.max_steps=3")
    assert code != 0 and "other tokenizers" in err and len(err.strip().splitlines()) == 1, err
