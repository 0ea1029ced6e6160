"""Reading a Hugging Face `MarianMTModel` folder's files: config.json (`read_config`, what attnkit reads of it as a
`MarianConfig`), the weights (`read_weights`: model.safetensors, its shards, or a trusted pytorch_model.bin),
tokenizer_config.json, and where the folder is (`resolve_source`: local, or huggingface_hub's cache). Every
malformed file or field is one line naming the file and the field. The vocabularies and sentencepiece models are
read by `attnkit.formats.marian_vocab`; the mapping onto attnkit's model is `attnkit.formats.marian`'s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from attnkit.checkpoint import require_trust
from attnkit.errors import CheckpointError

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # HF's gelu is erf's, as F.gelu


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, not {type(data).__name__}")
    return data


_REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _field(cfg: dict, name: str, path: Path, tp: type, default: Any = _REQUIRED) -> Any:
    """config[name] of type `tp`, or `default` where it is absent (or null); one line naming the file and field."""
    value = cfg.get(name)
    if value is None:
        if default is _REQUIRED:
            raise CheckpointError(f"{path}: no field '{name}' (a MarianMTModel's config.json has it)")
        return default
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise CheckpointError(f"{path}: field '{name}' is {value!r}, not {_KINDS[tp]}")
    if tp is int and value < 0:
        raise CheckpointError(f"{path}: field '{name}' is {value}, not a count or id")
    return value


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


class Weights:
    """A MarianMTModel's tensors by name, each checked for presence and shape with a one-line error."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: Path):
        self.tensors, self.path = tensors, path
        # MarianMTModel's names start with `model.` (the bare MarianModel's do not); the output's never do
        self.prefix = "model." if any(k.startswith("model.") for k in tensors) else ""

    def has(self, name: str, top: bool = False) -> bool:
        return (name if top else self.prefix + name) in self.tensors

    def get(self, name: str, shape: tuple[int, ...], top: bool = False) -> torch.Tensor:
        key = name if top else self.prefix + name
        t = self.tensors.get(key)
        if t is None:
            raise CheckpointError(f"{self.path}: no tensor '{key}' (truncated, or not a MarianMTModel?)")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{self.path}: tensor '{key}' has shape {tuple(t.shape)}, config.json's "
                                  f"sizes make it {shape}")
        return t.float()

    def first(self, names: list[str], shape: tuple[int, ...]) -> torch.Tensor:
        """The first of several names a tied tensor may be saved under."""
        return self.get(next((n for n in names if self.has(n)), names[0]), shape)


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return st_load(path.read_bytes())
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def _pickled(path: Path) -> dict[str, torch.Tensor]:
    """pytorch_model.bin, a pickle: refused unless trusted (attnkit.checkpoint's rule), then read weights-only."""
    require_trust(path, "reads model.safetensors")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path}: not a readable torch.save file (truncated or corrupt?): "
                              f"{' '.join(str(e).split())[:300]}") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def read_weights(folder: Path) -> Weights:
    """model.safetensors, its shards (model.safetensors.index.json), or pytorch_model.bin (when trusted)."""
    single, index, pickled = (folder / n for n in ("model.safetensors", "model.safetensors.index.json",
                                                    "pytorch_model.bin"))
    if single.is_file():
        return Weights(_safetensors(single), single)
    if index.is_file():
        shards = read_json(index, "the list of weight shards").get("weight_map")
        if not isinstance(shards, dict):
            raise CheckpointError(f"{index}: no field 'weight_map'")
        tensors: dict[str, torch.Tensor] = {}
        for shard in dict.fromkeys(shards.values()):
            if not (folder / str(shard)).is_file():
                raise CheckpointError(f"{index}: its shard {shard} is missing")
            tensors.update(_safetensors(folder / str(shard)))
        return Weights(tensors, index)
    if pickled.is_file():
        return Weights(_pickled(pickled), pickled)
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin (the weights)")


def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder (or a file in one); else a Hugging Face hub name, from huggingface_hub's cache only."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"no such folder: {source}") from None
    try:
        return Path(snapshot_download(repo_id=str(source), local_files_only=True))
    except Exception as e:  # noqa: BLE001 - huggingface_hub answers a name it cannot find offline in many ways
        raise CheckpointError(f"{source}: no such folder, nor a model in the Hugging Face cache ({type(e).__name__}); "
                              f"attnkit reads models offline: download it first (hf download {source} --local-dir "
                              "DIR) and import DIR") from None


def read_tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    return read_json(path, "the tokenizer's settings") if path.exists() else {}


__all__ = ["ACTIVATIONS", "MarianConfig", "Weights", "read_config", "read_json", "read_tokenizer_config",
           "read_weights", "resolve_source"]
