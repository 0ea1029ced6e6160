"""What every attnkit training loop shares: the run folder, the model with its optimizer and schedule,
checkpoints with exact resume, stopping cleanly on SIGINT / SIGTERM, the guard against non-finite
updates, and the budget.

A loop subclasses `TrainerBase`, calls `open_run` and `build` from its constructor, names its state
class (a dataclass with at least `step`, `elapsed_s`, `skipped` and `skipped_total`) and its tokenizer
blobs, implements `run()` and calls `stop_if_asked()` after every update.

`last.safetensors` is written atomically, and the one it replaces is kept as `prev.safetensors`: a
resume whose `last` is damaged (truncated by a copy, a bad disk) goes on from `prev` with a warning.

A resume continues the run's own recipe (`run_config` reads it back from the run folder) on the data it was
trained on: `restore` refuses a checkpoint whose tokenizers or training split are not the data folder's, and a
config that changes anything beyond the budget and the bookkeeping (`recipe_changes`), unless the caller asks for
the change (`change_recipe`, recorded in train.log). tests/test_resume.py checks each refusal.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, load_checkpoint, load_weights, save_checkpoint, tokenizer_difference
from attnkit.cpu import TrainingScope, emulated_bf16, release_kept_memory, training_kernels, training_scope
from attnkit.errors import AttnkitError, CheckpointError
from attnkit.io import atomic_write_text, ensure_free_space, ensure_writable_dir
from attnkit.models import build_model
from attnkit.nn.lora import merged_state
from attnkit.runtime import resolve_device, seed_everything
from attnkit.train.distributed import Distributed
from attnkit.train.finetune import freeze
from attnkit.train.metrics_log import MetricsLog, NullLog
from attnkit.train.optim import adamw
from attnkit.train.precision import Passes, choose_dtype, no_trace
from attnkit.train.schedules import make_schedule

MAX_BAD_STEPS = 20  # consecutive non-finite updates before the run stops
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What a resumed run may change without --change-recipe: how long it trains and how it keeps its books. Neither the
# weights' meaning, nor the batches, nor the learning rate of any update depends on them (a schedule's horizon
# excepted: `horizon_fields`).
BUDGET = frozenset({"train.max_epochs", "train.max_steps", "train.max_minutes"})
BOOKKEEPING = frozenset({"train.log_every", "train.save_every_minutes", "train.save_every_steps", "train.keep_epochs",
                         "train.device", "train.compile", "train.compile_backend", "train.eval_batch_size"})


class Interrupted(AttnkitError):
    """SIGINT / SIGTERM stopped training after a final checkpoint; the CLI exits with 128 + the signal."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = 128 + signum


def decay_groups(model: torch.nn.Module, weight_decay: float, decay_vectors: bool) -> list[dict]:
    """AdamW's parameter groups: one group decaying everything (fairseq's Adam), or, without `decay_vectors`,
    the parameters of 2 or more dimensions decayed and the biases and normalisations' gains not (GPT-2's rule)."""
    params = [p for p in model.parameters() if p.requires_grad]  # frozen parts (train.freeze) are not trained
    if decay_vectors or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def flat_config(cfg: Any) -> dict[str, Any]:
    """A run config as {"section.field": value}."""
    def walk(prefix: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            return {prefix: value}
        return {k: v for name, sub in value.items() for k, v in walk(f"{prefix}.{name}" if prefix else name,
                                                                     sub).items()}
    return walk("", cfgmod.to_dict(cfg))


def horizon_fields(t: cfgmod.Optimisation) -> frozenset[str]:
    """The budget fields the learning rate of every update depends on: the cosine's or the cooldown's horizon."""
    if t.horizon == "time":
        return frozenset({"train.max_minutes", "train.max_steps"})
    return frozenset({"train.max_steps"}) if t.schedule == "cosine" or t.cooldown else frozenset()


def recipe_changes(saved: Any, wanted: Any) -> tuple[list[str], list[str]]:
    """What `wanted` changes of the run config `saved`, as "field old -> new": (the budget and bookkeeping changes a
    resume may make, the recipe changes it may make only when asked). `train.dtype: auto` keeps the precision
    the run chose at its start, so it changes nothing."""
    old, new = flat_config(saved), flat_config(wanted)
    if new.get("train.dtype") == "auto":
        new["train.dtype"] = old.get("train.dtype")
    free = (BUDGET | BOOKKEEPING) - horizon_fields(saved.train)
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    line = {k: f"{k} {old.get(k)} -> {new.get(k)}" for k in changed}
    return [line[k] for k in changed if k in free], [line[k] for k in changed if k not in free]


def run_config(run_dir: str | Path, overrides: list[str] = ()) -> Any:
    """The config a run folder's run was trained with, `overrides` on top: the newest loadable checkpoint's
    (`last`, else `prev`), else the config.yaml written at its start. `--resume` without `--config` continues
    with it, so a resume never falls back to a default preset."""
    run_dir = Path(run_dir)
    damaged = []
    for path in (run_dir / "checkpoints" / "last.safetensors", run_dir / "checkpoints" / "prev.safetensors"):
        if path.exists():
            try:
                return cfgmod.resolve([], overrides, base=cfgmod.to_dict(load_checkpoint(path).config))
            except CheckpointError as e:
                damaged.append(str(e))
    if (run_dir / "config.yaml").is_file():
        return cfgmod.resolve([], overrides, base=yaml.safe_load((run_dir / "config.yaml").read_text("utf-8")))
    if damaged:
        raise CheckpointError(f"no loadable checkpoint in {run_dir / 'checkpoints'} to resume from: "
                              + "; ".join(damaged))
    raise AttnkitError(f"{run_dir} holds no run to resume (no checkpoints/last.safetensors, no config.yaml): "
                       "start one with --config PRESET")


class TrainerBase:
    state_class: type  # the loop's training-position dataclass
    cfg: Any  # the run config (RunConfig, LMRunConfig)
    state: Any
    log: MetricsLog

    def open_run(self, run_dir: str | Path, *, resume: bool, force: bool, device: str,
                 change_recipe: bool = False) -> None:
        """Join the torchrun process group if there is one; check the run folder now (writable; a run
        there needs --resume or --force). Only rank 0 writes into it. `change_recipe`: a resume may go on with
        another recipe than the run's own (`restore`)."""
        self.change_recipe = change_recipe
        self.device = resolve_device(device)
        self.dist = Distributed.from_env(self.device.type)
        self.device = self.dist.device(self.device)
        self.run_dir = ensure_writable_dir(run_dir) if self.dist.is_main else Path(run_dir)
        self.last_path = self.run_dir / "checkpoints" / "last.safetensors"
        self.prev_path = self.run_dir / "checkpoints" / "prev.safetensors"
        self.best_path = self.run_dir / "checkpoints" / "best.safetensors"
        self.stop_signal: int | None = None
        if (self.last_path.exists() or self.prev_path.exists()) and not (resume or force):
            raise AttnkitError(f"{self.run_dir} already holds a run; pass --resume to continue it "
                               "or --force to start over")

    def build(self) -> None:
        """Device, seed, model, optimizer and schedule from `self.cfg`."""
        t = self.cfg.train
        seed_everything(t.seed)
        self.model = build_model(self.cfg.model.kind, self.cfg.model).to(self.device)
        self.adapt()
        freeze(self.model, t.freeze)
        if t.compile:  # in place: the state dict keeps its names; new shapes recompile (dynamic after the first)
            self.model.compile(backend=t.compile_backend)
        self.seed_rank(0)
        # AdamW: with weight_decay 0 it is exactly Adam; with decay it is decoupled (as fairseq's Adam).
        self.optimizer = adamw(decay_groups(self.model, t.weight_decay, t.decay_vectors), lr=0.0, betas=t.betas,
                               eps=t.eps, device=self.device)
        self.schedule = make_schedule(t.schedule, lr=t.lr, warmup=t.warmup, d_model=self.cfg.model.d_model,
                                      total=t.max_steps, by_time=t.horizon == "time", cooldown_fraction=t.cooldown)
        weights = 4 * sum(p.numel() for p in self.model.parameters())  # float32 bytes
        if self.dist.is_main:  # last + prev with Adam's two moments, best and the kept epochs as weights only
            ensure_free_space(self.run_dir, 2 * 3 * weights + (1 + getattr(t, "keep_epochs", 0)) * weights,
                              "this run's checkpoints")

    def adapt(self) -> None:
        """What the model gets before its optimizer sees its parameters: a fine-tuning run's starting weights and its
        LoRA adapters (Trainer). Nothing here."""

    def seed_rank(self, step: int) -> None:
        """Ranks other than 0 draw their own dropout masks (DDP has made the weights equal)."""
        if not self.dist.is_main:
            torch.manual_seed(self.cfg.train.seed + 7919 * self.dist.rank + step)

    def start(self, resume: bool) -> None:
        """Restore the newest good checkpoint when resuming, write the resolved config, open the logs."""
        self.state = self.state_class(data=self.data_fingerprint(), processes=self.dist.world)
        notes = self.resume_from_newest() if resume else []
        notes.append(self.settle_dtype())
        if not self.dist.is_main:
            self.log = NullLog()
            return
        atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(cfgmod.to_dict(self.cfg), sort_keys=False))
        self.log = MetricsLog(self.run_dir, resume_step=self.state.step if resume else None)
        for note in [*notes, emulated_bf16(self.device, self.cfg.train.dtype)]:
            if note:
                self.warn(note)

    def settle_dtype(self) -> str:
        """`train.dtype: auto` becomes the precision timed faster here (attnkit.train.precision), the probe's seconds
        part of the budget; a resumed run keeps the one chosen at its start. Returns the line for train.log."""
        t = self.cfg.train
        if t.dtype != "auto":
            return ""
        if self.state.step:
            dtype, line = self.resumed_dtype, f"train.dtype auto: {self.resumed_dtype}, as chosen at the run's start"
        else:
            with no_trace(self.model), self.cpu.applied(self.model):
                choice = choose_dtype(self.device, self.precision_passes(), self.dist.sum)
            self.state.elapsed_s += choice.seconds
            dtype, line = choice.dtype, choice.why
        self.cfg = cfgmod.replace(self.cfg, train=cfgmod.replace(t, dtype=dtype))
        return line

    def precision_passes(self) -> Passes:
        """Forward + backward over the run's first few batches in a given precision, no update (precision.Passes)."""
        raise NotImplementedError

    @functools.cached_property
    def cpu(self) -> TrainingScope:
        """What the CPU room swaps into the model while it trains (attnkit.cpu.training_scope)."""
        return training_scope(self.device, self.row_budget())

    def row_budget(self) -> int:
        """The most tokens a batch holds, which products may pad their rows to (0: they do not)."""
        return 0

    def write_report(self) -> None:
        """report.html at the end of fit (rank 0; attnkit.viz.report)."""
        if not self.dist.is_main:
            return
        from attnkit.viz.report import after_fit  # here, not at the top: importing attnkit stays matplotlib-free

        after_fit(self.run_dir, self.data_dir, self.log.say)

    def warn(self, message: str) -> None:
        """A warning for the user now (stderr, between progress bars) and for train.log (rank 0 only)."""
        if not self.dist.is_main:
            return
        self.log.say(message)
        tqdm.write(f"attnkit: {message}", file=sys.stderr)

    def resume_from_newest(self) -> list[str]:
        """Restore `last`, or `prev` when `last` is missing or damaged; returns warnings for the log."""
        notes = []
        for path in (self.last_path, self.prev_path):
            if not path.exists():
                continue
            try:
                ckpt = load_checkpoint(path, adapters=True)  # a LoRA run's adapters as they are
            except CheckpointError as e:
                notes.append(f"warning: {e}; trying the checkpoint before it")
                continue
            changes = self.restore(ckpt, path)
            if path == self.prev_path and not notes:  # a stop between the two renames of a save
                notes.append(f"warning: {self.last_path.name} is missing")
            if notes:
                notes.append(f"resumed from {path} (step {self.state.step})")
            return notes + changes
        if notes:
            raise CheckpointError(f"no loadable checkpoint in {self.last_path.parent} to resume from: "
                                  + "; ".join(notes))
        return notes

    # --- checkpoints ------------------------------------------------------------------------
    def tokenizer_blobs(self) -> dict[str, bytes]:
        """The vocabularies a checkpoint carries, so it translates / generates on its own."""
        raise NotImplementedError

    def checkpoint_languages(self) -> dict[str, str | None]:
        """The languages a checkpoint records ({"src": code, "tgt": code}); none unless the data names them."""
        return {}

    def save(self, path: Path, *, full: bool = True) -> None:
        """Weights, config and vocabularies; with `full`, also optimizer, RNG and training position.

        A LoRA run's weights-only checkpoints (best, the epochs') hold the plain model, each adapter merged into its
        weight (attnkit.nn.lora.merged_state), which every verb takes; its full ones hold the adapters apart beside
        the frozen weights, which the optimizer state refers to and the resume loads as they are.
        Rank 0 writes; the other ranks hold the same weights and optimizer state."""
        if not self.dist.is_main:
            return
        cuda = full and self.device.type == "cuda"
        save_checkpoint(path, Checkpoint(
            kind=self.model.kind, config=self.cfg,
            model_state=self.model.state_dict() if full else merged_state(self.model),
            tokenizers=self.tokenizer_blobs(), train_state=asdict(self.state),
            optimizer_state=self.optimizer.state_dict() if full else None,
            rng_state=torch.get_rng_state() if full else None,
            cuda_rng_state=torch.cuda.get_rng_state(self.device) if cuda else None,
            languages=self.checkpoint_languages()),
            backup=self.prev_path if path == self.last_path else None)

    def save_last(self) -> None:
        """The full checkpoint after each evaluation and every `save_every_minutes`: the loop's quiet points, where
        the free memory kept for reuse is also handed back (a no-op unless the command kept it)."""
        self.save(self.last_path)
        release_kept_memory()

    def data_fingerprint(self) -> str:
        """The training split in a few numbers (its size), kept in the training state: a resume on other data of the
        same tokenizer would take other batches at the saved position."""
        raise NotImplementedError

    def check_resumable(self, ckpt: Checkpoint, path: Path) -> list[str]:
        """Refuse (one line) a checkpoint this run cannot continue: another model kind, other tokenizers or training
        data than the data folder's, another recipe unless `change_recipe`. Returns the changes made, for the log."""
        if ckpt.kind != self.model.kind:
            raise AttnkitError(f"{path} holds a '{ckpt.kind}' model, not a '{self.model.kind}'")
        differs = tokenizer_difference(ckpt, Checkpoint(ckpt.kind, self.cfg, {}, self.tokenizer_blobs()))
        if differs:
            raise AttnkitError(f"{path} was trained with other tokenizers than {self.data_dir}'s ({differs}; was it "
                               "prepared again since?): every id would mean another piece. Resume on the data the "
                               "run was trained on, or start a new run")
        saved_data = ckpt.train_state.get("data", "")
        if saved_data and saved_data != self.data_fingerprint():
            raise AttnkitError(f"{path} was trained on other data than {self.data_dir}'s ({saved_data}, not "
                               f"{self.data_fingerprint()}): resume on the data the run was trained on, "
                               "or start a new run")
        free, recipe = recipe_changes(ckpt.config, self.cfg)
        saved_processes = ckpt.train_state.get("processes", 1)
        kept = ckpt.config.train.accumulate * saved_processes == self.cfg.train.accumulate * self.dist.world
        recipe = [c for c in recipe if not c.startswith("train.accumulate ")]  # what counts is the batch an update
        if not kept:
            recipe.append(f"batches an update (train.accumulate x processes) {ckpt.config.train.accumulate} x "
                          f"{saved_processes} -> {self.cfg.train.accumulate} x {self.dist.world}")
        if recipe and not self.change_recipe:
            raise AttnkitError(f"resuming {path} would change the run's recipe: {'; '.join(recipe)}. Resume without "
                               "--config and those overrides (--resume alone continues the run's own), or pass "
                               "--change-recipe to train on with the change")
        return [f"resumed with {'; '.join(free)}" if free else "",
                f"resumed with a changed recipe (--change-recipe): {'; '.join(recipe)}" if recipe else ""]

    def restore(self, ckpt: Checkpoint, path: Path) -> list[str]:
        """Continue from `ckpt` (read from `path`): weights, optimizer, RNG and training position; returns notes for
        the log (`check_resumable`)."""
        notes = [n for n in self.check_resumable(ckpt, path) if n]
        load_weights(self.model, ckpt, path)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        if ckpt.rng_state is not None:
            torch.set_rng_state(ckpt.rng_state)
        if ckpt.cuda_rng_state is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(ckpt.cuda_rng_state, self.device)
        self.state = self.state_class(**{**ckpt.train_state, "data": self.data_fingerprint(),
                                         "processes": self.dist.world})
        self.resumed_dtype = ckpt.config.train.dtype  # what `auto` chose at the run's start
        self.seed_rank(self.state.step)  # the checkpoint holds rank 0's generator
        return notes

    # --- the loop and its interruption ------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train until the budget is spent (see `run`), with `training_kernels` on CUDA; SIGINT / SIGTERM save `last`,
        then raise Interrupted."""
        try:
            with self.stop_on_signals(), training_kernels(self.device), self.cpu.applied(self.model):
                result = self.run()
            self.dist.barrier()  # ranks tear the process group down together, none while another still talks
            return result
        finally:
            self.dist.close()

    def progress_disabled(self) -> bool | None:
        """tqdm's `disable`: None (bars when stderr is a terminal) on rank 0 with progress, else True."""
        return None if self.progress and self.dist.is_main else True

    def run(self) -> dict[str, float]:
        raise NotImplementedError

    @contextlib.contextmanager
    def stop_on_signals(self):
        """Turn SIGINT / SIGTERM into a request that `stop_if_asked` honours after the current update.

        A second signal stops at once (KeyboardInterrupt); the atomic writes keep every file whole.
        """
        if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
            yield
            return

        def ask_to_stop(signum, frame):
            if self.stop_signal is not None:
                raise KeyboardInterrupt
            self.stop_signal = signum

        previous = {s: signal.signal(s, ask_to_stop) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def stop_if_asked(self) -> None:
        """After an update: if a stop signal came (to any rank), write `last` and raise Interrupted."""
        if not self.dist.any(self.stop_signal is not None):
            return
        self.save_last()
        signum = self.stop_signal or signal.SIGTERM  # a rank that got none stops with its peers
        name = signal.Signals(signum).name
        self.log.say(f"{name} at step {self.state.step}: saved {self.last_path}")
        self.log.close()
        raise Interrupted(signum, f"stopped by {name} at step {self.state.step}; saved {self.last_path}; "
                          "continue with --resume")

    # --- one update -------------------------------------------------------------------------
    def apply_update(self, total_loss: float) -> float:
        """After backward: clip (train.clip_norm, 0 = no clipping) and step with the scheduled lr, or skip an
        update whose loss or gradient is not finite; then let the gradients go. The gradient norm is checked on
        every update: a NaN or inf gradient can come with a finite loss (an overflow in backward), and must not
        reach the weights. Returns the lr."""
        lr = self.scheduled_lr()
        clip = self.cfg.train.clip_norm or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)  # one fused pass over the grads
        if not (math.isfinite(total_loss) and torch.isfinite(grad_norm)):
            self.skip_update()
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.state.skipped = 0
        self.optimizer.zero_grad(set_to_none=True)  # the one place they go: evaluations and checkpoints run without
        self.state.step += 1
        return lr

    def scheduled_lr(self) -> float:
        """The learning rate of the next update; over a time horizon, from the budget's share spent so far (the
        mean over ranks, so every rank steps with the same rate)."""
        t = self.cfg.train
        if t.horizon != "time":
            return self.schedule(self.state.step + 1)
        elapsed = self.dist.sum(self.state.elapsed_s)[0] / self.dist.world
        return self.schedule(self.state.step + 1, spent=elapsed / (t.max_minutes * 60))

    def skip_update(self) -> None:
        self.state.skipped += 1
        self.state.skipped_total += 1
        self.warn(f"warning: step {self.state.step + 1}: non-finite loss or gradient, update skipped "
                  f"({self.state.skipped} in a row, {self.state.skipped_total} in this run)")
        if self.state.skipped >= MAX_BAD_STEPS:
            raise AttnkitError(f"{MAX_BAD_STEPS} non-finite updates in a row: stopping; the last good "
                               f"checkpoint is {self.last_path}")

    def out_of_budget(self, eval_reserve: float) -> bool:
        """max_steps reached, or no time left for another stretch of training plus an evaluation."""
        t = self.cfg.train
        if t.max_steps and self.state.step >= t.max_steps:
            return True
        return self.dist.any(bool(t.max_minutes) and self.state.elapsed_s + eval_reserve >= t.max_minutes * 60)
