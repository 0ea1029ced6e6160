"""`train.dtype: auto`: the choice on every kind of device and CPU, and a probe that leaves no trace."""

from __future__ import annotations

import contextlib

import pytest
import torch
import yaml

from attnkit import config as cfgmod
from attnkit.cpu import process
from attnkit.errors import ConfigError
from attnkit.train import precision
from attnkit.train.lm_trainer import LMTrainer
from attnkit.train.precision import BF16_MARGIN, choose_dtype
from attnkit.train.trainer import Trainer
from conftest import LM_TEXT, LM_TINY, linear_rows, tiny_model_config, tiny_run_config

CPU = torch.device("cpu")


def fake_timing(monkeypatch, **seconds: float) -> None:
    """precision.timed answers `seconds[dtype]` for every timed round (the untimed rounds still run the passes)."""
    monkeypatch.setattr(precision, "timed", lambda passes, dtype: seconds[dtype])


@pytest.mark.parametrize(("bf16", "chosen"), [(0.5, "bfloat16"), (BF16_MARGIN - 0.01, "bfloat16"),
                                              (BF16_MARGIN + 0.01, "float32"), (1.3, "float32")])
def test_a_cpu_with_bf16_instructions_times_both_and_needs_a_clear_bf16_win(monkeypatch, bf16, chosen):
    monkeypatch.setattr(process, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    fake_timing(monkeypatch, float32=1.0, bfloat16=bf16)
    warmed = []
    choice = choose_dtype(CPU, warmed.append)
    assert choice.dtype == chosen
    assert warmed == ["float32", "bfloat16"]  # one untimed round each, before the timed ones
    assert f"{bf16:.2f}x" in choice.why and choice.why.startswith(f"train.dtype auto: {chosen}")


def test_unknown_flags_are_timed_and_the_ranks_decide_on_their_sums(monkeypatch):
    monkeypatch.setattr(process, "cpu_flags", set)  # not Linux: the flags say nothing
    fake_timing(monkeypatch, float32=1.0, bfloat16=0.5)
    assert choose_dtype(CPU, lambda dtype: None).dtype == "bfloat16"
    other_rank_slow_in_bf16 = lambda f32, bf16: [f32 + 1.0, bf16 + 2.0]  # noqa: E731 - sums over two ranks
    assert choose_dtype(CPU, lambda dtype: None, other_rank_slow_in_bf16).dtype == "float32"


@pytest.mark.parametrize("flags", [{"avx2", "fma"}, {"avx512f", "avx512bw"}])
def test_a_cpu_without_bf16_instructions_gets_float32_untimed(monkeypatch, flags):
    monkeypatch.setattr(process, "cpu_flags", lambda: flags)
    choice = choose_dtype(CPU, lambda dtype: pytest.fail("timed on a CPU that emulates bf16"))
    assert (choice.dtype, choice.seconds) == ("float32", 0.0) and "no bf16 instructions" in choice.why


@pytest.mark.parametrize("supported", [True, False])
def test_cuda_follows_the_gpu_and_other_devices_stay_float32(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    never = lambda dtype: pytest.fail("timed on a GPU")  # noqa: E731
    assert choose_dtype(torch.device("cuda"), never).dtype == ("bfloat16" if supported else "float32")
    assert choose_dtype(torch.device("mps"), never).dtype == "float32"


def test_auto_is_a_dtype_but_not_beside_compile():
    assert cfgmod.TrainConfig(dtype="auto").dtype == "auto"
    with pytest.raises(ConfigError, match="float32, bfloat16 or auto, not 'float16'"):
        cfgmod.TrainConfig(dtype="float16")
    with pytest.raises(ConfigError, match="compiling the model twice"):
        cfgmod.TrainConfig(dtype="auto", compile=True)


# --- the probe leaves no trace: a run with auto trains as the run given the dtype it chose -------------------------
def seq2seq_run(tmp_path, data_dir, name: str, dtype: str, steps: int = 6, **kw) -> Trainer:
    cfg = tiny_run_config(max_steps=steps, dtype=dtype)  # dropout 0.1: the probe must give the RNG back
    cfg = cfgmod.replace(cfg, model=tiny_model_config(dropout=0.1, variant="batch-norm"))  # and BatchNorm's statistics
    trainer = Trainer(cfg, data_dir, tmp_path / name, progress=False, **kw)
    trainer.fit()
    return trainer


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("chosen", ["bfloat16", "float32"])
def test_a_seq2seq_run_with_auto_trains_exactly_as_with_the_dtype_it_chose(tmp_path, data_dir, monkeypatch, chosen):
    monkeypatch.setattr(process, "cpu_flags", lambda: {"avx512_bf16"})
    fake_timing(monkeypatch, float32=1.0, bfloat16=0.5 if chosen == "bfloat16" else 2.0)
    auto = seq2seq_run(tmp_path, data_dir, "auto", "auto")
    given = seq2seq_run(tmp_path, data_dir, "given", chosen)
    assert_same_weights(auto.model, given.model)
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["train"]["dtype"] == chosen
    assert f"train.dtype auto: {chosen} (" in (tmp_path / "auto" / "train.log").read_text()


def test_the_probe_counts_against_the_budget_and_a_resume_keeps_the_choice(tmp_path, data_dir, monkeypatch):
    monkeypatch.setattr(process, "cpu_flags", lambda: {"avx512_bf16"})
    fake_timing(monkeypatch, float32=1.0, bfloat16=0.5)
    cfg = tiny_run_config(max_steps=3, dtype="auto")
    fresh = Trainer(cfg, data_dir, tmp_path / "run", progress=False)
    assert fresh.state.elapsed_s > 0  # the untimed passes' seconds, before any update
    assert Trainer(tiny_run_config(max_steps=3), data_dir, tmp_path / "f32", progress=False).state.elapsed_s == 0
    fresh.fit()
    fake_timing(monkeypatch, float32=0.5, bfloat16=1.0)  # the machine now favours float32: the run must not switch
    resumed = Trainer(tiny_run_config(max_steps=6, dtype="auto"), data_dir, tmp_path / "run", resume=True,
                      progress=False)
    assert resumed.cfg.train.dtype == "bfloat16"
    resumed.fit()
    assert "train.dtype auto: bfloat16, as chosen at the run's start" in (tmp_path / "run" / "train.log").read_text()


def test_a_language_model_run_with_auto_trains_exactly_as_with_the_dtype_it_chose(tmp_path, monkeypatch):
    from attnkit.data.lm import prepare_lm

    monkeypatch.setattr(process, "cpu_flags", lambda: {"amx_bf16"})
    fake_timing(monkeypatch, float32=1.0, bfloat16=0.5)
    (tmp_path / "text.txt").write_text(LM_TEXT * 4, encoding="utf-8")
    prepare_lm(tmp_path / "data", tmp_path / "text.txt", level="char", valid_fraction=0.2)
    runs = {}
    for dtype in ("auto", "bfloat16"):
        cfg = cfgmod.resolve(["lm-char-small-xl"], [*LM_TINY, "train.max_steps=4", "model.dropout=0.1",
                                                    f"train.dtype={dtype}"], cls=cfgmod.LMRunConfig)
        runs[dtype] = LMTrainer(cfg, tmp_path / "data", tmp_path / dtype, progress=False)
        runs[dtype].fit()
    assert runs["auto"].cfg.train.dtype == "bfloat16"
    assert_same_weights(runs["auto"].model, runs["bfloat16"].model)


# --- the probe does the first batches' work, in float32 in row slices (half the activations a float32 pass holds) --
@pytest.mark.parametrize("rows", [1, 2, 5, 64])
def test_probe_parts_cover_every_row_once_sliced_in_float32_and_whole_in_bfloat16(rows):
    """bfloat16 runs a batch whole, as a step does: oneDNN's kernels are built per shape, more of them per batch than
    its cache keeps, so slices would build them twice (on an AMX Xeon, Tatoeba's probe said 0.95-1.10x, its steps
    0.75-0.82x)."""
    for dtype, most in (("float32", precision.PROBE_PARTS), ("bfloat16", 1)):
        parts = precision.probe_parts(rows, dtype)
        assert 1 <= len(parts) <= most and (len(parts) > 1) == (dtype == "float32" and rows > 1)
        assert [i for s in parts for i in range(rows)[s]] == list(range(rows))


def probe_and_whole_gradients(model: torch.nn.Module, probe, whole) -> tuple[dict, dict]:
    """The gradients one float32 round of probe passes leaves, and those of `whole()` (the unsliced batches)."""
    out = []
    for run in (lambda: probe("float32"), whole):
        model.zero_grad(set_to_none=True)
        run()
        out.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    return out[0], out[1]


def assert_same_gradients(sliced: dict, whole: dict) -> None:
    assert sliced.keys() == whole.keys() and whole
    for name, grad in whole.items():
        torch.testing.assert_close(sliced[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_seq2seq_probe_does_the_first_batches_work_in_row_slices(tmp_path, data_dir):
    from attnkit.data import iterate_batches
    cfg = cfgmod.replace(tiny_run_config(max_steps=1), model=tiny_model_config(dropout=0.0))
    trainer = Trainer(cfg, data_dir, tmp_path / "run", progress=False)
    first = trainer.sampler.batches(0)[: precision.PROBE_BATCHES]
    assert sum(len(precision.probe_parts(len(rows), "float32")) for rows in first) > len(first)  # the slicing happens

    def whole() -> None:
        for batch in iterate_batches(trainer.train_split, first):
            loss, _, aux = trainer.batch_losses(trainer.objective, batch, "float32")
            (loss + aux).backward()
    assert_same_gradients(*probe_and_whole_gradients(trainer.model, trainer.precision_passes(), whole))


def test_the_seq2seq_probe_runs_whole_batches_in_bfloat16_and_slices_in_float32(tmp_path, data_dir, monkeypatch):
    from attnkit.data import iterate_batches
    from attnkit.train import trainer as trainer_module

    trainer = Trainer(tiny_run_config(max_steps=1), data_dir, tmp_path / "run", progress=False)
    first = trainer.sampler.batches(0)[: precision.PROBE_BATCHES]
    wholes = [tuple(b.src.shape) for b in iterate_batches(trainer.train_split, first)]  # (B, S) each
    seen = []  # the (rows, source length) of each batch a probe pass runs
    losses = trainer_module.training_losses
    monkeypatch.setattr(trainer_module, "training_losses",
                        lambda model, b, eps, rows: seen.append(tuple(b.src.shape)) or losses(model, b, eps, rows))
    passes = trainer.precision_passes()
    with precision.no_trace(trainer.model):
        passes("bfloat16")
        assert seen == wholes
        seen.clear()
        passes("float32")
    assert len(seen) > len(wholes) and sum(rows for rows, _ in seen) == sum(rows for rows, _ in wholes)


def test_the_language_model_probe_does_the_first_segments_work_in_row_slices(tmp_path):
    from attnkit.data.lm import prepare_lm

    (tmp_path / "text.txt").write_text(LM_TEXT * 4, encoding="utf-8")
    prepare_lm(tmp_path / "data", tmp_path / "text.txt", level="char", valid_fraction=0.2)
    cfg = cfgmod.resolve(["lm-char-small-xl"], [*LM_TINY, "model.dropout=0.0", "model.attention_dropout=0.0"],
                         cls=cfgmod.LMRunConfig)
    trainer = LMTrainer(cfg, tmp_path / "data", tmp_path / "run", progress=False)
    segments = trainer.first_segments()  # (x, y), each (B, T)
    assert len(segments) > 1 and len(segments[0][0]) > 1  # the memory flows, the rows are sliced

    def whole() -> None:
        mems = None
        for x, y in segments:
            nll, mems = trainer.segment_nll(trainer.model, x, y, mems, "float32")
            nll.backward()
    assert_same_gradients(*probe_and_whole_gradients(trainer.model, trainer.precision_passes(), whole))


# --- where kernel builds are costly (AMX), bf16 training keeps its products' shapes: the linear maps run on the
# token budget's rows and attention multiplies in float32 ------------------------------------------------------------
def test_a_bf16_step_on_amx_keeps_its_product_shapes_and_trains_as_without(tmp_path, data_dir, monkeypatch):
    from attnkit.cpu import attention as attention_module
    from attnkit.cpu import training as training_module

    rows = linear_rows(monkeypatch, training_only=True)  # not the evaluations
    widened = []  # the dtypes attention took float32 products on
    plain = attention_module.attend_float32
    monkeypatch.setattr(attention_module, "attend_float32", lambda q, *a, **kw: widened.append(q.dtype) or plain(q, *a,
                                                                                                              **kw))
    runs = {}
    for costly in (False, True):
        monkeypatch.setattr(training_module, "kernel_builds_costly", lambda device, dtype, costly=costly: costly)
        rows.clear()
        widened.clear()
        runs[costly] = seq2seq_run(tmp_path, data_dir, f"costly-{costly}", "bfloat16", steps=4)
        trained = set(rows)  # the row counts the steps' products ran on
        budget = runs[costly].cfg.train.max_tokens
        assert trained == {budget} if costly else len(trained) > 1 and max(trained) <= budget
        assert set(widened) == ({torch.bfloat16} if costly else set())
    # The zero rows change nothing: the same run with the rows as they come (attention in float32 on both sides).
    monkeypatch.setattr(training_module.TrainingScope, "precision", lambda scope, dtype: contextlib.nullcontext())
    unpadded = seq2seq_run(tmp_path, data_dir, "unpadded", "bfloat16", steps=4)
    for (name, a), b in zip(unpadded.model.state_dict().items(), runs[True].model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0.02, atol=2e-3, msg=name)
