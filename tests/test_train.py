"""Losses, schedules, checkpoints and exact resumption."""

from __future__ import annotations

import csv
import math
import os

import numpy as np
import pytest
import torch

from attnkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from attnkit.config import TrainConfig
from attnkit.errors import ConfigError
from attnkit.models import Transformer
from attnkit.nn import cross_entropy
from attnkit.train.losses import label_smoothed_nll, smoothed_targets
from attnkit.train.metrics_log import MetricsLog
from attnkit.train.schedules import cosine, inverse_sqrt, make_schedule, noam
from attnkit.train.trainer import Trainer
from conftest import tiny_model_config, tiny_run_config


def test_label_smoothing_targets_for_three_classes():
    dist = smoothed_targets(torch.tensor([0, 2]), vocab_size=3, epsilon=0.1)
    torch.testing.assert_close(dist[0], torch.tensor([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3]))
    assert dist[0, 0].item() == pytest.approx(0.9333, abs=1e-4)
    assert dist[1, 0].item() == pytest.approx(0.0333, abs=1e-4)


def test_label_smoothed_loss_is_cross_entropy_against_smoothed_targets_ignoring_padding():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 4, 7), torch.tensor([[3, 5, 6, 0], [4, 0, 0, 0]])
    loss, nll = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=0)
    logp = logits.log_softmax(-1).view(-1, 7)
    keep = target.view(-1) != 0
    dist = smoothed_targets(target.view(-1), 7, 0.1)
    assert loss.item() == pytest.approx(-(dist * logp).sum(-1)[keep].sum().item(), rel=1e-5)
    assert nll.item() == pytest.approx(-logp[keep, target.view(-1)[keep]].sum().item(), rel=1e-5)


def plain_label_smoothed_nll(logits, target, epsilon, ignore_index=0):
    """The loss by autograd over a whole (N, V) log-softmax: the reference the chunked function must equal."""
    logp = logits.reshape(-1, logits.size(-1)).to(torch.float64).log_softmax(-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    v = logp.size(-1)  # the smoothed target distribution, in float64 too
    dist = torch.full_like(logp, epsilon / v).scatter_(1, target[:, None], 1.0 - epsilon + epsilon / v)
    return -(dist * logp).sum(-1)[keep].sum(), -logp.gather(1, target[:, None])[keep].sum()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1 << 20, 7 * 11], ids=["one-chunk", "chunks-of-7-rows"])
def test_chunked_smoothed_loss_equals_the_plain_one_in_value_and_gradient(dtype, chunk, monkeypatch):
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", chunk)  # V 11: 7 rows a chunk, the last chunk shorter
    torch.manual_seed(0)
    logits = (torch.randn(4, 9, 11, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    target = torch.randint(1, 11, (4, 9))
    target[1, 5:], target[3, 2:] = 0, 0
    reference = logits.detach().to(torch.float64).requires_grad_()
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    ref_loss, ref_nll = plain_label_smoothed_nll(reference, target, 0.1)
    tol = dict(atol=1e-9, rtol=1e-9) if dtype == torch.float64 else dict(atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(loss.double(), ref_loss, **tol)
    torch.testing.assert_close(nll.double(), ref_nll, **tol)
    (loss * 0.7).backward()  # a scaled upstream gradient, as the trainer's 1 / tokens
    (ref_loss * 0.7).backward()
    assert logits.grad.dtype == dtype and not logits.grad[target.eq(0)].any()
    grad_tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 4e-3}[dtype]
    torch.testing.assert_close(logits.grad.double(), reference.grad, atol=grad_tol, rtol=grad_tol)
    if dtype == torch.float64:
        z = logits.detach().requires_grad_()
        assert torch.autograd.gradcheck(lambda z: label_smoothed_nll(z, target, 0.1)[0], (z,))


def test_noam_schedule_matches_its_formula():
    d, warmup = 512, 4000
    for step in (1, 10, 1000, 3999, 4000, 4001, 20000, 100000):
        assert noam(step, d, warmup) == pytest.approx(d**-0.5 * min(step**-0.5, step * warmup**-1.5))
    sched = make_schedule("noam", lr=None, warmup=warmup, d_model=d)
    peak = max(range(1, 10000, 7), key=sched)
    assert abs(peak - warmup) <= 7
    assert sched(warmup) == pytest.approx(d**-0.5 * warmup**-0.5)
    scaled = make_schedule("noam", lr=1e-3, warmup=warmup, d_model=d)
    assert scaled(warmup) == pytest.approx(1e-3) and scaled(16000) == pytest.approx(5e-4)


def test_other_schedules():
    assert inverse_sqrt(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt(400, 1e-3, 100) == pytest.approx(5e-4)
    assert cosine(100, 1.0, 100, 1100) == pytest.approx(1.0)
    assert cosine(600, 1.0, 100, 1100) == pytest.approx(0.5)
    assert cosine(1100, 1.0, 100, 1100) == pytest.approx(0.0, abs=1e-12)


def test_checkpoint_round_trip_without_pickle(tmp_path):
    cfg = tiny_run_config()
    model = Transformer(tiny_model_config())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(4, 40, (2, 3)), torch.randint(4, 40, (2, 3))).sum().backward()
    opt.step()
    path, rng = tmp_path / "c.safetensors", torch.get_rng_state()
    save_checkpoint(path, Checkpoint("transformer", cfg, model.state_dict(), {"src": b"\x00spm"},
                                     {"step": 3}, opt.state_dict(), rng))
    ck = load_checkpoint(path)
    assert ck.kind == "transformer" and ck.train_state == {"step": 3} and ck.tokenizers == {"src": b"\x00spm"}
    assert ck.config == cfg
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ck.model_state[k], v)
    opt2 = torch.optim.Adam(Transformer(tiny_model_config()).parameters(), lr=1e-3)
    opt2.load_state_dict(ck.optimizer_state)
    restored = opt2.state_dict()["state"]
    for idx, entry in opt.state_dict()["state"].items():
        for name in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(restored[idx][name], entry[name])
    assert torch.equal(ck.rng_state, rng)


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_resume_gives_the_same_parameters_as_training_straight(tmp_path, data_dir):
    straight = Trainer(tiny_run_config(max_steps=14), data_dir, tmp_path / "a", progress=False)
    straight.fit()
    n_batches = len(straight.sampler.batches(0))
    assert 7 % n_batches > 0, "the stop must fall inside an epoch to test the data position"

    first = Trainer(tiny_run_config(max_steps=7), data_dir, tmp_path / "b", progress=False)
    first.fit()
    assert first.state.step == 7
    resumed = Trainer(tiny_run_config(max_steps=14), data_dir, tmp_path / "b", resume=True, progress=False)
    assert resumed.state.step == 7
    resumed.fit()
    assert resumed.state.step == 14
    a, b = _params(straight), _params(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


def _arrays(split) -> list[np.ndarray]:
    return [split.src_ids, split.src_offsets, split.tgt_ids, split.tgt_offsets]


def test_bpe_dropout_draws_a_segmentation_per_epoch_that_a_resume_reads_back(tmp_path, data_dir):
    first = Trainer(tiny_run_config(max_steps=3, bpe_dropout=0.2), data_dir, tmp_path / "r", progress=False)
    first.fit()
    assert first.state.epoch == 0 and first.state.batch_in_epoch > 0  # stopped inside epoch 1
    drawn, _ = first.epoch_data(0)
    plain = first.train_split
    assert first.src_tok.decode([list(drawn.pair(i)[0]) for i in range(len(plain))]) == \
        first.src_tok.decode([list(plain.pair(i)[0]) for i in range(len(plain))])
    assert drawn.src_ids.size > plain.src_ids.size  # other, finer pieces of the same sentences

    resumed = Trainer(tiny_run_config(max_epochs=2, bpe_dropout=0.2), data_dir, tmp_path / "r", resume=True,
                      progress=False)
    again, sampler = resumed.epoch_data(0)  # the file of epoch 1, not a new draw: same batches, same pieces
    for a, b in zip(_arrays(drawn), _arrays(again)):
        np.testing.assert_array_equal(a, b)
    assert sampler.batches(0) == first.epoch_data(0)[1].batches(0)
    resumed.fit()
    assert resumed.state.epoch == 2
    second, _ = resumed.epoch_data(1)
    assert second.src_ids.size != drawn.src_ids.size or not np.array_equal(second.src_ids, drawn.src_ids)

    fresh = Trainer(tiny_run_config(max_steps=1, bpe_dropout=0.2), data_dir, tmp_path / "r", force=True,
                    progress=False)
    assert not (tmp_path / "r" / "subwords").exists()  # --force: an earlier run's draws are not reused
    fresh.fit()


def test_training_reduces_loss_and_writes_the_run_folder(tmp_path, data_dir):
    trainer = Trainer(tiny_run_config(max_epochs=3, eval_bleu=True), data_dir, tmp_path / "run", progress=False)
    first = trainer.evaluate()["loss"]
    metrics = trainer.fit()
    assert metrics["loss"] < first and math.isfinite(metrics["ppl"]) and "bleu" in metrics
    for name in ("config.yaml", "metrics.csv", "train.log", "checkpoints/last.safetensors",
                 "checkpoints/best.safetensors"):
        assert (tmp_path / "run" / name).exists(), name
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    now, peak = ([float(r[k]) for r in rows] for k in ("rss_mb", "peak_rss_mb"))
    # the high-water mark is never below the present (within the kernel's batched per-CPU page counts)
    assert all(0 < a <= b + 4 for a, b in zip(now, peak, strict=True))
    assert peak == sorted(peak)  # and never falls


def test_a_resumed_log_from_before_the_peak_column_keeps_its_rows_and_gains_the_column(tmp_path):
    old = "split,step,epoch,loss,rss_mb\ntrain,5,0,3.5,800\ntrain,10,0,3.0,810\ntrain,15,0,2.5,820\n"
    (tmp_path / "metrics.csv").write_text(old)
    log = MetricsLog(tmp_path, resume_step=10, tensorboard=False)  # the killed run's step-15 row goes
    log.write("train", 15, epoch=0, loss=2.4)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["loss"], r["rss_mb"]) for r in rows[:2]] == [("5", "3.5", "800"), ("10", "3.0", "810")]
    assert rows[0]["peak_rss_mb"] == "" and float(rows[2]["peak_rss_mb"]) + 4 >= float(rows[2]["rss_mb"]) > 0


def test_a_folder_with_a_run_needs_resume_or_force(tmp_path, data_dir):
    Trainer(tiny_run_config(max_steps=2), data_dir, tmp_path / "r", progress=False).fit()
    with pytest.raises(Exception, match="--resume"):
        Trainer(tiny_run_config(max_steps=2), data_dir, tmp_path / "r", progress=False)
    Trainer(tiny_run_config(max_steps=2), data_dir, tmp_path / "r", force=True, progress=False)


def test_the_model_section_kind_picks_the_config_class():
    from attnkit import config as cfgmod
    from attnkit.errors import ConfigError

    cfg = cfgmod.resolve(["transformer-small"], ["model.kind=transformer"])
    assert isinstance(cfg.model, cfgmod.TransformerConfig) and cfg.model.d_model == 256
    assert cfgmod.from_dict(cfgmod.RunConfig, cfgmod.to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="model.kind: unknown model kind 'nope'"):
        cfgmod.resolve(["transformer-small"], ["model.kind=nope"])


# --- the fast paths: bf16 autocast and torch.compile (so they cannot rot) ----------------------------
def fit_without_dropout(tmp_path, data_dir, name: str, **train) -> Trainer:
    from attnkit import config as cfgmod

    cfg = tiny_run_config(max_steps=6, **train)
    cfg = cfgmod.replace(cfg, model=cfgmod.replace(cfg.model, dropout=0.0))  # compiled dropout draws other masks
    trainer = Trainer(cfg, data_dir, tmp_path / name, progress=False)
    trainer.fit()
    return trainer


def test_bf16_autocast_computes_in_bf16_and_trains_like_float32(tmp_path, data_dir, monkeypatch):
    dtypes, plain = [], torch.nn.functional.linear  # the dtype of every training product, the output layer's included

    def recording_linear(x, w, b=None):
        y = plain(x, w, b)
        if torch.is_grad_enabled():
            dtypes.append(y.dtype)
        return y

    monkeypatch.setattr(torch.nn.functional, "linear", recording_linear)
    f32 = fit_without_dropout(tmp_path, data_dir, "f32")
    assert set(dtypes) == {torch.float32}
    dtypes.clear()
    bf16 = fit_without_dropout(tmp_path, data_dir, "bf16", dtype="bfloat16")
    assert set(dtypes) == {torch.bfloat16}  # the matrix products ran in bf16
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # the master weights stay float32
    a, b = f32.evaluate()["loss"], bf16.evaluate()["loss"]
    assert abs(a - b) < 0.02 * a, (a, b)


# Inductor generates and compiles C++ for every kernel: minutes on 2 cores, so it runs on request
# (ATTNKIT_TEST_INDUCTOR=1); aot_eager captures the same graphs (dynamo + AOT autograd) without code generation.
INDUCTOR = pytest.param("inductor", marks=pytest.mark.skipif(not os.environ.get("ATTNKIT_TEST_INDUCTOR"),
                                                             reason="set ATTNKIT_TEST_INDUCTOR=1 (slow)"))


@pytest.mark.parametrize("backend", ["aot_eager", INDUCTOR])
def test_a_compiled_model_trains_like_the_eager_one(tmp_path, data_dir, backend):
    eager = fit_without_dropout(tmp_path, data_dir, "eager")
    compiled = fit_without_dropout(tmp_path, data_dir, backend, compile=True, compile_backend=backend)
    from attnkit.data import iterate_batches

    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())  # compiled in place: same names
    assert load_checkpoint(tmp_path / backend / "checkpoints" / "last.safetensors").train_state["step"] == 6
    a, b = eager.evaluate()["loss"], compiled.evaluate()["loss"]
    assert abs(a - b) < 0.01 * a, (a, b)  # Adam magnifies rounding differences in tiny gradients: compare losses
    compiled.model.load_state_dict(eager.model.state_dict())  # the same weights give the same outputs
    batch = next(iterate_batches(eager.train_split, eager.sampler.batches(0)[:1]))
    with torch.no_grad():
        torch.testing.assert_close(compiled.model(batch.src, batch.tgt_in), eager.model(batch.src, batch.tgt_in),
                                   rtol=1e-4, atol=1e-4)


def test_the_dev_figures_of_training_are_those_of_the_saved_weights(tmp_path, data_dir):
    """The dev BLEU / exact match / NLL logged after an epoch equal what a fresh process computes from the
    checkpoint saved then: no state of the training process (a stale prepacked weight after a fused
    optimizer step, autocast) leaks into them."""
    from attnkit.checkpoint import load_checkpoint
    from attnkit.data import read_lines
    from attnkit.decode import Translator
    from attnkit.eval import translate_and_score

    cfg = tiny_run_config(max_epochs=3, eval_bleu=True, lr=1e-2)
    logged = Trainer(cfg, data_dir, tmp_path / "run", progress=False).fit()
    last = tmp_path / "run" / "checkpoints" / "last.safetensors"
    sources, refs = read_lines(data_dir / "valid.src.txt"), read_lines(data_dir / "valid.tgt.txt")
    _, scores = translate_and_score(Translator.from_checkpoint(last, device="cpu"), sources, refs)
    assert (scores.bleu, scores.exact) == (logged["bleu"], logged["exact"])
    fresh = Trainer(cfg, data_dir, tmp_path / "fresh", progress=False)
    fresh.model.load_state_dict(load_checkpoint(last).model_state)
    assert fresh.evaluate()["nll"] == pytest.approx(logged["nll"], rel=1e-6)


def test_cosine_over_a_time_budget_goes_by_whichever_is_further():
    """horizon=time: the cosine is at its end when the budget is spent, even if few updates were made; by steps
    it is unchanged when the clock lags; with max_steps 0 only the clock counts."""
    fn = make_schedule("cosine", lr=1e-3, warmup=10, d_model=64, total=1000, by_time=True)
    assert fn(500, spent=0.0) == pytest.approx(cosine(500, 1e-3, 10, 1000))
    assert fn(20, spent=1.0) == pytest.approx(0.0, abs=1e-12)
    assert fn(20, spent=0.5) == pytest.approx(0.5e-3)
    assert fn(5, spent=0.9) == pytest.approx(0.5e-3)  # warm-up goes by updates
    clock_only = make_schedule("cosine", lr=1e-3, warmup=10, d_model=64, total=0, by_time=True)
    assert clock_only(10_000, spent=0.25) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(ConfigError, match="no horizon"):
        make_schedule("noam", lr=None, warmup=10, d_model=64, by_time=True)


def test_a_time_horizon_names_only_what_it_lacks():
    with pytest.raises(ConfigError, match=r"it needs train.max_minutes > 0 \(not 0\)$"):
        TrainConfig(schedule="cosine", horizon="time", max_minutes=0)
    with pytest.raises(ConfigError, match=r"it needs train.schedule cosine \(not noam\) or train.cooldown > 0$"):
        TrainConfig(schedule="noam", horizon="time", max_minutes=5)


def test_cooldown_falls_linearly_to_zero_over_the_last_share_of_the_horizon():
    """Warmup-stable-decay: the schedule is untouched until the last `fraction`, then scaled by a line to 0;
    over a time budget it goes by whichever of updates and clock is further on, like the cosine."""
    base = make_schedule("inverse_sqrt", lr=1e-3, warmup=100, d_model=64)
    fn = make_schedule("inverse_sqrt", lr=1e-3, warmup=100, d_model=64, total=1000, cooldown_fraction=0.2)
    for step in (1, 50, 400, 800):
        assert fn(step) == base(step)
    for step in (850, 900, 999):
        assert fn(step) == pytest.approx(base(step) * (1000 - step) / 200)
    assert fn(1000) == 0.0
    timed = make_schedule("constant", lr=2e-3, warmup=1, d_model=64, by_time=True, cooldown_fraction=0.25)
    assert timed(10**6, spent=0.5) == 2e-3  # with no max_steps only the clock counts
    assert timed(3, spent=0.875) == pytest.approx(1e-3)
    both = make_schedule("cosine", lr=1e-3, warmup=10, d_model=64, total=100, by_time=True, cooldown_fraction=0.5)
    assert both(80, spent=0.1) == pytest.approx(cosine(80, 1e-3, 10, 100) * 0.4)
    with pytest.raises(ConfigError, match="needs a horizon"):
        make_schedule("inverse_sqrt", lr=1e-3, warmup=10, d_model=64, cooldown_fraction=0.1)


def test_trainer_steps_with_the_cooldown(data_dir, tmp_path):
    """The lr each update used, as logged, follows the cooldown to 0 at max_steps."""
    cfg = tiny_run_config(schedule="constant", lr=1e-3, max_steps=20, cooldown=0.5, max_epochs=100)
    Trainer(cfg, data_dir, tmp_path / "run", progress=False).fit()
    with open(tmp_path / "run" / "metrics.csv") as f:
        lrs = {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f) if r["split"] == "train"}
    assert lrs[5] == lrs[10] == pytest.approx(1e-3)
    assert lrs[15] == pytest.approx(1e-3 * 5 / 10)
    assert lrs[20] == 0.0


def test_cooldown_is_validated():
    assert TrainConfig(schedule="inverse_sqrt", max_minutes=60, horizon="time", cooldown=0.2).cooldown == 0.2
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        TrainConfig(max_steps=10, cooldown=1.0)
    with pytest.raises(ConfigError, match="needs a horizon"):
        TrainConfig(schedule="inverse_sqrt", cooldown=0.2)


def test_time_horizon_needs_cosine_and_a_budget():
    from attnkit.config import LMTrainConfig

    assert LMTrainConfig(schedule="cosine", max_steps=0, max_minutes=5, horizon="time").horizon == "time"
    with pytest.raises(ConfigError, match="max_minutes > 0"):
        LMTrainConfig(schedule="cosine", max_steps=10, max_minutes=0, horizon="time")
    with pytest.raises(ConfigError, match="schedule cosine"):
        TrainConfig(schedule="noam", max_minutes=5, horizon="time")
    with pytest.raises(ConfigError, match="max_minutes > 0"):
        TrainConfig(schedule="noam", max_minutes=0, horizon="time", cooldown=0.1)
    with pytest.raises(ConfigError, match="steps or time"):
        LMTrainConfig(horizon="epochs")


@pytest.mark.parametrize("decay_vectors", [True, False])
def test_weight_decay_reaches_the_vectors_only_when_asked(tmp_path, data_dir, decay_vectors):
    """One AdamW step with zero gradients is the decay alone: every matrix shrinks by lr * wd; the biases and the
    LayerNorms' gains shrink too by default (fairseq's Adam) and stay as they are with decay_vectors false."""
    cfg = tiny_run_config(max_steps=1, weight_decay=0.5, decay_vectors=decay_vectors)
    trainer = Trainer(cfg, data_dir, tmp_path / "run", progress=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    for p in trainer.model.parameters():
        p.grad = torch.zeros_like(p)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.1
    trainer.optimizer.step()
    kinds = {p.dim() >= 2 for p in before.values()}
    assert kinds == {True, False}  # the model has both
    for name, p in trainer.model.named_parameters():
        decayed = p.dim() >= 2 or decay_vectors
        torch.testing.assert_close(p.detach(), before[name] * (0.95 if decayed else 1.0), msg=name)


def test_bf16_training_on_a_cpu_without_bf16_instructions_says_so(tmp_path, data_dir, monkeypatch):
    from attnkit.cpu import process

    monkeypatch.setattr(process, "cpu_flags", lambda: {"avx2", "fma"})
    Trainer(tiny_run_config(max_steps=1, dtype="bfloat16"), data_dir, tmp_path / "bf16", progress=False).fit()
    Trainer(tiny_run_config(max_steps=1), data_dir, tmp_path / "fp32", progress=False).fit()
    assert "no bf16 instructions" in (tmp_path / "bf16" / "train.log").read_text()
    assert "bf16" not in (tmp_path / "fp32" / "train.log").read_text()
