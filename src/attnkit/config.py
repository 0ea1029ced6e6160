"""One config system: frozen dataclasses, YAML presets layered under dotted CLI overrides.

A run's config is `RunConfig(model=TransformerConfig, train=TrainConfig)`. Presets are YAML files in
`attnkit/configs/` (or any path); overrides look like `--model.d_model=256` or `train.lr=1e-3`.
The resolved config is written into the run folder and saved inside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnkit.errors import ConfigError

PRESET_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class TransformerConfig:
    """The encoder-decoder Transformer of Vaswani et al. (2017). Defaults are transformer-base."""

    kind: str = "transformer"  # the model family; see MODEL_CONFIGS
    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # residual + embeddings (paper section 5.4)
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"  # relu (paper) | gelu
    norm_first: bool = False  # False = post-LN as in the paper; True = pre-LN
    share_embeddings: bool = True  # one table for source, target and output (section 3.4); joint vocab
    tie_output: bool = True  # output projection = target embedding matrix
    max_positions: int = 1024
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.activation not in ("relu", "gelu"):
            raise ConfigError(f"model.activation must be relu or gelu, not {self.activation!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("model.share_embeddings needs a joint vocabulary (src and tgt vocab sizes differ)")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: optimisation, schedule, batching, budget and bookkeeping."""

    max_tokens: int = 4096  # padded tokens per batch (per rank)
    accumulate: int = 1  # batches per update
    lr: float | None = None  # peak learning rate; None with noam = the paper's d^-0.5 formula
    schedule: str = "noam"  # noam | inverse_sqrt | cosine | constant
    warmup: int = 4000
    max_steps: int = 0  # 0 = no limit; with cosine, the decay horizon
    max_epochs: int = 20
    max_minutes: float = 0.0  # wall-clock budget for the whole run (0 = none)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no clipping
    dtype: str = "float32"  # float32 | bfloat16 (autocast)
    seed: int = 1
    device: str = "auto"
    log_every: int = 50
    eval_bleu: bool = True  # greedy BLEU on the dev set after every epoch
    eval_max_sentences: int = 0  # 0 = the whole dev set
    best_metric: str = "loss"  # loss | bleu
    max_len_a: float = 1.2  # decoding length limit a*|src| + b
    max_len_b: int = 10
    save_every_minutes: float = 10.0  # also save `last` mid-epoch so a kill loses little
    keep_epochs: int = 5  # per-epoch weights kept for `attnkit average` (0 = none)

    def __post_init__(self) -> None:
        if self.schedule not in ("noam", "inverse_sqrt", "cosine", "constant"):
            raise ConfigError(f"train.schedule must be noam, inverse_sqrt, cosine or constant, not {self.schedule!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"train.dtype must be float32 or bfloat16, not {self.dtype!r}")
        if self.best_metric not in ("loss", "bleu"):
            raise ConfigError(f"train.best_metric must be loss or bleu, not {self.best_metric!r}")
        if self.max_tokens <= 0 or self.accumulate <= 0:
            raise ConfigError("train.max_tokens and train.accumulate must be positive")


# Model kind -> its config dataclass. Every model config has a `kind` field, so a YAML `model:`
# section (or a checkpoint's config) says which family it configures; families register here.
MODEL_CONFIGS: dict[str, type] = {"transformer": TransformerConfig}


@dataclass(frozen=True)
class RunConfig:
    """A seq2seq run: the model config of any registered kind (default the Transformer) + training."""

    model: Any = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# Model kind -> the run config class its checkpoints hold (families with another training setup,
# e.g. language models, register their own); unlisted kinds use RunConfig.
RUN_CONFIGS: dict[str, type] = {}


def model_config_class(kind: Any, where: str = "model.kind") -> type:
    if kind not in MODEL_CONFIGS:
        raise ConfigError(f"{where}: unknown model kind {kind!r} (known: {', '.join(sorted(MODEL_CONFIGS))})")
    return MODEL_CONFIGS[kind]


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys and ill-typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = dict(typing.get_type_hints(cls))
    if hints.get("model") is Any:  # a run config: the model section's `kind` picks its class
        model = data.get("model", {})
        kind = model.get("kind", "transformer") if isinstance(model, dict) else "transformer"
        hints["model"] = model_config_class(kind, f"{where + '.' if where else ''}model.kind")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise ConfigError(f"unknown config key '{path}' (known: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(hints[key], value, path)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _coerce(tp: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _coerce(next(a for a in args if a is not type(None)), value, path)
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{path}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v, path) for a, v in zip(args, value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp in (int, float, str) and (not isinstance(value, tp) or (tp is int and isinstance(value, bool))):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value


def preset_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"no such config file: {path}")
        return path
    candidate = PRESET_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset '{name_or_path}' (known: {known})")
    return candidate


def load_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML ({getattr(e, 'problem', None) or e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    # A preset may build on another: `base: transformer-small`.
    base = data.pop("base", None)
    return deep_merge(load_yaml(preset_path(base)), data) if base else data


def deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.d_model=256` -> (['model', 'd_model'], 256); values are parsed as YAML scalars."""
    text = text.removeprefix("--")
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = dict(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node[k] = dict(node.get(k) or {})
            node = node[k]
        node[keys[-1]] = value
    return data


def resolve(presets: list[str] = (), overrides: list[str] = (), cls: type = RunConfig) -> Any:
    """Layer presets (later wins), then overrides, into a validated `cls`."""
    data: dict = {}
    for p in presets:
        data = deep_merge(data, load_yaml(preset_path(p)))
    return from_dict(cls, apply_overrides(data, list(overrides)))


def replace(cfg: Any, **changes: Any) -> Any:
    return dataclasses.replace(cfg, **changes)
