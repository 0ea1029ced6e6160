"""The training loop for seq2seq models: batches -> loss -> Adam + schedule -> evaluate -> checkpoints.

A run folder holds config.yaml (the resolved config), checkpoints/{last,best}.safetensors,
metrics.csv, train.log and tensorboard/ (the scalars, and after every epoch the attention of the first dev
sentence as an image, when the tensorboard extra is installed). `resume=True` continues exactly where `last` stopped:
weights, optimizer, schedule position, RNG and the position inside the epoch's batch order.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnkit import config as cfgmod
from attnkit.checkpoint import epoch_checkpoints, load_weights
from attnkit.config import PAD_ID
from attnkit.data import (
    EncodedSplit,
    TokenBatchSampler,
    iterate_batches,
    load_split,
    load_tokenizers,
    read_lines,
    resegment_train,
)
from attnkit.data.batching import Batch
from attnkit.data.dataset import data_languages
from attnkit.decode.translator import Translator
from attnkit.eval import TokenizerChoice, bleu_tokenizer, translate_and_score
from attnkit.models.seq2seq import Seq2Seq
from attnkit.nn.lora import add_lora, merged
from attnkit.runtime import autocast
from attnkit.train.base import TrainerBase
from attnkit.train.distributed import TrainingForward
from attnkit.train.finetune import initial_checkpoint
from attnkit.train.losses import projected_label_smoothed_nll
from attnkit.train.precision import PROBE_BATCHES, Passes, probe_parts


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    elapsed_s: float = 0.0  # wall-clock spent training, across resumes
    best: float | None = None  # best dev metric so far
    skipped: int = 0  # consecutive updates skipped for a non-finite loss or gradient
    skipped_total: int = 0  # all updates skipped so far
    data: str = ""  # the training split's size (TrainerBase.data_fingerprint): a resume checks it is the same
    processes: int = 1  # the world size it trained with: train.accumulate x processes is what a resume keeps


def model_losses(model: Seq2Seq, batch: Batch, epsilon: float, row_multiple: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The label-smoothed loss and the NLL of `batch`, summed over target tokens: the model's `features` go to the
    loss with its `output_layer`, which makes the (tokens x vocabulary) logits a chunk at a time and never whole, for
    the real tokens only (losses.projected_label_smoothed_nll; its peak memory: benchmarks/loss_memory.py).
    `row_multiple`: what the loss's products pad their rows to (TrainingScope.row_multiple)."""
    return projected_label_smoothed_nll(model.features(batch.src, batch.tgt_in), *model.output_layer(),
                                        batch.tgt_out, epsilon, PAD_ID, row_multiple)


def training_losses(model: Seq2Seq, batch: Batch, epsilon: float, row_multiple: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
    """What an update minimises: `model_losses` of the model's `training_features`, and the term it optimises
    beside the likelihood (hard attention's REINFORCE; 0 for the others), which the logged loss leaves out."""
    features, aux = model.training_features(batch.src, batch.tgt_in, batch.tgt_out)
    return (*projected_label_smoothed_nll(features, *model.output_layer(), batch.tgt_out, epsilon, PAD_ID,
                                          row_multiple), aux)


class Trainer(TrainerBase):
    state_class = TrainState

    def __init__(self, cfg: cfgmod.RunConfig, data_dir: str | Path, run_dir: str | Path, *,
                 resume: bool = False, force: bool = False, progress: bool = True, change_recipe: bool = False):
        self.open_run(run_dir, resume=resume, force=force, device=cfg.train.device, change_recipe=change_recipe)
        self.data_dir, self.progress = Path(data_dir), progress
        self.src_tok, self.tgt_tok = load_tokenizers(self.data_dir)
        self.languages = data_languages(self.data_dir)
        self._bleu_tokenizer: TokenizerChoice | None = None  # chosen at the first dev BLEU, kept for the run
        self.cfg = cfg if cfg.train.init_from else self._fit_config_to_data(cfg)  # fine-tuning: the model's own
        self.resuming = resume
        self.build()
        # DDP needs the training objective as a module's forward; the lambda finds training_losses at call time
        self.train_model = self.dist.wrap(TrainingForward(self.model, lambda m, b: training_losses(
            m, b, self.cfg.train.label_smoothing, self.cpu.row_multiple)))
        self.train_split = load_split(self.data_dir, "train")
        has_valid = (self.data_dir / "valid.safetensors").exists()
        self.valid_split = load_split(self.data_dir, "valid") if has_valid else None
        self.sampler = self._sampler(self.train_split)
        self.start(resume)
        if not self.state.step and self.dist.is_main:  # --force: an earlier run's segmentations, maybe of other ids
            shutil.rmtree(self.run_dir / "subwords", ignore_errors=True)

    def adapt(self) -> None:
        """A fine-tuning run starts from its checkpoint's weights (a resume: from its own, `restore`), and with
        train.lora_r trains LoRA adapters only (attnkit.nn.lora): they come before the optimizer, which then
        holds them alone, and before a resume loads the state that holds them."""
        t = self.cfg.train
        if t.init_from and not self.resuming:
            load_weights(self.model, initial_checkpoint(t.init_from, self.tokenizer_blobs(), self.data_dir),
                         t.init_from)
        if t.lora_r:
            add_lora(self.model, t.lora_r, t.lora_alpha, t.lora_targets)

    def inference_model(self) -> Seq2Seq:
        """The model the dev translations run: with LoRA, a merged copy (attnkit.nn.lora.merged), the plain model
        best.safetensors will hold, which the inference kernels (attnkit.cpu.for_inference) take as any other."""
        return merged(self.model) if self.cfg.train.lora_r else self.model

    def _sampler(self, split: EncodedSplit) -> TokenBatchSampler:
        t = self.cfg.train
        return TokenBatchSampler(split.src_lens, split.tgt_lens, t.max_tokens, shuffle=True, seed=t.seed,
                                 max_sentences=t.max_sentences)

    def epoch_data(self, epoch: int) -> tuple[EncodedSplit, TokenBatchSampler]:
        """The training split of `epoch` and its batch sampler: the prepared segmentation, or with
        train.bpe_dropout a fresh one for each epoch, written to RUN/subwords/ before the epoch's first batch so
        that a resume and every DDP rank read the very same one (sentencepiece's sampling is not seeded)."""
        if not self.cfg.train.bpe_dropout:
            return self.train_split, self.sampler
        path = self.run_dir / "subwords" / f"epoch{epoch:04d}.safetensors"
        if self.dist.is_main and not path.exists():
            split = resegment_train(self.data_dir, self.src_tok, self.tgt_tok, self.cfg.train.bpe_dropout)
            path.parent.mkdir(exist_ok=True)
            split.save(path)
            keep = {path.name, f"epoch{epoch - 1:04d}.safetensors"}  # the epoch before, for a resume from `prev`
            for old in path.parent.glob("epoch*.safetensors"):
                if old.name not in keep:
                    old.unlink(missing_ok=True)
        self.dist.barrier()
        split = EncodedSplit.load(path)
        return split, self._sampler(split)

    def _fit_config_to_data(self, cfg: cfgmod.RunConfig) -> cfgmod.RunConfig:
        joint = self.src_tok is self.tgt_tok
        model = cfgmod.replace(cfg.model, src_vocab_size=self.src_tok.vocab_size,
                               tgt_vocab_size=self.tgt_tok.vocab_size,
                               share_embeddings=cfg.model.share_embeddings and joint)
        return cfgmod.replace(cfg, model=model)

    def data_fingerprint(self) -> str:
        split = self.train_split
        return (f"{len(split.src_lens):,} training pairs of {int(split.src_lens.sum()):,} + "
                f"{int(split.tgt_lens.sum()):,} tokens")

    def checkpoint_languages(self) -> dict[str, str | None]:
        return self.languages if any(self.languages.values()) else {}

    def tokenizer_blobs(self) -> dict[str, bytes]:
        blobs = {"src": self.src_tok.to_bytes()}
        if self.tgt_tok is not self.src_tok:
            blobs["tgt"] = self.tgt_tok.to_bytes()
        return blobs

    # --- one update -------------------------------------------------------------------------
    def train_step(self, batches: list[Batch]) -> dict[str, float]:
        """One optimizer update over this rank's `batches` (gradient accumulation), the loss normalised by
        the target tokens of all ranks: DDP's gradient mean then equals one process training on them all."""
        t = self.cfg.train
        self.model.train()  # no gradients here: apply_update let the last update's go
        (n_tokens,) = self.dist.sum(sum(b.n_tokens for b in batches))
        total_loss = total_nll = 0.0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            with self.dist.no_sync(self.train_model, sync=i == len(batches) - 1):
                loss, nll, aux = self.batch_losses(self.train_model, batch, t.dtype)
                ((loss + aux) * self.dist.world / n_tokens).backward()
            total_loss, total_nll = total_loss + loss.item(), total_nll + nll.item()
        total_loss, total_nll = self.dist.sum(total_loss, total_nll)  # every rank takes the same skip decision
        lr = self.apply_update(total_loss)
        return {"loss": total_loss / n_tokens, "nll": total_nll / n_tokens, "lr": lr, "tokens": n_tokens}

    def objective(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
        """`training_losses` of `batch` under this run's model (unwrapped: DDP's wrapper is `train_model`)."""
        return training_losses(self.model, batch, self.cfg.train.label_smoothing, self.cpu.row_multiple)

    def batch_losses(self, forward: Callable, batch: Batch, dtype: str) -> tuple:
        """`forward(batch)` in precision `dtype`: the label-smoothed loss and the NLL, summed over target tokens (and
        from `training_losses` the auxiliary loss)."""
        with autocast(self.device, dtype), self.cpu.precision(dtype):
            return forward(batch)

    def row_budget(self) -> int:
        return self.cfg.train.max_tokens

    def precision_passes(self) -> Passes:
        """Forward + backward of the first batches of epoch 0 (their sentences; in float32 in row slices), for
        `train.dtype: auto`."""
        first = self.sampler.batches(0)[:PROBE_BATCHES]

        def parts(dtype: str) -> list[Batch]:
            sliced = [rows[s] for rows in first for s in probe_parts(len(rows), dtype)]
            return [b.to(self.device) for b in iterate_batches(self.train_split, sliced)]
        batches = {dtype: parts(dtype) for dtype in ("float32", "bfloat16")}

        def passes(dtype: str) -> None:
            for batch in batches[dtype]:
                loss, _, aux = self.batch_losses(self.objective, batch, dtype)
                (loss + aux).backward()
        return passes

    # --- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Dev loss and perplexity under teacher forcing, and greedy BLEU against the raw references."""
        if self.valid_split is None:
            return {}
        t = self.cfg.train
        self.model.eval()
        sampler = TokenBatchSampler(self.valid_split.src_lens, self.valid_split.tgt_lens, t.max_tokens,
                                    shuffle=False)
        loss = nll = tokens = 0.0
        for batch in iterate_batches(self.valid_split, sampler.batches(0)):
            batch = batch.to(self.device)
            l, n = self.batch_losses(lambda b: model_losses(self.model, b, t.label_smoothing, self.cpu.row_multiple),
                                     batch, t.dtype)
            loss, nll, tokens = loss + l.item(), nll + n.item(), tokens + batch.n_tokens
        metrics = {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 50))}
        if t.eval_bleu and (self.data_dir / "valid.src.txt").exists():
            metrics.update(self.dev_bleu())
        return metrics

    def dev_bleu(self) -> dict[str, float]:
        """Greedy BLEU / chrF / exact match on the first `eval_max_sentences` dev sentences, computed as the final
        evaluation of a saved checkpoint computes them (same search, float32, a fresh Translator). BLEU is tokenised
        for the target language prepare recorded (else the references' script), chosen once and logged with
        sacreBLEU's signature: a Chinese target scored with 13a would read about 0 at every epoch."""
        t = self.cfg.train
        src = read_lines(self.data_dir / "valid.src.txt")
        ref = read_lines(self.data_dir / "valid.tgt.txt")
        if t.eval_max_sentences:
            src, ref = src[: t.eval_max_sentences], ref[: t.eval_max_sentences]
        first = self._bleu_tokenizer is None
        if first:
            self._bleu_tokenizer = bleu_tokenizer(ref, lang=self.languages["tgt"])
        translator = Translator(self.inference_model(), self.src_tok, self.tgt_tok, device=self.device,
                                max_len_a=t.max_len_a, max_len_b=t.max_len_b)
        _, s = translate_and_score(translator, src, ref, tokenizer=self._bleu_tokenizer)
        if first:
            self.log.say(f"dev BLEU: tokenizer {s.tokenizer.describe()}; sacreBLEU {s.signature}; chrF "
                         f"{s.signature_chrf}")
        return {"bleu": s.bleu, "bleu_lc": s.bleu_lc, "chrf": s.chrf, "exact": s.exact}

    def _is_better(self, metrics: dict[str, float]) -> bool:
        key = "bleu" if self.cfg.train.best_metric == "bleu" and "bleu" in metrics else "loss"
        value = metrics[key] if key == "bleu" else -metrics[key]
        if self.state.best is None or value > self.state.best:
            self.state.best = value
            return True
        return False

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        """Train until max_epochs, max_steps or the wall-clock budget; returns the last dev metrics."""
        t = self.cfg.train
        n_params = sum(p.numel() for p in self.model.parameters())
        n_trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)  # train.freeze, LoRA
        trained = "" if n_trained == n_params else f" ({n_trained:,} of them trained)"
        self.log.say(f"{'resuming' if self.state.step else 'starting'} at step {self.state.step}, epoch "
                     f"{self.state.epoch}; {n_params:,} parameters{trained} on {self.device}; budget "
                     f"{t.max_minutes or 'none'} min")
        clock = time.monotonic() - self.state.elapsed_s  # elapsed_s = monotonic() - clock
        last_save, eval_reserve, metrics = time.monotonic(), 0.0, {}
        stopped = False
        while self.state.epoch < t.max_epochs and not stopped:
            split, sampler = self.epoch_data(self.state.epoch)
            batches = sampler.batches(self.state.epoch)
            todo = batches[self.state.batch_in_epoch :]
            per_update = t.accumulate * self.dist.world  # batches of all ranks per update
            bar = tqdm(total=math.ceil(len(todo) / per_update), desc=f"epoch {self.state.epoch + 1}",
                       disable=self.progress_disabled(), dynamic_ncols=True, leave=False)
            window_tokens, window_start = 0, time.monotonic()
            for start in range(0, len(todo), per_update):
                group = todo[start : start + per_update]
                if len(group) < self.dist.world:  # too few for every rank: the epoch's last few are left out
                    break
                mine = list(iterate_batches(split, group[self.dist.rank :: self.dist.world]))
                stats = self.train_step(mine)
                self.state.batch_in_epoch += len(group)
                self.state.elapsed_s = time.monotonic() - clock
                window_tokens += stats["tokens"]
                if self.state.step % t.log_every == 0:
                    tok_s = window_tokens / max(1e-9, time.monotonic() - window_start)
                    self.log.write("train", self.state.step, epoch=self.state.epoch, elapsed_s=self.state.elapsed_s,
                                   loss=stats["loss"], nll=stats["nll"], lr=stats["lr"], tok_s=tok_s)
                    bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}", tok_s=f"{tok_s:,.0f}")
                    window_tokens, window_start = 0, time.monotonic()
                bar.update(1)
                if self.out_of_budget(eval_reserve):
                    stopped = True
                    break
                self.stop_if_asked()
                if (t.save_every_steps and self.state.step % t.save_every_steps == 0
                        or time.monotonic() - last_save > t.save_every_minutes * 60):
                    self.save_last()
                    last_save = time.monotonic()
            bar.close()
            if not stopped:
                self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
            eval_start = time.monotonic()
            metrics = self.evaluate() if self.dist.is_main else {}
            self._attention_image()
            eval_reserve = time.monotonic() - eval_start
            self.state.elapsed_s = time.monotonic() - clock
            self._end_of_epoch(metrics)
            last_save = time.monotonic()
        self.log.say(f"finished at step {self.state.step} after {self.state.elapsed_s / 60:.1f} min of training"
                     + (f"; {self.state.skipped_total} non-finite updates skipped" if self.state.skipped_total else ""))
        self.write_report()
        self.log.close()
        return metrics

    def _attention_image(self) -> None:
        """The first dev sentence's attention under the current weights, into TensorBoard at this step (the
        same picture as report.html's samples); a failure is a warning, never the end of the run."""
        if not self.log.images:
            return
        from attnkit.viz.report import dev_attention_figure  # here: importing attnkit stays matplotlib-free

        t = self.cfg.train
        try:
            translator = Translator(self.inference_model(), self.src_tok, self.tgt_tok, device=self.device,
                                    max_len_a=t.max_len_a, max_len_b=t.max_len_b)
            fig = dev_attention_figure(translator, self.data_dir)
            if fig is not None:
                self.log.figure("attention/dev sentence", fig, self.state.step)
        except Exception as e:  # noqa: BLE001 - a picture must never cost a training run
            self.log.say(f"warning: no attention image for TensorBoard: {type(e).__name__}: {e}")

    def _end_of_epoch(self, metrics: dict[str, float]) -> None:
        if metrics:
            self.log.write("valid", self.state.step, epoch=self.state.epoch, elapsed_s=self.state.elapsed_s,
                           **metrics)
            self.log.say(f"epoch {self.state.epoch} step {self.state.step} "
                         f"({self.state.elapsed_s / 60:.1f} min): "
                         + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
            if self.progress and self.dist.is_main:
                tqdm.write(f"epoch {self.state.epoch} | step {self.state.step} | "
                           + " | ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
            if self._is_better(metrics):
                self.save(self.best_path, full=False)
        self._save_epoch()
        self.save_last()

    def _save_epoch(self) -> None:
        """Model-only weights of each finished epoch, the latest `keep_epochs`, for checkpoint averaging."""
        keep = self.cfg.train.keep_epochs
        if not keep or self.state.batch_in_epoch or not self.dist.is_main:  # a budget stop mid-epoch is not an epoch
            return
        self.save(self.run_dir / "checkpoints" / f"epoch{self.state.epoch:04d}.safetensors", full=False)
        for old in epoch_checkpoints(self.run_dir)[:-keep]:
            old.unlink(missing_ok=True)
