"""No lost work: kills and signals at random points, damaged and malicious checkpoints, NaN updates, full disks.

The kill test runs the real CLI in subprocesses; the rest drive `Trainer` in-process on the tiny corpus.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main
from attnkit.errors import AttnkitError, CheckpointError
from attnkit.train import base
from attnkit.train import trainer as trainer_mod
from attnkit.train.base import Interrupted
from attnkit.train.trainer import Trainer
from conftest import serve_extra, tiny_run_config

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_encoder_layers=2",
        "--model.n_decoder_layers=2", "--train.max_tokens=256", "--train.lr=3e-3", "--train.warmup=10",
        "--train.schedule=inverse_sqrt", "--train.eval_bleu=false", "--train.device=cpu", "--train.log_every=5",
        "--train.keep_epochs=0"]


def checkpoint_step(path: Path) -> int:
    """The training step recorded in a checkpoint's header (-1 while there is none to read)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(n))["__metadata__"]
        return json.loads(meta["train_state"])["step"]
    except (OSError, ValueError, KeyError):
        return -1


def train_process(data_dir: Path, out: Path, steps: int, *, resume: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "attnkit", "train", "--data", str(data_dir), "--out", str(out), "--quiet",
            f"--train.max_steps={steps}", "--train.save_every_steps=1", *TINY, *(["--resume"] if resume else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same threads, so the same float sums, in every run
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_runs_killed_at_random_points_end_with_the_weights_of_an_uninterrupted_run(tmp_path, data_dir):
    steps = 40
    straight = train_process(data_dir, tmp_path / "straight", steps, resume=False)
    assert straight.wait(timeout=300) == 0, straight.stderr.read()

    rng = random.Random(8)
    stops = [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGKILL]
    targets = sorted(rng.sample(range(2, steps - 8), len(stops)))
    last = tmp_path / "killed" / "checkpoints" / "last.safetensors"
    resumed_at = []  # the step each restart must continue from
    for i, (sig, target) in enumerate(zip(stops, targets)):
        proc = train_process(data_dir, tmp_path / "killed", steps, resume=i > 0)
        target = max([target] + [s + 1 for s in resumed_at])  # past the step this process starts from
        while checkpoint_step(last) < target and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))  # land anywhere: inside a step, a checkpoint write, an evaluation
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:  # a final checkpoint, one line, exit code 128 + N
            assert code == 128 + sig, err
            # beside the resume notes (a kill between the two renames of a save makes one), one line
            lines = [x for x in err.strip().splitlines() if not x.startswith(("attnkit: warning:", "attnkit: resumed"))]
            assert len(lines) == 1 and lines[0].startswith(f"attnkit: stopped by {sig.name} at step "), err
            assert checkpoint_step(last) == int(lines[0].split(" at step ")[1].split(";")[0])
        # A kill between the two renames of a save leaves only prev.safetensors: the restart uses it.
        resumed_at.append(max(checkpoint_step(last), checkpoint_step(last.with_name("prev.safetensors"))))
    resumed = train_process(data_dir, tmp_path / "killed", steps, resume=True)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    log = (tmp_path / "killed" / "train.log").read_text()
    assert all(f"resuming at step {s}," in log for s in resumed_at), (resumed_at, log)  # not a fresh start
    assert resumed_at == sorted(set(resumed_at)) and resumed_at[0] >= targets[0] and resumed_at[-1] < steps

    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.safetensors")
    b = load_checkpoint(last)
    assert a.train_state["step"] == b.train_state["step"] == steps
    assert a.model_state.keys() == b.model_state.keys()
    for name, tensor in a.model_state.items():
        assert torch.equal(tensor, b.model_state[name]), name
    for idx, entry in a.optimizer_state["state"].items():
        for name, value in entry.items():
            assert torch.equal(value, b.optimizer_state["state"][idx][name]), (idx, name)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_a_final_checkpoint_that_resumes(tmp_path, data_dir, monkeypatch, sig):
    trainer = Trainer(tiny_run_config(max_steps=12), data_dir, tmp_path, progress=False)
    step = trainer.train_step

    def step_then_signal(batches):
        stats = step(batches)
        if trainer.state.step == 5:
            os.kill(os.getpid(), sig)  # delivered to the handler fit() installed
        return stats

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
    handler = signal.getsignal(sig)
    with pytest.raises(Interrupted, match=f"stopped by {sig.name} at step 5"):
        trainer.fit()
    assert signal.getsignal(sig) is handler  # fit() put the old handler back
    assert load_checkpoint(trainer.last_path).train_state["step"] == 5
    resumed = Trainer(tiny_run_config(max_steps=12), data_dir, tmp_path, resume=True, progress=False)
    assert resumed.state.step == 5
    resumed.fit()
    assert resumed.state.step == 12


def test_the_language_model_trainer_stops_on_a_signal_too(tmp_path, monkeypatch):
    from attnkit import config as cfgmod
    from attnkit.train.lm_trainer import LMTrainer

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\n" * 40)
    assert main(["lm", "prepare", "--train", text, "--valid-fraction", "0.1", "--level", "char",
                 "--out", tmp_path / "data"]) == 0
    cfg = cfgmod.resolve(["lm-char-small-xl"], ["model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                                                "model.n_layers=1", "train.tgt_len=8", "train.mem_len=8",
                                                "train.batch_size=4", "train.max_steps=20", "train.device=cpu"])
    trainer = LMTrainer(cfg, tmp_path / "data", tmp_path / "run", progress=False)
    step = trainer.train_step

    def step_then_signal():
        stats = step()
        if trainer.state.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return stats

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
    with pytest.raises(Interrupted, match="stopped by SIGTERM at step 3") as stop:
        trainer.fit()
    assert stop.value.exit_code == 143 and load_checkpoint(trainer.last_path).train_state["step"] == 3


# --- malicious and damaged checkpoints ------------------------------------------------------------
class Payload:
    """Unpickling this runs code: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('the payload ran')",)


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_checkpoint_carrying_a_pickle_payload_is_refused_and_never_runs(tmp_path, capsys, trained, writer):
    data_dir, _ = trained
    marker, evil = tmp_path / "pwned", tmp_path / "model.safetensors"  # the name does not matter, the bytes do
    obj = {"kind": "transformer", "model_state": Payload(marker)}
    if writer == "pickle":
        evil.write_bytes(pickle.dumps(obj, protocol=4))
    else:
        torch.save(obj, evil)
    src = tmp_path / "in.txt"
    src.write_text("einundzwanzig\n")

    with pytest.raises(CheckpointError, match="--trust-checkpoint"):
        load_checkpoint(evil)
    assert main(["translate", "--checkpoint", evil, "--input", src, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pickle" in err[0] and "--trust-checkpoint" in err[0]
    assert main(["lm", "eval", "--checkpoint", evil, "--data", data_dir]) == 2
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    evil.rename(run / "checkpoints" / "last.safetensors")  # a resume meets it too
    assert main(["train", "--data", data_dir, "--out", run, "--resume", "--quiet", "--train.max_steps=1", *TINY]) == 2
    assert "no loadable checkpoint" in capsys.readouterr().err
    assert not marker.exists(), "the pickle payload executed"


def test_a_trusted_pickle_checkpoint_loads_only_with_the_flag(tmp_path, capsys, trained):
    from attnkit import config as cfgmod

    _, run_dir = trained
    good = load_checkpoint(run_dir / "checkpoints" / "last.safetensors")
    legacy = tmp_path / "legacy.pt"
    torch.save({"kind": good.kind, "config": cfgmod.to_dict(good.config), "model_state": good.model_state,
                "tokenizers": good.tokenizers}, legacy)
    src = tmp_path / "in.txt"
    src.write_text("einundzwanzig\ndreihundert\n")
    assert main(["translate", "--checkpoint", legacy, "--input", src, "--device", "cpu"]) == 2
    capsys.readouterr()
    assert main(["translate", "--checkpoint", legacy, "--input", src, "--device", "cpu", "--trust-checkpoint"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize("verb", ["translate", "average", "serve"])
def test_a_trusted_pickle_checkpoint_is_read_weights_only_and_its_payload_never_runs(tmp_path, capsys, trained,
                                                                                     monkeypatch, verb):
    """--trust-checkpoint lets a torch.save checkpoint in, read by torch's weights-only loader: one with every field
    right and a payload beside them is refused in one line naming what it asked for, on every verb that takes the
    flag, and the payload never runs."""
    from attnkit import config as cfgmod

    _, run_dir = trained
    good = load_checkpoint(run_dir / "checkpoints" / "last.safetensors")
    marker, evil = tmp_path / "pwned", tmp_path / "evil.pt"
    torch.save({"kind": good.kind, "config": cfgmod.to_dict(good.config), "model_state": good.model_state,
                "tokenizers": good.tokenizers, "train_state": {"step": Payload(marker)}}, evil)
    src = tmp_path / "in.txt"
    src.write_text("einundzwanzig\n")
    argv = {"translate": ["translate", "--checkpoint", evil, "--input", src, "--device", "cpu"],
            "average": ["average", evil, evil, "--out", tmp_path / "avg.safetensors"],
            "serve": ["serve", "--checkpoint", evil, "--device", "cpu", "--port", "0"]}[verb]
    served = []
    if verb == "serve":
        serve_extra()
        monkeypatch.setattr("uvicorn.Server.run", lambda server: served.append(server))  # never listen

    code = main([*argv, "--trust-checkpoint"])
    assert not marker.exists(), f"the pickle payload executed on {verb}"
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "weights-only" in err[0] and "names exec" in err[0], err
    assert not served and not (tmp_path / "avg.safetensors").exists()


def test_a_truncated_last_checkpoint_is_reported_and_training_goes_on_from_the_one_before(tmp_path, data_dir):
    straight = Trainer(tiny_run_config(max_steps=10), data_dir, tmp_path / "straight", progress=False)
    straight.fit()

    first = Trainer(tiny_run_config(max_steps=6, save_every_steps=2), data_dir, tmp_path / "run", progress=False)
    first.fit()
    prev_step = load_checkpoint(first.prev_path).train_state["step"]
    assert prev_step < 6
    data = first.last_path.read_bytes()
    first.last_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(first.last_path)

    resumed = Trainer(tiny_run_config(max_steps=10), data_dir, tmp_path / "run", resume=True, progress=False)
    assert resumed.state.step == prev_step
    assert "truncated or corrupt" in (tmp_path / "run" / "train.log").read_text()
    resumed.fit()
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_a_checkpoint_of_another_kind_gives_a_clear_error(tmp_path, capsys, trained):
    from attnkit import config as cfgmod
    from attnkit.checkpoint import Checkpoint, save_checkpoint

    _, run_dir = trained
    good = load_checkpoint(run_dir / "checkpoints" / "last.safetensors")
    lm = tmp_path / "lm.safetensors"
    save_checkpoint(lm, Checkpoint("transformer-xl", cfgmod.LMRunConfig(), {}, {"lm_vocab": b"{}"}))
    shrunk = tmp_path / "shrunk.safetensors"
    state = dict(good.model_state)
    state.pop(next(iter(state)))
    save_checkpoint(shrunk, Checkpoint(good.kind, good.config, state, good.tokenizers))
    src = tmp_path / "in.txt"
    src.write_text("eins\n")
    for path, expected in ((lm, "not a translation model"), (shrunk, "do not fit")):
        assert main(["translate", "--checkpoint", path, "--input", src, "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


# --- numerical faults --------------------------------------------------------------------------------
def poison(monkeypatch, bad_calls: set[int] | None = None, from_call: int | None = None) -> None:
    """Make the training objective return a NaN loss on the chosen calls (counted from 1)."""
    losses, calls = trainer_mod.training_losses, [0]

    def nan_losses(model, batch, epsilon, row_multiple):
        calls[0] += 1
        loss, nll, aux = losses(model, batch, epsilon, row_multiple)
        bad = calls[0] in (bad_calls or set()) or (from_call is not None and calls[0] >= from_call)
        return (loss * float("nan"), nll * float("nan"), aux) if bad else (loss, nll, aux)

    monkeypatch.setattr(trainer_mod, "training_losses", nan_losses)


def test_nan_losses_are_skipped_and_counted(tmp_path, data_dir, monkeypatch, capsys):
    poison(monkeypatch, bad_calls={3, 4, 9})
    trainer = Trainer(tiny_run_config(max_steps=12), data_dir, tmp_path, progress=False)
    updates = []
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: updates.append(trainer.state.step) or step())
    trainer.fit()
    assert trainer.state.step == 12 and trainer.state.skipped_total == 3 and trainer.state.skipped == 0
    assert updates == [s for s in range(12) if s + 1 not in (3, 4, 9)]  # no optimizer step on a NaN update
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert capsys.readouterr().err.count("non-finite loss or gradient, update skipped") == 3
    assert load_checkpoint(trainer.last_path).train_state["skipped_total"] == 3


def test_too_many_nan_updates_in_a_row_stop_the_run_with_the_last_good_checkpoint_intact(tmp_path, data_dir,
                                                                                         monkeypatch):
    monkeypatch.setattr(base, "MAX_BAD_STEPS", 3)
    poison(monkeypatch, from_call=6)
    trainer = Trainer(tiny_run_config(max_steps=20, save_every_steps=2), data_dir, tmp_path, progress=False)
    with pytest.raises(AttnkitError, match="3 non-finite updates in a row: stopping; the last good checkpoint"):
        trainer.fit()
    ckpt = load_checkpoint(trainer.last_path)
    assert ckpt.train_state["step"] <= 6
    assert all(torch.isfinite(v).all() for v in ckpt.model_state.values())


# --- full disks ----------------------------------------------------------------------------------------
def test_a_full_disk_fails_with_a_clear_message_and_the_earlier_checkpoint_still_loads(tmp_path, data_dir,
                                                                                       monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", data_dir, "--out", run, "--quiet", "--train.max_steps=4", *TINY]) == 0
    before = load_checkpoint(run / "checkpoints" / "last.safetensors")
    capsys.readouterr()

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("attnkit.io.os.fsync", no_space)
    assert main(["train", "--data", data_dir, "--out", run, "--quiet", "--resume", "--train.max_steps=8",
                 "--train.save_every_steps=1", *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device (disk full)" in err[0], err
    monkeypatch.undo()
    after = load_checkpoint(run / "checkpoints" / "last.safetensors")
    assert after.train_state["step"] == before.train_state["step"] == 4
    for name, tensor in before.model_state.items():
        assert torch.equal(tensor, after.model_state[name])
    assert not list((run / "checkpoints").glob(".*.tmp")), "a temp file was left behind"


def test_too_little_free_space_fails_before_training(tmp_path, data_dir, monkeypatch):
    import shutil

    monkeypatch.setattr("attnkit.io.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(AttnkitError, match="MiB free in .* this run's checkpoints needs about"):
        Trainer(tiny_run_config(max_steps=2), data_dir, tmp_path, progress=False)


def test_a_full_disk_inside_the_safetensors_writer_is_named_as_one(tmp_path, trained, monkeypatch):
    """safetensors writes checkpoints itself and reports its I/O errors as SafetensorError: they must read as
    attnkit's other write errors, with the earlier file untouched and no temp file left."""
    from safetensors import SafetensorError

    from attnkit.checkpoint import save_checkpoint

    path = tmp_path / "last.safetensors"
    ckpt = load_checkpoint(trained[1] / "checkpoints" / "last.safetensors")
    save_checkpoint(path, ckpt)
    before = path.read_bytes()

    def no_space(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("attnkit.checkpoint.save_file", no_space)
    with pytest.raises(AttnkitError) as e:
        save_checkpoint(path, ckpt)
    assert str(e.value) == (f"cannot write '{path}': No space left on device (disk full); "
                            "the previous last.safetensors is unchanged")
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


SAVE_PEAK = """
import resource, sys, torch
from attnkit.checkpoint import load_checkpoint, save_checkpoint
ckpt = load_checkpoint(sys.argv[1])
ckpt.model_state = {f"w{i}": torch.randn(4096, 4096) for i in range(4)}  # 256 MiB of weights, every page touched
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
save_checkpoint(sys.argv[2], ckpt)
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
same = all(torch.equal(v, ckpt.model_state[k]) for k, v in load_checkpoint(sys.argv[2]).model_state.items())
print(grew, same)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB is Linux's")
def test_saving_a_checkpoint_holds_no_copy_of_it_in_memory(tmp_path, trained):
    """Each save used to hold the whole file twice (safetensors.torch.save's buffer and its bytes): 182 MB more
    than training itself at Multi30k's `last`, a new peak of the run's memory at every epoch."""
    out = subprocess.run([sys.executable, "-c", SAVE_PEAK, str(trained[1] / "checkpoints" / "last.safetensors"),
                          str(tmp_path / "big.safetensors")], capture_output=True, text=True, check=True)
    grew, same = out.stdout.split()
    assert float(grew) < 32, f"saving 256 MiB raised the peak by {grew} MiB"
    assert same == "True", "the saved weights differ from the model's"
