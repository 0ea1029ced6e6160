"""The training loop for language models: ordered segments -> loss -> Adam + schedule -> evaluate -> checkpoints.

B streams, T segment length (tgt_len), M memory length (mem_len), V vocabulary.

The training corpus is read as B parallel streams in segments of T (attnkit.data.lm.LMStreams); a
Transformer-XL carries its memory (detached, the last M hidden states per layer) from one update to the
next, the vanilla LM sees every segment on its own. A pass over the corpus is an epoch; the memory
starts empty at the beginning of each pass. With `accumulate` = k, one update covers k consecutive
segments (the memory flows through all of them).

A run folder holds config.yaml, checkpoints/{last,best}.safetensors, metrics.csv, train.log,
tensorboard/ and report.html (validation snippets with their attention), as for translation. The LM
vocabulary is stored in every checkpoint as the tokenizer blob `lm_vocab`, so a checkpoint evaluates and
generates on its own.

Resuming (`resume=True`) restores the weights, optimizer, schedule position, RNG and the stream
position (epoch + next segment), but not the memory: the first segment after a resume starts with an
empty memory, as the first segment of every pass does. Memory would cost L x B x M x D floats per
checkpoint; one segment without context is a negligible perturbation. A run
resumed at a pass boundary (or a vanilla run anywhere) ends with the same parameters as training straight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnkit import config as cfgmod
from attnkit.checkpoint import LM_VOCAB, Checkpoint
from attnkit.data.lm import LMStreams, load_lm_corpus
from attnkit.errors import ConfigError
from attnkit.eval.lm import evaluate_segments
from attnkit.runtime import autocast
from attnkit.train.base import TrainerBase
from attnkit.train.precision import PROBE_BATCHES, Passes, probe_parts


@dataclass
class LMTrainState:
    step: int = 0  # optimizer updates done
    epoch: int = 0  # passes over the training streams completed
    segment: int = 0  # next segment of the current pass
    elapsed_s: float = 0.0  # wall-clock spent training, across resumes
    best: float | None = None  # best validation loss so far
    skipped: int = 0  # consecutive updates skipped for a non-finite loss or gradient
    skipped_total: int = 0  # all updates skipped so far
    data: str = ""  # the training split's size (TrainerBase.data_fingerprint): a resume checks it is the same
    processes: int = 1  # the world size it trained with: train.accumulate x processes is what a resume keeps


class LMTrainer(TrainerBase):
    state_class = LMTrainState

    def __init__(self, cfg: cfgmod.LMRunConfig, data_dir: str | Path, run_dir: str | Path, *,
                 resume: bool = False, force: bool = False, progress: bool = True, change_recipe: bool = False):
        self.open_run(run_dir, resume=resume, force=force, device=cfg.train.device, change_recipe=change_recipe)
        t = cfg.train
        if not (t.max_steps or t.max_minutes):
            raise ConfigError("set a budget: train.max_steps or train.max_minutes")
        self.data_dir, self.progress = Path(data_dir), progress
        self.corpus = load_lm_corpus(data_dir)
        self.cfg = cfgmod.replace(cfg, model=cfgmod.replace(cfg.model, vocab_size=self.corpus.vocab.vocab_size))
        self.build()
        self.train_model = self.dist.wrap(self.model)
        # batch_size streams in all: each rank reads its own rows, so a resume may change the world size
        self.streams = LMStreams(self.corpus.arrays["train"], t.batch_size, t.tgt_len, t.ext_len)
        self.rows = self.dist.shard(t.batch_size)
        self.mems: list[torch.Tensor] | None = None
        self.start(resume)

    def tokenizer_blobs(self) -> dict[str, bytes]:
        return {LM_VOCAB: self.corpus.vocab.to_bytes()}

    def data_fingerprint(self) -> str:
        return f"{len(self.corpus.arrays['train']):,} training tokens"

    def restore(self, ckpt: Checkpoint, path: Path) -> list[str]:
        self.mems = None  # memory-free restart, see the module docstring
        return super().restore(ckpt, path)

    # --- one update -------------------------------------------------------------------------
    def _next_segments(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Up to `accumulate` consecutive segments of the current pass."""
        end = min(self.state.segment + self.cfg.train.accumulate, len(self.streams))
        group = [tuple(z[self.rows] for z in self.streams.batch(tau)) for tau in range(self.state.segment, end)]
        self.state.segment = end
        return group

    def train_step(self) -> dict[str, float]:
        """One optimizer update over the next segment(s); loss normalised per predicted token."""
        t = self.cfg.train
        self.model.train()  # no gradients here: apply_update let the last update's go
        group = self._next_segments()
        n_tokens = sum(y.numel() for _, y in group)  # the same on every rank: equal shares of the streams
        total = 0.0
        for i, (x, y) in enumerate(group):
            with self.dist.no_sync(self.train_model, sync=i == len(group) - 1):
                nll, self.mems = self.segment_nll(self.train_model, x.to(self.device), y.to(self.device), self.mems,
                                                  t.dtype)
                (nll / n_tokens).backward()  # DDP averages the ranks' per-token means
            total += nll.item()
        (total,) = self.dist.sum(total)
        n_tokens *= self.dist.world
        lr = self.apply_update(total)
        if self.state.segment >= len(self.streams):  # end of a pass: start again with an empty memory
            self.state.epoch, self.state.segment, self.mems = self.state.epoch + 1, 0, None
        return {"loss": total / n_tokens, "lr": lr, "tokens": n_tokens}

    def segment_nll(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, mems: list[torch.Tensor] | None,
                    dtype: str) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The summed NLL of segment x -> y (each (B, T)) in precision `dtype`, and the memory after it."""
        t = self.cfg.train
        with autocast(self.device, dtype):  # the per-token NLL (B, T): no (B, T, V) with an adaptive softmax
            nll, mems = model(x, mems, targets=y, mem_len=t.mem_len, clamp_len=t.clamp_len, ext_len=t.ext_len)
        return nll.sum(), mems

    def first_segments(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's first PROBE_BATCHES segments on the device: (x, y), each (B, T)."""
        return [tuple(z[self.rows].to(self.device) for z in self.streams.batch(tau))
                for tau in range(min(PROBE_BATCHES, len(self.streams)))]

    def precision_passes(self) -> Passes:
        """Forward + backward of the first segments (the memory flowing through them; in float32 the streams in row
        slices), for `train.dtype: auto`."""
        segments = self.first_segments()

        def passes(dtype: str) -> None:
            for rows in probe_parts(len(segments[0][0]), dtype):
                mems = None
                for x, y in segments:
                    nll, mems = self.segment_nll(self.model, x[rows], y[rows], mems, dtype)
                    nll.backward()
        return passes

    # --- evaluation -------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Validation loss / ppl / bpc with the evaluation lengths (eval_tgt_len, eval_mem_len, clamp_len)."""
        valid = self.corpus.splits.get("valid")
        if valid is None:
            return {}
        t = self.cfg.train
        tgt_len, mem_len = t.eval_lengths
        scores = evaluate_segments(self.model, valid, tgt_len=tgt_len, mem_len=mem_len, clamp_len=t.clamp_len,
                                   ext_len=t.ext_len, batch_size=t.eval_batch_size, max_tokens=t.eval_max_tokens,
                                   device=self.device, dtype=t.dtype)
        return {"loss": scores.loss, "ppl": scores.ppl, "bpc": scores.bpc, "tok_s": scores.tok_s}

    def _checkpoint(self, metrics: dict[str, float]) -> None:
        if metrics:
            self.log.write("valid", self.state.step, epoch=self.state.epoch, elapsed_s=self.state.elapsed_s,
                           loss=metrics["loss"], nll=metrics["loss"], ppl=metrics["ppl"], tok_s=metrics["tok_s"])
            self.log.say(f"step {self.state.step} ({self.state.elapsed_s / 60:.1f} min): valid "
                         + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
            if self.progress and self.dist.is_main:
                tqdm.write(f"step {self.state.step} | valid loss {metrics['loss']:.4f} | ppl {metrics['ppl']:.2f} "
                           f"| bpc {metrics['bpc']:.4f}")
            if self.state.best is None or metrics["loss"] < self.state.best:
                self.state.best = metrics["loss"]
                self.save(self.best_path, full=False)
        self.save_last()

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        """Train until max_steps or the wall-clock budget; returns the last validation metrics."""
        t = self.cfg.train
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log.say(f"{'resuming' if self.state.step else 'starting'} at step {self.state.step} (epoch "
                     f"{self.state.epoch}, segment {self.state.segment} of {len(self.streams)}); {n_params:,} "
                     f"parameters on {self.device}; {self.corpus.summary()}")
        clock = time.monotonic() - self.state.elapsed_s
        bar = tqdm(total=t.max_steps or None, initial=self.state.step, desc=self.model.kind,
                   disable=self.progress_disabled(), dynamic_ncols=True, leave=False)
        window_tokens, window_start, eval_reserve, metrics = 0, time.monotonic(), 0.0, {}
        while not self.out_of_budget(eval_reserve):
            stats = self.train_step()
            self.state.elapsed_s = time.monotonic() - clock
            window_tokens += stats["tokens"]
            bar.update(1)
            if self.state.step % t.log_every == 0:
                tok_s = window_tokens / max(1e-9, time.monotonic() - window_start)
                self.log.write("train", self.state.step, epoch=self.state.epoch, elapsed_s=self.state.elapsed_s,
                               loss=stats["loss"], nll=stats["loss"], lr=stats["lr"], tok_s=tok_s)
                bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}", tok_s=f"{tok_s:,.0f}")
                window_tokens, window_start = 0, time.monotonic()
            if self.state.step % t.eval_interval == 0 and not self.out_of_budget(eval_reserve):
                eval_start = time.monotonic()
                metrics = self.evaluate() if self.dist.is_main else {}
                eval_reserve = time.monotonic() - eval_start
                self._checkpoint(metrics)
            self.stop_if_asked()
        bar.close()
        metrics = self.evaluate() if self.dist.is_main else {}
        self.state.elapsed_s = time.monotonic() - clock
        self._checkpoint(metrics)
        self.log.say(f"finished at step {self.state.step} after {self.state.elapsed_s / 60:.1f} min")
        self.write_report()
        self.log.close()
        return metrics
