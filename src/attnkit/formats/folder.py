"""Reading the files other frameworks save a model in, whatever the model: JSON configs (`read_json`, `field`: one line
naming the file and the field for anything malformed), weights (`read_safetensors`, `read_pickled`, `read_state`:
model.safetensors, its shards, or a trusted torch.save file read weights-only; `Weights` checks each tensor's name
and shape), and where a model is (`resolve_source`: a local folder, or huggingface_hub's cache). What a format
makes of them is its own module's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from attnkit.checkpoint import require_trust
from attnkit.errors import CheckpointError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


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


REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}


def field(cfg: dict, name: str, path: Path, tp: type, default: Any = REQUIRED, *, owner: str = "the model") -> Any:
    """config[name] of type `tp`, or `default` where it is absent (or null); one line naming the file and field
    (`owner`: whose config.json has the field, for the message)."""
    value = cfg.get(name)
    if value is None:
        if default is REQUIRED:
            raise CheckpointError(f"{path}: no field '{name}' ({owner}'s config.json has it)")
        return default
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise CheckpointError(f"{path}: field '{name}' is {value!r}, not {_KINDS[tp]}")
    if tp is int and value < 0:
        raise CheckpointError(f"{path}: field '{name}' is {value}, not a count or id")
    return value


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return st_load(path.read_bytes())
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def read_pickled(path: Path, instead: str) -> Any:
    """A torch.save file: refused unless trusted (attnkit.checkpoint's rule; `instead` names what attnkit reads
    without that trust), then read weights-only: tensors, numbers, strings and containers of them, nothing that
    runs code."""
    require_trust(path, instead)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path}: not a readable torch.save file (truncated or corrupt?): "
                              f"{' '.join(str(e).split())[:300]}") from None


def tensors_only(state: Any, path: Path) -> dict[str, torch.Tensor]:
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def read_state(folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of model.safetensors, its shards (model.safetensors.index.json), or pytorch_model.bin (when
    trusted), and the file they came from."""
    single, index, pickled = (folder / n for n in WEIGHT_FILES)
    if single.is_file():
        return read_safetensors(single), single
    if index.is_file():
        shards = read_json(index, "the list of weight shards").get("weight_map")
        if not isinstance(shards, dict):
            raise CheckpointError(f"{index}: no field 'weight_map'")
        tensors: dict[str, torch.Tensor] = {}
        for shard in dict.fromkeys(shards.values()):
            if not (folder / str(shard)).is_file():
                raise CheckpointError(f"{index}: its shard {shard} is missing")
            tensors.update(read_safetensors(folder / str(shard)))
        return tensors, index
    if pickled.is_file():
        return tensors_only(read_pickled(pickled, "reads model.safetensors"), pickled), pickled
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin (the weights)")


class Weights:
    """A model's tensors by name (`prefix` + name), each checked for presence and shape with a one-line error that
    names the file, what the model should be (`kind`) and where the expected shape came from (`sizes`)."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: Path, prefix: str = "", *, kind: str, sizes: str):
        self.tensors, self.path, self.prefix, self.kind, self.sizes = tensors, path, prefix, kind, sizes

    def has(self, name: str, top: bool = False) -> bool:
        return (name if top else self.prefix + name) in self.tensors

    def get(self, name: str, shape: tuple[int, ...], top: bool = False) -> torch.Tensor:
        key = name if top else self.prefix + name
        t = self.tensors.get(key)
        if t is None:
            raise CheckpointError(f"{self.path}: no tensor '{key}' (truncated, or not {self.kind}?)")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{self.path}: tensor '{key}' has shape {tuple(t.shape)}, {self.sizes} make it "
                                  f"{shape}")
        return t.float()

    def first(self, names: list[str], shape: tuple[int, ...]) -> torch.Tensor:
        """The first of several names a tied tensor may be saved under."""
        return self.get(next((n for n in names if self.has(n)), names[0]), shape)


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


__all__ = ["REQUIRED", "WEIGHT_FILES", "Weights", "field", "read_json", "read_pickled", "read_safetensors",
           "read_state", "resolve_source", "tensors_only"]
