"""Reading a Hugging Face `MarianMTModel` folder: config.json (`read_config`, what attnkit reads of it as a
`MarianConfig`), the weights (`read_weights`: model.safetensors, its shards, or a trusted pytorch_model.bin, as
`Weights` checked by name and shape), tokenizer_config.json; the files themselves are read by
`attnkit.formats.folder`, and every malformed file or field is one line naming the file and the field. The
vocabularies and sentencepiece models are read by `attnkit.formats.marian_vocab`; the mapping onto attnkit's model
is `attnkit.formats.marian`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from attnkit.errors import CheckpointError
from attnkit.formats.folder import Weights, field, read_json, read_state, resolve_source

_field = partial(field, owner="a MarianMTModel")
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # HF's gelu is erf's, as F.gelu


@dataclass(frozen=True)
class MarianConfig:
    """What attnkit reads of a MarianMTModel's config.json."""

    d_model: int
    n_heads: int
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    vocab_size: int  # rows of the encoder's (or the shared) embedding
    decoder_vocab_size: int
    max_positions: int
    activation: str  # attnkit's name
    scale_embedding: bool
    share: bool  # share_encoder_decoder_embeddings
    tie: bool  # tie_word_embeddings: the output projection is the decoder's embedding
    pad: int
    eos: int
    start: int  # decoder_start_token_id
    dropout: float
    attention_dropout: float
    activation_dropout: float


def _same(cfg: dict, path: Path, encoder: str, decoder: str, what: str) -> int:
    a, b = _field(cfg, encoder, path, int), _field(cfg, decoder, path, int)
    if a != b:
        raise CheckpointError(f"{path}: {encoder} {a} and {decoder} {b} differ; attnkit's Transformer has one {what}")
    return a


def read_config(folder: Path) -> MarianConfig:
    path = folder / "config.json"
    cfg = read_json(path, "the model's config")
    if cfg.get("model_type", "marian") != "marian":
        raise CheckpointError(f"{path}: field 'model_type' is {cfg['model_type']!r}, not 'marian'")
    d, heads = _field(cfg, "d_model", path, int), _same(cfg, path, "encoder_attention_heads",
                                                         "decoder_attention_heads", "number of heads")
    if d < 2 or d % 2 or heads < 1 or d % heads:
        raise CheckpointError(f"{path}: field 'd_model' {d} does not split into {heads} heads of an even size")
    act = _field(cfg, "activation_function", path, str, "gelu")  # MarianConfig's default
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{path}: field 'activation_function' is {act!r}; attnkit has "
                              f"{', '.join(ACTIVATIONS)}")
    share = _field(cfg, "share_encoder_decoder_embeddings", path, bool, True)
    vocab = _field(cfg, "vocab_size", path, int)
    pad = _field(cfg, "pad_token_id", path, int)
    eos = cfg.get("eos_token_id", 0)
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise CheckpointError(f"{path}: field 'eos_token_id' is {eos!r}, not one id")
    return MarianConfig(
        d_model=d, n_heads=heads, d_ff=_same(cfg, path, "encoder_ffn_dim", "decoder_ffn_dim", "FFN size"),
        n_encoder_layers=_field(cfg, "encoder_layers", path, int),
        n_decoder_layers=_field(cfg, "decoder_layers", path, int),
        vocab_size=vocab, decoder_vocab_size=vocab if share else _field(cfg, "decoder_vocab_size", path, int, vocab),
        max_positions=_field(cfg, "max_position_embeddings", path, int, 1024), activation=ACTIVATIONS[act],
        scale_embedding=_field(cfg, "scale_embedding", path, bool, False), share=share,
        tie=_field(cfg, "tie_word_embeddings", path, bool, True), pad=pad, eos=eos,
        start=_field(cfg, "decoder_start_token_id", path, int, pad),
        dropout=_field(cfg, "dropout", path, float, 0.1), attention_dropout=_field(cfg, "attention_dropout", path,
                                                                                   float, 0.0),
        activation_dropout=_field(cfg, "activation_dropout", path, float, 0.0))


def read_weights(folder: Path) -> Weights:
    """model.safetensors, its shards (model.safetensors.index.json), or pytorch_model.bin (when trusted).
    MarianMTModel's names start with `model.` (the bare MarianModel's do not); the output's never do."""
    tensors, path = read_state(folder)
    return Weights(tensors, path, "model." if any(k.startswith("model.") for k in tensors) else "",
                   kind="a MarianMTModel", sizes="config.json's sizes")


def read_tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    return read_json(path, "the tokenizer's settings") if path.exists() else {}


__all__ = ["ACTIVATIONS", "MarianConfig", "Weights", "read_config", "read_json", "read_tokenizer_config",
           "read_weights", "resolve_source"]
