"""How a run trains: the `train:` section of its config (attnkit.config builds the whole run config from it).

`Optimisation` holds what every training run shares (`freeze` among it), `TrainConfig` a seq2seq run's (fine-tuning's
`init_from` and LoRA keys among them), `LMTrainConfig` a language model's. They live apart from the model configs
because nothing here depends on a model family; attnkit.config imports them from here, and they are imported from
there as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnkit.errors import ConfigError, did_you_mean

# What LoRA adapters may adapt (train.lora_targets; attnkit.nn.lora): the query, key and value rows of every
# attention's packed projection, its output projection W^O, and both products of every FFN
LORA_TARGETS = ("q", "k", "v", "o", "ffn")
_SCHEDULES = ("noam", "inverse_sqrt", "cosine", "constant")


@dataclass(frozen=True)
class Optimisation:
    """What every training run shares, declared and validated once: Adam(W), schedule, clipping, budget,
    precision, compilation and bookkeeping. `TrainConfig` (seq2seq) and `LMTrainConfig` add their own
    fields and change a few defaults (the papers' recipes differ)."""

    lr: float | None = None  # peak learning rate; None with noam = the paper's d^-0.5 formula
    schedule: str = "noam"  # noam | inverse_sqrt | cosine | constant
    warmup: int = 4000
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0  # AdamW's decoupled decay
    decay_vectors: bool = True  # decay biases and norms' gains too (fairseq); false: 2+-D parameters only (GPT-2)
    clip_norm: float = 0.0  # 0 = no clipping (the norm is still checked: a non-finite gradient skips the update)
    accumulate: int = 1  # batches (segments) per update
    max_steps: int = 0  # 0 = no limit; with cosine, the decay horizon
    max_minutes: float = 0.0  # wall-clock budget for the whole run (0 = none)
    horizon: str = "steps"  # cosine decays over: steps (max_steps) | time (max_minutes, or max_steps if sooner)
    cooldown: float = 0.0  # the last share of the horizon over which the lr falls linearly to 0 (0 = none)
    dtype: str = "float32"  # float32 | bfloat16 (autocast) | auto (the faster here, timed: attnkit.train.precision)
    compile: bool = False  # torch.compile the model's forward (and so its backward) for training
    compile_backend: str = "inductor"  # torch.compile's backend (aot_eager: graph capture without codegen)
    seed: int = 1
    freeze: list[str] = field(default_factory=list)  # the model's parts (top-level modules) that stay as they are
    device: str = "auto"
    log_every: int = 50

    def __post_init__(self) -> None:
        if self.schedule not in _SCHEDULES:
            raise ConfigError(f"train.schedule must be one of {', '.join(_SCHEDULES)}, not {self.schedule!r}")
        if self.dtype not in ("float32", "bfloat16", "auto"):
            raise ConfigError(f"train.dtype must be float32, bfloat16 or auto, not {self.dtype!r}")
        if self.dtype == "auto" and self.compile:
            raise ConfigError("train.dtype auto times both precisions, compiling the model twice: with train.compile "
                              "choose train.dtype float32 or bfloat16")
        if self.lr is not None and not 0.0 < self.lr < float("inf"):
            raise ConfigError(f"train.lr must be a positive number, not {self.lr}")
        if self.accumulate <= 0:
            raise ConfigError("train.accumulate must be positive")
        if min(self.warmup, self.max_steps) < 0 or self.clip_norm < 0 or self.max_minutes < 0:
            raise ConfigError("train.warmup, max_steps, clip_norm and max_minutes must not be negative")
        if self.horizon not in ("steps", "time"):
            raise ConfigError(f"train.horizon must be steps or time, not {self.horizon!r}")
        if self.horizon == "time" and (self.schedule != "cosine" and self.cooldown == 0 or self.max_minutes <= 0):
            need = (f"train.max_minutes > 0 (not {self.max_minutes:g})" if self.max_minutes <= 0 else
                    f"train.schedule cosine (not {self.schedule}) or train.cooldown > 0")
            raise ConfigError(f"train.horizon=time decays the cosine schedule or the cooldown over train.max_minutes: "
                              f"it needs {need}")
        if not 0.0 <= self.cooldown < 1.0:
            raise ConfigError(f"train.cooldown is a share of the horizon in [0, 1), not {self.cooldown}")
        needs = "train.cooldown" if self.cooldown > 0 else "the cosine schedule" if self.schedule == "cosine" else ""
        if needs and self.max_steps <= 0 and self.horizon == "steps":
            raise ConfigError(f"{needs} needs a horizon: train.max_steps > 0 or train.horizon=time")


@dataclass(frozen=True)
class TrainConfig(Optimisation):
    """How to train a seq2seq model: token-budget batches, per-epoch evaluation, checkpoints to average."""

    max_tokens: int = 4096  # padded tokens per batch (per rank)
    max_sentences: int = 0  # and at most this many sentence pairs per batch (0 = no cap; Kyubyong Park: 128)
    max_epochs: int = 20
    label_smoothing: float = 0.1
    bpe_dropout: float = 0.0  # > 0: a fresh BPE-dropout segmentation of the training text every epoch
    eval_bleu: bool = True  # greedy BLEU on the dev set after every epoch
    eval_max_sentences: int = 0  # 0 = the whole dev set
    best_metric: str = "loss"  # loss | bleu
    max_len_a: float = 1.2  # decoding length limit a*|src| + b
    max_len_b: int = 10
    save_every_minutes: float = 10.0  # also save `last` mid-epoch so a kill loses little
    save_every_steps: int = 0  # and every this many updates (0 = by time only)
    keep_epochs: int = 5  # per-epoch weights kept for `attnkit average` (0 = none)
    init_from: str = ""  # a checkpoint whose weights the run starts from (`attnkit train --init-from`; train/finetune)
    # LoRA (Hu et al. 2021; attnkit.nn.lora): a fine-tuning run trains rank-r adapters only, W + (alpha / r) B A
    lora_r: int = 0  # the adapters' rank r (peft's `r`; 0 = off: every weight not frozen trains)
    lora_alpha: float = 8.0  # alpha (peft's default; the paper sets it to the first r it tries and leaves it)
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # of LORA_TARGETS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.best_metric not in ("loss", "bleu"):
            raise ConfigError(f"train.best_metric must be loss or bleu, not {self.best_metric!r}")
        if self.max_tokens <= 0 or min(self.max_sentences, self.max_epochs) < 0:
            raise ConfigError("train.max_tokens must be positive (and train.max_sentences, max_epochs not negative)")
        if not 0 <= self.bpe_dropout < 1:
            raise ConfigError(f"train.bpe_dropout must be in [0, 1), got {self.bpe_dropout:g}")
        _check_lora(self)


def _check_lora(t: TrainConfig) -> None:
    """A rank of 0 (off) or more, a positive alpha, targets attnkit knows; adapters only on a trained model."""
    if t.lora_r < 0:
        raise ConfigError(f"train.lora_r must be 0 (off) or a positive rank, not {t.lora_r}")
    if not 0.0 < t.lora_alpha < float("inf"):
        raise ConfigError(f"train.lora_alpha must be a positive number, not {t.lora_alpha}")
    if not isinstance(t.lora_targets, list | tuple) or not t.lora_targets:
        raise ConfigError(f"train.lora_targets must be a list of some of {', '.join(LORA_TARGETS)}, "
                          f"not {t.lora_targets!r}")
    for name in (name for name in t.lora_targets if name not in LORA_TARGETS):
        raise ConfigError(f"train.lora_targets: unknown target {name!r}{did_you_mean(name, LORA_TARGETS)}")
    if t.lora_r and not t.init_from:
        raise ConfigError("train.lora_r adapts a trained model: start the run with `attnkit train --init-from "
                          "CHECKPOINT`")


@dataclass(frozen=True)
class LMTrainConfig(Optimisation):
    """How to train and evaluate a language model on ordered streams (Transformer-XL's recipe by default)."""

    lr: float | None = 2.5e-4
    schedule: str = "cosine"
    warmup: int = 0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_norm: float = 0.25
    max_steps: int = 1000
    tgt_len: int = 128  # segment length per update
    mem_len: int = 128  # XL memory kept per layer (ignored by the vanilla LM)
    eval_tgt_len: int = 0  # 0 = tgt_len
    eval_mem_len: int = -1  # -1 = mem_len (the paper evaluates with longer memory than it trains with)
    clamp_len: int = 0  # relative distances above this use R_clamp_len (0 = no clamping)
    # extended context (the XL reference's ext_len): the last ext_len tokens of each segment are read again,
    # not predicted, at the start of the next one (training and evaluation); the memory ends before them
    ext_len: int = 0
    eval_cache: int = 0  # `attnkit lm eval`'s continuous cache of hidden states (Grave et al. 2017); 0 = none
    batch_size: int = 32  # parallel streams
    eval_batch_size: int = 8
    eval_interval: int = 200  # updates between validation passes (and `last` checkpoints)
    eval_max_tokens: int = 0  # cap on validation tokens per periodic pass (0 = the whole split)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.tgt_len, self.batch_size, self.eval_batch_size, self.eval_interval) <= 0:
            raise ConfigError("train.tgt_len, batch_size, eval_batch_size, eval_interval must be positive")
        if min(self.mem_len, self.clamp_len, self.eval_tgt_len, self.ext_len, self.eval_cache) < 0 or \
                self.eval_mem_len < -1:
            raise ConfigError("train.mem_len, clamp_len, eval_tgt_len, ext_len, eval_cache must be >= 0 "
                              "(eval_mem_len >= -1)")

    @property
    def eval_lengths(self) -> tuple[int, int]:
        """(tgt_len, mem_len) used for evaluation."""
        return self.eval_tgt_len or self.tgt_len, self.mem_len if self.eval_mem_len < 0 else self.eval_mem_len
