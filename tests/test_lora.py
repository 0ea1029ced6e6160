"""LoRA fine-tuning (`attnkit train --init-from CKPT --train.lora_r=R`, attnkit.nn.lora): at step 0 the adapted
model is the base model, only the adapters train, the merged model computes what the adapted one does, a run resumes
exactly through the CLI, its checkpoints are plain models that translate, export and run int8, and bad keys are
one-line errors."""

from __future__ import annotations

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import load_checkpoint, model_from
from attnkit.cli.main import main
from attnkit.config import RNNConfig, TransformerConfig
from attnkit.cpu import for_inference, int8_unavailable
from attnkit.data import TokenBatchSampler, load_split
from attnkit.data.batching import iterate_batches
from attnkit.errors import ConfigError
from attnkit.models import build_model
from attnkit.nn.lora import LowRank, adapter_parameters, add_lora, merged, merged_state
from attnkit.train.finetune import fine_tuning_config
from attnkit.train.trainer import Trainer

# a learning rate well above the finetune preset's, so that a few updates move B visibly away from zero
TINY = ["--train.device=cpu", "--train.dtype=float32", "--train.eval_bleu=false", "--train.max_tokens=300",
        "--train.warmup=2", "--train.lr=0.003"]
LORA = ["--train.lora_r=4", "--train.lora_alpha=8"]


@pytest.fixture(scope="module")
def own_data(tmp_path_factory, corpus_files, trained_checkpoint):
    """The number corpus encoded with the pretrained model's tokenizers (tests/test_finetune.py's own_data)."""
    out = tmp_path_factory.mktemp("lora") / "data"
    prefix = corpus_files["train"][0].with_suffix("")
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--valid", prefix.parent / "valid",
                 "--out", out, "--tokenizer-from", trained_checkpoint]) == 0
    return out


def train_cli(data, out, steps: int, *extra) -> None:
    argv = ["train", "--data", data, "--out", out, "--quiet", f"--train.max_steps={steps}", *TINY, *extra]
    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, own_data, trained_checkpoint):
    """A LoRA fine-tuning run of six updates through the CLI; returns its run folder."""
    out = tmp_path_factory.mktemp("lora") / "run"
    train_cli(own_data, out, 6, "--init-from", trained_checkpoint, *LORA)
    return out


def first_batch(data_dir):
    split = load_split(data_dir, "valid")
    sampler = TokenBatchSampler(split.src_lens, split.tgt_lens, 300, shuffle=False)
    return next(iter(iterate_batches(split, sampler.batches(0))))


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(batch.src, batch.tgt_in)  # (B, T, V)


def test_at_step_0_the_adapted_model_is_the_base_model_and_only_adapters_train(tmp_path, own_data,
                                                                                trained_checkpoint):
    trainer = Trainer(fine_tuning_config(trained_checkpoint, ["finetune"], [*TINY, *LORA]), own_data,
                      tmp_path / "run", progress=False)
    model, batch = trainer.model, first_batch(own_data)
    base = model_from(load_checkpoint(trained_checkpoint), trained_checkpoint)
    assert torch.equal(logits(model, batch), logits(base, batch))
    adapters = adapter_parameters(model)
    # an A and a B for every attention's [q; k; v] and W^O and both FFN products: 4 weights an encoder layer, 6 a
    # decoder layer (its cross-attention too)
    n_layers = trainer.cfg.model.n_encoder_layers, trainer.cfg.model.n_decoder_layers
    assert len(adapters) == 2 * (4 * n_layers[0] + 6 * n_layers[1])
    assert all(torch.equal(m.lora_B, torch.zeros_like(m.lora_B)) for m in model.modules() if isinstance(m, LowRank))
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in adapters}
    in_optimizer = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert sorted(map(id, in_optimizer)) == sorted(map(id, adapters))
    model.train()
    loss, _, _ = trainer.objective(batch)
    loss.backward()
    lowrank = [m for m in model.modules() if isinstance(m, LowRank)]
    assert all(m.lora_B.grad.abs().sum() > 0 for m in lowrank)  # A's gradient is B^T (...): zero while B is
    assert all(m.lora_A.grad is not None for m in lowrank)
    assert all(p.grad is None for p in model.parameters() if all(p is not a for a in adapters))


def test_after_training_the_base_weights_are_the_checkpoints_and_the_merge_computes_the_same(tmp_path, own_data,
                                                                                            trained_checkpoint):
    cfg = fine_tuning_config(trained_checkpoint, ["finetune"], [*TINY, *LORA, "--train.max_steps=4"])
    trainer = Trainer(cfg, own_data, tmp_path / "run", progress=False)
    trainer.fit()
    model, batch = trainer.model, first_batch(own_data)
    assert all(m.lora_B.abs().min() > 0 for m in model.modules() if isinstance(m, LowRank))  # every B has trained
    start, now = load_checkpoint(trained_checkpoint).model_state, model.state_dict()
    for name, value in start.items():  # frozen: as the checkpoint had them, adapted weights under their original
        original = name.replace(".weight", ".parametrizations.weight.original")
        assert torch.equal(now.get(name, now.get(original)), value), name
    adapted = logits(model, batch)
    base = logits(model_from(load_checkpoint(trained_checkpoint), trained_checkpoint), batch)
    assert (adapted - base).abs().max() > 1e-3  # the adapters changed what the model computes
    plain = merged(model)
    assert not any(isinstance(m, LowRank) for m in plain.modules())
    assert set(plain.state_dict()) == set(start)  # the base model's names, no adapter left
    torch.testing.assert_close(logits(plain, batch), adapted, atol=1e-5, rtol=0)
    assert any(isinstance(m, LowRank) for m in model.modules())  # merging a copy leaves the model adapted
    torch.testing.assert_close(logits(model, batch), adapted, atol=0, rtol=0)
    state = merged_state(model)
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())


def test_targets_adapt_their_own_rows_of_the_packed_projection():
    model = build_model("transformer", TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16,
                                                         n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert add_lora(model, 2, 4.0, ["q", "v"]) == 3  # the in_proj of the encoder's, decoder's and cross attention
    with torch.no_grad():
        for p in adapter_parameters(model):
            p.normal_()
    after, d = merged(model).state_dict(), 16
    for name in before:
        if name.endswith("in_proj.weight"):
            was, now = before[name].split(d), after[name].split(d)  # the [q; k; v] rows, (D, D) each
            assert not torch.equal(now[0], was[0]) and not torch.equal(now[2], was[2])  # q and v adapted
            assert torch.equal(now[1], was[1])  # k as it was
        else:  # W^O, the FFN, the embeddings: not targeted
            assert torch.equal(after[name], before[name]), name


def test_a_lora_run_through_the_cli_resumes_exactly(tmp_path, own_data, trained_checkpoint):
    train_cli(own_data, tmp_path / "straight", 4, "--init-from", trained_checkpoint, *LORA)
    train_cli(own_data, tmp_path / "halves", 2, "--init-from", trained_checkpoint, *LORA)
    train_cli(own_data, tmp_path / "halves", 4, "--resume")
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.safetensors", adapters=True)
            for run in ("straight", "halves"))
    assert a.train_state["step"] == b.train_state["step"] == 4 and b.config.train.lora_r == 4
    trained = [k for k in a.model_state if k.endswith(("lora_A", "lora_B"))]
    assert trained and a.model_state.keys() == b.model_state.keys()
    assert len(a.optimizer_state["state"]) == len(trained)  # Adam's moments for the adapters alone
    for name, value in a.model_state.items():
        assert torch.equal(b.model_state[name], value), name
    for index, moments in a.optimizer_state["state"].items():
        for name, value in moments.items():
            assert torch.equal(torch.as_tensor(b.optimizer_state["state"][index][name]), torch.as_tensor(value))


def test_the_runs_checkpoints_are_plain_models_that_translate_and_run_int8(lora_run, own_data, trained_checkpoint,
                                                                           corpus_files, tmp_path, capsys):
    best, last = (lora_run / "checkpoints" / f"{name}.safetensors" for name in ("best", "last"))
    plain_names = set(load_checkpoint(trained_checkpoint).model_state)
    assert set(load_checkpoint(best).model_state) == plain_names  # merged when saved
    assert set(load_checkpoint(last).model_state) == plain_names  # merged when loaded
    assert any(k.endswith(".lora_B") for k in load_checkpoint(last, adapters=True).model_state)  # for the resume
    batch = first_batch(own_data)
    run_logits = logits(model_from(load_checkpoint(best), best), batch)
    torch.testing.assert_close(logits(model_from(load_checkpoint(last), last), batch), run_logits, atol=1e-5, rtol=0)
    for ckpt in (best, last):
        out = tmp_path / f"{ckpt.stem}.en"
        assert main(["translate", "--checkpoint", str(ckpt), "--input", str(corpus_files["test"][0]), "--output",
                     str(out), "--device", "cpu"]) == 0
        assert len(out.read_text().splitlines()) == 30
    assert main(["translate", "--checkpoint", str(best), str(trained_checkpoint), "--input",
                 str(corpus_files["test"][0]), "--device", "cpu"]) == 0  # an ensemble with its base model
    assert len(capsys.readouterr().out.splitlines()) == 30
    if int8_unavailable():
        return
    model = model_from(load_checkpoint(best), best).eval()
    quantised = logits(for_inference(model, int8=True), batch)
    assert (quantised - run_logits).abs().max() / run_logits.abs().max() < 0.05


def test_the_runs_best_checkpoint_exports_to_ctranslate2(lora_run, corpus_files, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason="the CTranslate2 export needs the ctranslate2 package")
    best = lora_run / "checkpoints" / "best.safetensors"
    assert main(["export", "--checkpoint", str(best), "--out", str(tmp_path / "ct2")]) == 0
    outputs = []
    for engine, model in (("attnkit", best), ("ctranslate2", tmp_path / "ct2")):
        capsys.readouterr()
        assert main(["translate", "--engine", engine, "--checkpoint", str(model), "--input",
                     str(corpus_files["test"][0]), "--device", "cpu"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 30


@pytest.mark.parametrize("overrides, message", [
    (["--train.lora_r=-1"], "train.lora_r must be 0 (off) or a positive rank, not -1"),
    (["--train.lora_r=4", "--train.lora_targets=[q, x]"], "train.lora_targets: unknown target 'x'"),
    (["--train.lora_targets=[ffm]"], "train.lora_targets: unknown target 'ffm'; did you mean 'ffn'?"),
    (["--train.lora_r=4", "--train.lora_alpha=0"], "train.lora_alpha must be a positive number, not 0.0"),
])
def test_bad_lora_keys_are_one_line_config_errors(trained_checkpoint, overrides, message):
    with pytest.raises(ConfigError) as e:
        fine_tuning_config(trained_checkpoint, ["finetune"], overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lora_without_a_trained_model_or_on_a_model_without_its_targets_is_one_line():
    with pytest.raises(ConfigError, match=r"train.lora_r adapts a trained model: start the run with `attnkit "
                                          r"train --init-from CHECKPOINT`$"):
        cfgmod.resolve(["transformer-small"], ["train.lora_r=4"])
    rnn = build_model("rnn-bahdanau", RNNConfig(src_vocab_size=40, tgt_vocab_size=40, embed_dim=8, hidden=8))
    with pytest.raises(ConfigError, match="this BahdanauSeq2Seq has no such projection") as e:
        add_lora(rnn, 4, 8.0, ["q", "v"])
    assert "\n" not in str(e.value)
    assert all(p.requires_grad for p in rnn.parameters())  # refused before anything was frozen
