"""One config system: frozen dataclasses, YAML presets layered under dotted CLI overrides (attnkit.presets).

A run's config is `RunConfig(model=TransformerConfig, train=TrainConfig)`; the `train:` sections are attnkit.recipes',
imported from here. Presets are YAML files in `attnkit/configs/` (or any path); overrides look like
`--model.d_model=256` or `train.lr=1e-3`.
The resolved config is written into the run folder and saved inside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from attnkit.errors import ConfigError, did_you_mean
from attnkit.legacy import variant_from_switches
from attnkit.presets import apply_overrides, deep_merge, load_yaml, preset_path
from attnkit.recipes import LMTrainConfig, Optimisation, TrainConfig  # noqa: F401 - configs are imported from here

# The ids every vocabulary reserves (attnkit.data.tokenizer makes sentencepiece use them): models mask PAD,
# searches start from BOS and stop at EOS. Fixed, not configurable: every stage relies on them.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# Fields older versions wrote into configs and checkpoints, with the one value they took (see `upgrade`).
RETIRED = {"model": {"pad_id": PAD_ID}}
# The FFN activations: relu (the paper), gelu (erf, as F.gelu), swish = SiLU, x * sigmoid(x) (Marian's)
ACTIVATIONS = ("relu", "gelu", "swish")
# Positions: sinusoidal (section 3.5) | learned rows added to the embeddings; none (order-blind); shaw (Shaw et al.)
POSITIONS = ("sinusoidal", "learned", "none", "shaw")
# The Transformer's variants (TransformerConfig.variant; attnkit.models.transformer.VARIANTS holds their classes):
# the paper's model, one part of its layer taken away or swapped each, Kyubyong Park's TensorFlow Transformer, and
# ssru: decoder layers with an SSRU in place of the self-attention (the Bergamot / Firefox models', attnkit.nn.ssru)
VARIANTS = ("paper", "no-residual", "no-ffn", "no-wo", "shared-qk", "no-scale", "batch-norm", "kyubyong", "ssru")
ATTENTION_VARIANTS = ("no-wo", "shared-qk", "no-scale", "kyubyong")  # those that change the attention's class



def _check_positive(cfg: Any, *names: str, section: str = "model") -> None:
    """Sizes must be at least 1: a zero or negative one fails later, deep inside torch, or divides by zero."""
    for name in names:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{section}.{name} must be at least 1, not {getattr(cfg, name)}")


def _check_heads(cfg: Any, **choices: tuple[str, ...]) -> None:
    """d_model splits evenly into heads; the FFN activation, the positions (and `choices`) are ones attnkit has."""
    if cfg.d_model % cfg.n_heads:
        raise ConfigError(f"model.d_model={cfg.d_model} is not divisible by model.n_heads={cfg.n_heads}")
    for name, known in {"activation": ACTIVATIONS, "positions": POSITIONS, **choices}.items():
        if getattr(cfg, name) not in known:
            raise ConfigError(f"model.{name} must be one of {', '.join(known)}, not {getattr(cfg, name)!r}")


def _check_fractions(cfg: Any, *names: str) -> None:
    for name in (name for name in names if not 0.0 <= getattr(cfg, name) < 1.0):
        raise ConfigError(f"model.{name} must be in [0, 1), not {getattr(cfg, name)}")


@dataclass(frozen=True)
class TransformerConfig:
    """The encoder-decoder Transformer of Vaswani et al. (2017). Defaults are transformer-base."""

    kind: str = "transformer"  # the model family; see FAMILIES
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
    activation: str = "relu"  # relu (paper) | gelu | swish (SiLU, Marian's)
    norm_first: bool = False  # False = post-LN as in the paper; True = pre-LN
    share_embeddings: bool = True  # one table for source, target and output (section 3.4); joint vocab
    tie_output: bool = True  # output projection = target embedding matrix
    output_bias: bool = False  # a learned bias on the vocabulary logits (`out_bias`; Marian's final_logits_bias)
    max_positions: int = 1024
    positions: str = "sinusoidal"  # sinusoidal (section 3.5) | learned (a row per position) | none | shaw (POSITIONS)
    relative_clip: int = 16  # positions: shaw: distances clipped to +-k (Shaw et al. 2018's k; tensor2tensor's 16)
    # every LayerNorm's epsilon: torch's default (HF's Marian's); Marian's own models' is 1e-6 (kyubyong: 1e-8, always).
    # Not the retired switch `layer_norm_eps` of older configs (attnkit.legacy), which spelled a variant
    norm_eps: float = 1e-5
    # The paper's model, or one of its variants (VARIANTS): a small subclass of the Transformer each
    # (attnkit.models.transformer), one part of the paper's layer taken away or Kyubyong Park's TensorFlow model
    variant: str = "paper"
    def __post_init__(self) -> None:
        _check_positive(self, "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers",
                        "n_decoder_layers", "max_positions", "relative_clip")
        _check_fractions(self, "dropout", "attention_dropout", "activation_dropout")
        _check_heads(self, variant=VARIANTS)
        if not 0.0 < self.norm_eps < 1.0:
            raise ConfigError(f"model.norm_eps must be in (0, 1), not {self.norm_eps}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("model.share_embeddings needs a joint vocabulary (src and tgt vocab sizes differ)")
        if self.positions == "shaw" and self.variant in ATTENTION_VARIANTS:
            raise ConfigError(f"model.variant {self.variant} and model.positions: shaw both change the attention; "
                              "choose one")


@dataclass(frozen=True)
class RunConfig:
    """A seq2seq run: the model config of any seq2seq family (default the Transformer) + training."""

    model: Any = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _model_kind(data: dict, default: str = "transformer") -> Any:
    """The `kind` a config's model section names (`default` when it names none)."""
    model = data.get("model")
    return model.get("kind", default) if isinstance(model, dict) else default


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys and ill-typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = dict(typing.get_type_hints(cls))
    if hints.get("model") is Any:  # a run config: the model section's `kind` picks its class
        default = cls.__dataclass_fields__["model"].default_factory().kind  # the run's own kind when none is named
        hints["model"] = family(_model_kind(data, default), f"{where + '.' if where else ''}model.kind").config
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise ConfigError(f"unknown config key {path!r}{did_you_mean(key, names, f'{where}.' if where else '')}")
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
    if tp is float and isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
        return _float(value, path)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp in (int, float, str) and (not isinstance(value, tp) or (tp is int and isinstance(value, bool))):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value


def _float(text: str, path: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{path}: expected float, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{path}: expected a finite number, got {text!r}")
    return value


def upgrade(data: dict) -> dict:
    """A config dict written by an older attnkit without its retired fields (RETIRED); one that set a retired
    field to another value is refused, since this version cannot honour it. A Transformer's structural switches
    become the variant they spell (attnkit.legacy)."""
    out = {k: dict(v) if isinstance(v, dict) and k in RETIRED else v for k, v in data.items()}
    for section, name, value in ((s, n, v) for s, fields in RETIRED.items() for n, v in fields.items()):
        if isinstance(out.get(section), dict) and name in out[section] and out[section].pop(name) != value:
            raise ConfigError(f"{section}.{name} is no longer configurable (it is always {value})")
    if isinstance(out.get("model"), dict):
        out["model"] = variant_from_switches(out["model"])
    return out


def resolve(presets: list[str] = (), overrides: list[str] = (), cls: type | None = None, *, base: dict = None) -> Any:
    """Layer presets (later wins) over `base` (a run's own config dict), then overrides, into a validated `cls`
    (default: the run config class of the model kind they name, RunConfig for seq2seq kinds)."""
    data: dict = dict(base or {})
    for p in presets:
        data = deep_merge(data, load_yaml(preset_path(p)))
    data = apply_overrides(upgrade(data), list(overrides))
    if cls is None:
        cls = family(_model_kind(data)).run
    return from_dict(cls, data)


def replace(cfg: Any, **changes: Any) -> Any:
    return dataclasses.replace(cfg, **changes)


# --- language models: Transformer-XL and the vanilla Transformer LM -------------------------------------------------
@dataclass(frozen=True)
class TransformerXLConfig:
    """A decoder-only LM: Transformer-XL (Dai et al. 2019) or the vanilla LM (Al-Rfou et al. 2018). Memory and position
    knobs that may differ between training and evaluation (mem_len, clamp_len) live in LMTrainConfig and are passed
    to `forward`; the model config holds the architecture."""

    kind: str = "transformer-xl"  # transformer-xl | vanilla-lm | recurrent-vanilla-lm
    vocab_size: int = 256
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 4
    dropout: float = 0.1  # embeddings, positions, residual branches, FFN activation (the XL reference's `dropout`)
    attention_dropout: float = 0.0  # attention probabilities (the XL reference's `dropatt`)
    activation: str = "relu"
    norm_first: bool = False  # False = post-LN (both papers); True = pre-LN
    same_length: bool = False  # XL: every query attends to the same number (mem_len) of keys
    # XL: one u, v pair (r_w_bias, r_r_bias) for all layers, the PyTorch reference's default; False = one pair
    # per layer (the reference's untie_r, which its TF scripts and released WikiText-103 / LM1B models use)
    share_uv: bool = False
    tie_output: bool = True  # output word vectors = input embedding (with cutoffs: tables and projections per cluster)
    max_positions: int = 1024  # vanilla: the sinusoids extend beyond this when needed, learned rows cannot
    # vanilla: sinusoidal | learned | none | shaw (POSITIONS); the XL's relative positions are sinusoids, always
    positions: str = "sinusoidal"
    relative_clip: int = 16  # positions: shaw: distances clipped to +-k
    # Adaptive input + adaptive softmax over the frequency-sorted vocabulary: cluster boundaries (ids below
    # cutoffs[0] are the head's shortlist; [] = one table and the full softmax), and the embedding size of
    # cluster i is d_model // div_val**i (Transformer-XL's div_val; 1 = full size everywhere).
    cutoffs: list[int] = field(default_factory=list)
    div_val: int = 1

    def __post_init__(self) -> None:
        if self.kind not in kinds("lm", TransformerXLConfig):
            raise ConfigError(f"model.kind must be one of {', '.join(kinds('lm', TransformerXLConfig))}, "
                              f"not {self.kind!r}")
        _check_positive(self, "vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_positions", "relative_clip")
        _check_heads(self)
        if self.kind == "transformer-xl" and self.positions != "sinusoidal":
            raise ConfigError(f"model.positions={self.positions!r}: Transformer-XL's relative positions are "
                              "sinusoids (section 3.3); other absolute positions are for the vanilla kinds")
        _check_clusters(self)


def _check_clusters(cfg: Any) -> None:
    """cutoffs: increasing positive ints (stored as a list); every cluster keeps at least one dimension.
    That they stay below the vocabulary size is checked when the model is built (the corpus sets it)."""
    cutoffs = cfg.cutoffs
    if not isinstance(cutoffs, list | tuple) or not all(type(c) is int and c > 0 for c in cutoffs) or any(
            b <= a for a, b in zip(cutoffs, cutoffs[1:])):
        raise ConfigError(f"model.cutoffs must be a list of increasing positive integers, not {cutoffs!r}")
    object.__setattr__(cfg, "cutoffs", list(cutoffs))  # frozen: normalise a tuple given in Python
    _check_positive(cfg, "div_val")
    if cfg.d_model // cfg.div_val ** len(cutoffs) < 1:
        raise ConfigError(f"model.div_val={cfg.div_val}: the last of {len(cutoffs) + 1} clusters would have "
                          f"d_model // div_val**{len(cutoffs)} = 0 dimensions")


@dataclass(frozen=True)
class RNNLMConfig:
    """An LSTM language model (attnkit.models.rnn_lm), the recurrent baseline of the Transformer-XL paper: the same
    (adaptive) embedding and softmax as the Transformer LMs, and the same `forward(x, mems)` interface."""

    kind: str = "lstm-lm"
    vocab_size: int = 256
    d_model: int = 256  # embedding = LSTM state size (one size, so the output layer can be tied)
    n_layers: int = 2
    dropout: float = 0.2  # embeddings, between LSTM layers, before the output layer
    tie_output: bool = True
    cutoffs: list[int] = field(default_factory=list)  # adaptive input + softmax, as TransformerXLConfig
    div_val: int = 1

    def __post_init__(self) -> None:
        if self.kind not in kinds("lm", RNNLMConfig):
            raise ConfigError(f"model.kind must be one of {', '.join(kinds('lm', RNNLMConfig))}, not {self.kind!r}")
        _check_positive(self, "vocab_size", "d_model", "n_layers")
        _check_fractions(self, "dropout")
        _check_clusters(self)


@dataclass(frozen=True)
class LMRunConfig:
    """A language-model run: the model (any LM kind) + its training."""

    model: Any = field(default_factory=TransformerXLConfig)  # the config of any LM family (kind picks it)
    train: LMTrainConfig = field(default_factory=LMTrainConfig)

    def __post_init__(self) -> None:
        if family(self.model.kind).task != "lm":
            raise ConfigError(f"model.kind {self.model.kind!r} is not a language model "
                              f"(one of {', '.join(kinds('lm'))})")


@dataclass(frozen=True)
class RNNConfig:
    """RNN encoder-decoders (attnkit.models.rnn): fixed vector C, Bahdanau, Luong and hard attention."""

    kind: str = "rnn-bahdanau"  # rnn-seq2seq | rnn-bahdanau | rnn-luong | rnn-hard
    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    cell: str = "gru"  # gru | lstm
    embed_dim: int = 256
    hidden: int = 512  # decoder state = encoder output; a bidirectional encoder has hidden/2 per direction
    attention_dim: int = 0  # additive attention (rnn-bahdanau, rnn-hard, rnn-luong concat): MLP size; 0 = hidden
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    bidirectional: bool = True
    dropout: float = 0.2  # embeddings, between stacked RNN layers, before the output layer
    reverse_source: bool = False  # read the source backwards (Sutskever et al. 2014)
    score: str = "general"  # rnn-luong: dot | general (bilinear) | concat (an MLP) | cosine (scaled, learned scale)
    input_feeding: bool = True  # rnn-luong: feed the attentional state h~_{t-1} into step t
    estimator: str = "reinforce"  # rnn-hard: reinforce (+ moving-average baseline) | gumbel (straight-through)
    gumbel_tau: float = 1.0  # rnn-hard with gumbel: temperature of the relaxed sample
    share_embeddings: bool = True  # one table for source and target; needs a joint vocabulary
    max_positions: int = 1024  # longest source the translator accepts (an RNN has no position table)

    def __post_init__(self) -> None:
        choices = {"kind": kinds("seq2seq", RNNConfig), "cell": ("gru", "lstm"),
                   "score": ("dot", "general", "concat", "cosine"), "estimator": ("reinforce", "gumbel")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model.{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        _check_positive(self, "src_vocab_size", "tgt_vocab_size", "max_positions")
        if min(self.embed_dim, self.hidden, self.n_encoder_layers, self.n_decoder_layers, self.gumbel_tau) <= 0:
            raise ConfigError("model.embed_dim, hidden, n_*_layers and gumbel_tau must be positive")
        if self.bidirectional and self.hidden % 2:
            raise ConfigError(f"model.hidden={self.hidden} must be even with a bidirectional encoder (hidden/2 each)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), not {self.dropout}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("model.share_embeddings needs a joint vocabulary (src and tgt vocab sizes differ)")

    @property
    def d_model(self) -> int:  # the width the noam schedule scales by (train.schedule=noam)
        return self.hidden


# --- the model families ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One model kind: a `model:` section (or a checkpoint's config) names it, which picks its config class and
    the run config its checkpoints hold; `task` says which trainer, searches and attention views serve it; `model`
    is its class in `attnkit.models.<module>`; `attention` lists the maps it returns, as `plot --kind` names them."""

    config: type
    run: type
    task: str  # seq2seq | lm
    model: str  # "module:Class" inside attnkit.models
    attention: tuple[str, ...]


FAMILIES: dict[str, Family] = {
    "transformer": Family(TransformerConfig, RunConfig, "seq2seq", "transformer:Transformer",
                          ("encoder", "decoder", "cross")),
    "rnn-seq2seq": Family(RNNConfig, RunConfig, "seq2seq", "rnn:RNNSeq2Seq", ()),  # a fixed vector: no attention
    "rnn-bahdanau": Family(RNNConfig, RunConfig, "seq2seq", "rnn:BahdanauSeq2Seq", ("cross",)),
    "rnn-luong": Family(RNNConfig, RunConfig, "seq2seq", "rnn:LuongSeq2Seq", ("cross",)),
    "rnn-hard": Family(RNNConfig, RunConfig, "seq2seq", "rnn:HardAttentionSeq2Seq", ("cross",)),
    "transformer-xl": Family(TransformerXLConfig, LMRunConfig, "lm", "transformer_xl:TransformerXL", ("self",)),
    "vanilla-lm": Family(TransformerXLConfig, LMRunConfig, "lm", "transformer_xl:VanillaLM", ("self",)),
    "recurrent-vanilla-lm": Family(TransformerXLConfig, LMRunConfig, "lm", "transformer_xl:RecurrentVanillaLM",
                                   ("self",)),
    "lstm-lm": Family(RNNLMConfig, LMRunConfig, "lm", "rnn_lm:LSTMLM", ()),
}


def family(kind: Any, where: str = "model.kind") -> Family:
    """The family of a model kind; an unknown one is a one-line ConfigError naming `where`."""
    if not isinstance(kind, str) or kind not in FAMILIES:
        raise ConfigError(f"{where}: unknown model kind {kind!r} (known: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[kind]


def kinds(task: str, config: type | None = None) -> tuple[str, ...]:
    """The kinds of one task ("seq2seq" or "lm"), optionally only those configured by `config`."""
    return tuple(k for k, f in FAMILIES.items() if f.task == task and config in (None, f.config))
