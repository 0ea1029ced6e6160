"""Fine-tuning (`attnkit prepare --tokenizer-from`, `attnkit train --init-from`): new data keeps the checkpoint's ids,
the run starts from the checkpoint's weights and so its dev loss, a mismatch of tokenizers or of architecture is
refused in one line, and a fine-tuning run resumes exactly."""

from __future__ import annotations

import pytest
import torch
import yaml

from attnkit.checkpoint import checkpoint_tokenizers, load_checkpoint, model_from
from attnkit.cli.main import main
from attnkit.data import TokenBatchSampler, load_split, load_tokenizers, prepare
from attnkit.data.batching import iterate_batches
from attnkit.errors import AttnkitError, ConfigError
from attnkit.train.finetune import fine_tuning_config
from attnkit.train.trainer import Trainer, model_losses

TINY = ["--train.device=cpu", "--train.dtype=float32", "--train.eval_bleu=false", "--train.max_tokens=300",
        "--train.warmup=2"]


@pytest.fixture(scope="module")
def pretrained(trained_checkpoint):
    return trained_checkpoint


@pytest.fixture(scope="module")
def own_data(tmp_path_factory, corpus_files, pretrained):
    """The number corpus encoded with the pretrained model's tokenizers (a new domain would be other files)."""
    out = tmp_path_factory.mktemp("finetune") / "data"
    prefix = corpus_files["train"][0].with_suffix("")
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--valid", prefix.parent / "valid",
                 "--out", out, "--tokenizer-from", pretrained]) == 0
    return out


def test_prepare_with_the_checkpoints_tokenizers_keeps_its_ids(own_data, trained, pretrained):
    src, tgt = load_tokenizers(own_data)
    theirs = checkpoint_tokenizers(pretrained)
    assert src.to_bytes() == theirs[0].to_bytes() and tgt.to_bytes() == theirs[1].to_bytes()
    assert (src is tgt) == (theirs[0] is theirs[1])
    mine, original = load_split(own_data, "valid"), load_split(trained[0], "valid")  # the same files, the same ids
    for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"):
        assert (getattr(mine, name) == getattr(original, name)).all()


def dev_loss(model, data_dir, label_smoothing: float) -> float:
    """The label-smoothed dev loss per token, written out: every dev batch through `model_losses`."""
    split, loss, tokens = load_split(data_dir, "valid"), 0.0, 0
    sampler = TokenBatchSampler(split.src_lens, split.tgt_lens, 300, shuffle=False)
    with torch.no_grad():
        for batch in iterate_batches(split, sampler.batches(0)):
            loss += model_losses(model.eval(), batch, label_smoothing)[0].item()
            tokens += batch.n_tokens
    return loss / tokens


def test_the_run_starts_from_the_checkpoints_weights_and_dev_loss(tmp_path, own_data, pretrained):
    cfg = fine_tuning_config(pretrained, ["finetune"], TINY)
    trainer = Trainer(cfg, own_data, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(pretrained)
    assert trainer.cfg.model == ckpt.config.model and trainer.cfg.train.init_from == str(pretrained)
    for name, value in ckpt.model_state.items():
        assert torch.equal(trainer.model.state_dict()[name], value), name
    expected = dev_loss(model_from(ckpt, pretrained), own_data, cfg.train.label_smoothing)
    assert trainer.evaluate()["loss"] == pytest.approx(expected, abs=1e-6)


def test_data_with_other_tokenizers_is_refused(tmp_path, corpus_files, pretrained):
    other = tmp_path / "other"
    prepare(other, corpus_files["train"], corpus_files["valid"], vocab_size=90)  # a tokenizer of its own
    cfg = fine_tuning_config(pretrained, ["finetune"], TINY)
    with pytest.raises(AttnkitError) as e:
        Trainer(cfg, other, tmp_path / "run", progress=False)
    assert "prepare it with `attnkit prepare --tokenizer-from" in str(e.value) and "\n" not in str(e.value)


def test_the_architecture_stays_the_checkpoints_and_dropout_may_change(pretrained):
    with pytest.raises(AttnkitError, match=r"keeps its model, but the presets or overrides change it: model.d_model "
                                           r"16 -> 32"):
        fine_tuning_config(pretrained, ["finetune"], ["--model.d_model=32"])
    with pytest.raises(AttnkitError, match="model.d_model 16 -> 256; model.n_heads 2 -> 4"):
        fine_tuning_config(pretrained, ["multi30k"], [])  # a from-scratch preset brings its own architecture
    assert fine_tuning_config(pretrained, ["finetune"], ["--model.dropout=0.3"]).model.dropout == 0.3


def test_a_fine_tuning_run_through_the_cli_resumes_exactly(tmp_path, own_data, pretrained, capsys):
    def train(out, steps, *extra):
        argv = ["train", "--data", own_data, "--out", out, "--quiet", f"--train.max_steps={steps}", *TINY, *extra]
        assert main(argv) == 0

    train(tmp_path / "straight", 4, "--init-from", pretrained)
    train(tmp_path / "halves", 2, "--init-from", pretrained)
    train(tmp_path / "halves", 4, "--resume")
    assert yaml.safe_load((tmp_path / "halves" / "config.yaml").read_text())["train"]["init_from"] == str(pretrained)
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.safetensors") for run in ("straight", "halves"))
    assert a.train_state["step"] == b.train_state["step"] == 4
    start = load_checkpoint(pretrained).model_state
    assert any(not torch.equal(a.model_state[k], start[k]) for k in start)  # it trained
    for name, value in a.model_state.items():
        assert torch.equal(b.model_state[name], value), name
    capsys.readouterr()
    assert main(["train", "--data", own_data, "--out", tmp_path / "halves", "--resume", "--init-from", pretrained]) == 2
    assert "--init-from starts a fine-tuning run; --resume continues one" in capsys.readouterr().err


def test_frozen_parts_stay_as_the_checkpoint_had_them(tmp_path, own_data, pretrained):
    cfg = fine_tuning_config(pretrained, ["finetune"], [*TINY, "--train.freeze=[src_embed, encoder]",
                                                         "--train.max_steps=3"])
    trainer = Trainer(cfg, own_data, tmp_path / "run", progress=False)
    trainer.fit()
    start = load_checkpoint(pretrained).model_state
    now = trainer.model.state_dict()
    frozen = [k for k in start if k.startswith(("src_embed.", "encoder."))]
    assert frozen and all(torch.equal(now[k], start[k]) for k in frozen)
    assert any(not torch.equal(now[k], start[k]) for k in start if k.startswith("decoder."))
    trained = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in trained for name, p in trainer.model.named_parameters() if name in frozen)


def test_freezing_a_part_the_model_lacks_is_one_line(tmp_path, own_data, pretrained):
    cfg = fine_tuning_config(pretrained, ["finetune"], [*TINY, "--train.freeze=[embeddings]"])
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, own_data, tmp_path / "run", progress=False)
    assert "train.freeze: embeddings is not a part of this Transformer (its parts with weights: src_embed, encoder, "\
        "decoder" in str(e.value)
