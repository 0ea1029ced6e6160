"""Checkpoints: one safetensors file, no pickle.

Tensors: `model.*` weights (in a LoRA run's full checkpoints its adapters beside the frozen weights, which
`load_checkpoint` merges unless asked for them), `optim.<param index>.<name>` optimizer state, `tokenizer.src|tgt`
(the sentencepiece models as bytes, so a checkpoint translates on its own) and `rng.torch` (`rng.cuda`). Metadata (JSON
strings): format version, model kind, the run config, the training position, optimizer hyper-parameters and the
languages (`{"src": "zh", "tgt": "en"}`, as `attnkit prepare` recorded them; absent in older checkpoints).
Written to a temp file and renamed, so a kill leaves the previous checkpoint whole.

Loading never unpickles: a pickle or `torch.save` file (which can run arbitrary code when loaded) is
refused with a clear error, unless the user trusts it (`--trust-checkpoint`, the `attnkit.io.trust_pickle`
context variable); it must then hold a dict with this module's fields (kind, config as a dict,
model_state, tokenizers). Even trusted, it is read by torch's weights-only loader, which builds tensors and
plain data and calls nothing else the file names: every field above is such data, so a file that needs more
(an object of some class, a call) is no attnkit checkpoint and is refused, naming what it asked for, rather than
run (`attnkit import` reads other programs' pickles, fairseq's, with `attnkit.formats.inert_pickle`).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save_file

from attnkit import config as cfgmod
from attnkit.data.lm import LMVocab
from attnkit.data.moses_bpe import MAGIC
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.errors import CheckpointError
from attnkit.io import atomic_path, trust_pickle
from attnkit.models import build_model
from attnkit.nn.lora import merge_state_dict

FORMAT = "attnkit-checkpoint"
VERSION = 1
LM_VOCAB = "lm_vocab"  # the tokenizer entry of a language model's checkpoint: its LMVocab


@dataclass
class Checkpoint:
    kind: str
    config: cfgmod.RunConfig
    model_state: dict[str, torch.Tensor]
    tokenizers: dict[str, bytes]
    train_state: dict[str, Any] = field(default_factory=dict)
    optimizer_state: dict[str, Any] | None = None
    rng_state: torch.Tensor | None = None
    cuda_rng_state: torch.Tensor | None = None  # the current CUDA device's generator, when training there
    languages: dict[str, str | None] = field(default_factory=dict)  # {"src": code, "tgt": code} of the data
    # a lexical shortlist the searches decode over (attnkit.decode.shortlist.VocabShortlist.to_tensors; Marian's
    # models' lex.*.s2t.bin, imported by attnkit.formats.marian_bergamot); {}: none
    shortlist: dict[str, torch.Tensor] = field(default_factory=dict)


def save_checkpoint(path: str | Path, ckpt: Checkpoint, *, backup: str | Path | None = None) -> None:
    """Write `ckpt` atomically; with `backup`, the checkpoint `path` held before is kept there."""
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in ckpt.model_state.items()}
    for name, blob in ckpt.tokenizers.items():
        tensors[f"tokenizer.{name}"] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    tensors.update({f"shortlist.{k}": v.contiguous().cpu() for k, v in ckpt.shortlist.items()})
    meta = {
        "format": FORMAT,
        "version": str(VERSION),
        "kind": ckpt.kind,
        "config": json.dumps(cfgmod.to_dict(ckpt.config)),
        "train_state": json.dumps(ckpt.train_state),
    }
    if ckpt.languages:
        meta["languages"] = json.dumps(ckpt.languages)
    if ckpt.optimizer_state is not None:
        opt_tensors, opt_meta = _flatten_optimizer(ckpt.optimizer_state)
        tensors.update(opt_tensors)
        meta["optimizer"] = json.dumps(opt_meta)
    if ckpt.rng_state is not None:
        tensors["rng.torch"] = ckpt.rng_state
    if ckpt.cuda_rng_state is not None:
        tensors["rng.cuda"] = ckpt.cuda_rng_state
    with atomic_path(path, backup=backup) as tmp:
        try:  # straight from the tensors' memory: `safetensors.torch.save` held two copies of the file in memory,
            save_file(tensors, tmp, metadata=meta)  # each save a new peak of the run's memory
        except SafetensorError as e:  # its I/O errors, as the OSError atomic_path names (ENOSPC: "disk full")
            code = re.search(r"os error (\d+)", str(e))
            raise (OSError(int(code[1]), os.strerror(int(code[1]))) if code else OSError(errno.EIO, str(e))) from None


def _is_pickle(data: bytes) -> bool:
    """A pickle stream (protocol 2-5) or a zip (torch.save), and not a safetensors file (length + JSON header)."""
    if data[8:9] == b"{" and 8 + int.from_bytes(data[:8], "little") <= len(data):
        return False
    return (data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")) or data[:4] == b"PK\x03\x04"


def _checkpoint_file(path: Path) -> Path:
    """`path` if it is a file; otherwise an error that says what is there instead (for a folder: the
    checkpoints inside it, best and last first)."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"no such checkpoint: {path}")
    found = sorted(path.rglob("*.safetensors"), key=lambda p: (p.stem not in ("best", "last"), len(p.parts), str(p)))
    if not found:
        raise CheckpointError(f"{path} is a folder with no checkpoint (.safetensors) inside; a checkpoint is a file")
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    raise CheckpointError(f"{path} is a folder, not a checkpoint; it holds {', '.join(map(str, found[:3]))}{more}")


def check_checkpoint(path: str | Path) -> Path:
    """What can be known of a checkpoint from its header alone, checked before anything slow (reading the
    inputs, loading weights): a file, whole (its tensors end where the file ends), attnkit's format and a
    version this attnkit reads. A pickle passes here; `load_checkpoint` refuses it unless trusted."""
    path = _checkpoint_file(Path(path))
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(16)
        if head[8:9] != b"{" and _is_pickle(head):  # a safetensors header (JSON) starts at byte 8
            return path
        try:
            n = int.from_bytes(head[:8], "little")
            if not 2 <= n <= size - 8:
                raise ValueError(f"a header of {n} bytes in a file of {size}")
            f.seek(8)
            header = json.loads(f.read(n))
            end = max((entry["data_offsets"][1] for k, entry in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end != size:
                raise ValueError(f"its tensors need {8 + n + end} bytes, the file has {size}")
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path} is not a readable attnkit checkpoint (truncated or corrupt?): {e}") from None
    meta = header.get("__metadata__") or {}
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an attnkit checkpoint (format {meta.get('format')!r})")
    if not str(meta.get("version", "0")).isdigit() or int(meta.get("version", "0")) > VERSION:
        raise CheckpointError(f"{path} was written by a newer attnkit (checkpoint version {meta.get('version')})")
    return path


def load_checkpoint(path: str | Path, *, adapters: bool = False) -> Checkpoint:
    """The checkpoint at `path`. A LoRA run's full checkpoints (`last`, `prev`) hold its adapters beside the frozen
    weights (attnkit.nn.lora), which only its resume asks for (`adapters`); every other reader gets the plain model,
    each weight merged, so translate, export and ensembles take them as any other (tests/test_lora.py)."""
    path = check_checkpoint(path)
    data = path.read_bytes()
    if _is_pickle(data):
        return _load_trusted_pickle(path)
    try:
        tensors = st_load(data)
        meta = _read_metadata(data)
    except (SafetensorError, ValueError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not a readable attnkit checkpoint (truncated or corrupt?): {e}") from None
    kind = meta.get("kind", "")
    try:
        config = cfgmod.from_dict(cfgmod.family(kind).run, cfgmod.upgrade(json.loads(meta["config"])))
    except (cfgmod.ConfigError, json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{path}: its config cannot be read by this attnkit ({e})") from None
    model_state = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    return Checkpoint(
        kind=kind,
        config=config,
        model_state=model_state if adapters else _merged(model_state, config),
        tokenizers={k[10:]: v.numpy().tobytes() for k, v in tensors.items() if k.startswith("tokenizer.")},
        train_state=json.loads(meta.get("train_state", "{}")),
        optimizer_state=_unflatten_optimizer(tensors, json.loads(meta["optimizer"])) if "optimizer" in meta else None,
        rng_state=tensors.get("rng.torch"),
        cuda_rng_state=tensors.get("rng.cuda"),
        languages=_languages(meta, path),
        shortlist={k[10:]: v for k, v in tensors.items() if k.startswith("shortlist.")},
    )


def _merged(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """A state dict with its LoRA adapters merged, W + (alpha / r) B A (attnkit.nn.lora); others as they are."""
    rank = getattr(config.train, "lora_r", 0)  # a language model's run has no LoRA keys
    return merge_state_dict(state, config.train.lora_alpha / rank) if rank else state


def _languages(meta: dict[str, str], path: Path) -> dict[str, str | None]:
    try:
        languages = json.loads(meta.get("languages", "{}"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: its languages cannot be read ({e})") from None
    if not isinstance(languages, dict):
        raise CheckpointError(f"{path}: its languages are not a mapping ({languages!r})")
    return languages


def checkpoint_languages(path: str | Path) -> dict[str, str | None]:
    """{"src": code, "tgt": code} a checkpoint carries, read from its header alone (no weights loaded); {} for a
    checkpoint written before languages were recorded, or of data prepared without them."""
    path = check_checkpoint(path)
    with path.open("rb") as f:
        head = f.read(16)
        if head[8:9] != b"{":  # a trusted pickle (check_checkpoint passed it): no header to read
            return {}
        f.seek(0)
        return _languages(_read_metadata(f.read(8 + int.from_bytes(head[:8], "little"))), path)


def require_trust(path: Path, instead: str) -> None:
    """A pickle (torch.save) file is read only when the user trusts it (`--trust-checkpoint`, the
    `attnkit.io.trust_pickle` context variable), since unpickling can execute any code it names; `instead` says what
    attnkit reads without that trust."""
    if not trust_pickle.get():
        raise CheckpointError(f"{path} is a pickle (torch.save) file, and loading one can run code hidden in it; "
                              f"attnkit {instead}. Pass --trust-checkpoint only if you trust where this file came from")


def _load_trusted_pickle(path: Path) -> Checkpoint:
    """A pickled checkpoint: refused unless trusted, then read weights-only (the module docstring says why; a
    pickle that would run code is refused and never runs: tests/test_reliability.py)."""
    require_trust(path, "loads safetensors checkpoints")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # what torch's weights-only loader refuses: a class or call the file names
        raise CheckpointError(f"{path}: a pickle checkpoint must hold tensors and plain data only, and this one "
                              f"{_needs_more(e)}; attnkit reads it weights-only, even with --trust-checkpoint, "
                              "and runs nothing it names") from None
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path} could not be unpickled: {e}") from None
    try:
        config = cfgmod.from_dict(cfgmod.family(obj["kind"]).run, cfgmod.upgrade(obj["config"]))
        return Checkpoint(kind=obj["kind"], config=config, model_state=obj["model_state"],
                          tokenizers=obj["tokenizers"], train_state=obj.get("train_state", {}),
                          languages=obj.get("languages", {}))
    except (KeyError, TypeError, cfgmod.ConfigError) as e:
        raise CheckpointError(f"{path}: a trusted pickle checkpoint must be a dict with kind, config, "
                              f"model_state and tokenizers ({type(e).__name__}: {e})") from None


def _needs_more(error: pickle.UnpicklingError) -> str:
    """What torch's weights-only loader refused, from its message: a global ("Unsupported global: GLOBAL
    posix.mkdir was not an allowed global ...") or a pickle instruction ("Unsupported operand 149": the framing of
    `pickle.dump`'s protocol 4 and 5, which torch.save does not write)."""
    if found := re.search(r"GLOBAL (\S+)", str(error)):
        return f"names {found[1]}"
    if found := re.search(r"Unsupported operand (\S+)", str(error)):
        return f"uses pickle instruction {found[1]}, which torch's weights-only loader does not read (a pickle.dump " \
               "file? torch.save writes what it reads)"
    return "holds something else"


def load_weights(model: torch.nn.Module, ckpt: Checkpoint, path: str | Path) -> torch.nn.Module:
    """`model.load_state_dict` with a one-line error when the checkpoint's tensors do not fit the model."""
    try:
        model.load_state_dict(ckpt.model_state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1:2] or [str(e)]
        raise CheckpointError(f"{path}: its weights do not fit a '{ckpt.kind}' model built from its own config "
                              f"({first[0].strip()})") from None
    return model


def model_from(ckpt: Checkpoint, path: str | Path) -> torch.nn.Module:
    """The model a checkpoint holds, built from its own kind and config, with its weights (on the CPU)."""
    return load_weights(build_model(ckpt.kind, ckpt.config.model), ckpt, path)


def _lm_checkpoint(path: str | Path) -> Checkpoint:
    ckpt = load_checkpoint(path)
    if cfgmod.family(ckpt.kind).task != "lm" or LM_VOCAB not in ckpt.tokenizers:
        raise CheckpointError(f"{path} holds a '{ckpt.kind}' model, not a language model")
    return ckpt


def load_lm_checkpoint(path: str | Path, device: torch.device | str = "cpu"):
    """(model in eval mode, LMVocab, LMRunConfig) from a language model's checkpoint."""
    ckpt = _lm_checkpoint(path)
    return model_from(ckpt, path).to(device).eval(), LMVocab.from_bytes(ckpt.tokenizers[LM_VOCAB]), ckpt.config


def lm_vocab_of(path: str | Path) -> LMVocab:
    """A language model's vocabulary, without building the model."""
    return LMVocab.from_bytes(_lm_checkpoint(path).tokenizers[LM_VOCAB])


def lm_config_of(path: str | Path) -> cfgmod.LMRunConfig:
    """A language model's run config, without building the model."""
    return _lm_checkpoint(path).config


def _read_metadata(data: bytes) -> dict[str, str]:
    """The safetensors header: 8-byte little-endian length, then JSON with `__metadata__`."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]).get("__metadata__", {})


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def checkpoint_tokenizers(path: str | Path):
    """The (source, target) sentencepiece tokenizers of a translation checkpoint, the same object for a joint one:
    what `attnkit prepare --tokenizer-from` encodes new data with, so that a model fine-tuned on it keeps its ids."""
    ckpt = load_checkpoint(path)
    if "src" not in ckpt.tokenizers:
        raise CheckpointError(f"{path} holds a '{ckpt.kind}' model, not a translation model with tokenizers")
    blobs = [ckpt.tokenizers["src"], ckpt.tokenizers.get("tgt")]
    if any(blob is not None and blob.startswith(MAGIC) for blob in blobs):
        raise CheckpointError(f"{path} holds Moses + BPE tokenizers (a fairseq model's): --tokenizer-from takes "
                              "sentencepiece ones")
    src = SubwordTokenizer.from_bytes(blobs[0])
    return src, (src if blobs[1] is None else SubwordTokenizer.from_bytes(blobs[1]))


def epoch_checkpoints(run_dir: str | Path) -> list[Path]:
    """The per-epoch checkpoints of a run, oldest first."""
    return sorted((Path(run_dir) / "checkpoints").glob("epoch*.safetensors"))


def tokenizer_difference(ckpt: Checkpoint, other: Checkpoint) -> str | None:
    """What makes `ckpt`'s tokenizers other than `other`'s (None: the same ones). The one test of "the same
    tokenizers" (the same prepared data): ensembles and averages of checkpoints both need it."""
    for name in sorted(ckpt.tokenizers.keys() | other.tokenizers.keys()):
        if name not in ckpt.tokenizers or name not in other.tokenizers:
            return f"{'no' if name not in ckpt.tokenizers else 'an extra'} '{name}' tokenizer"
        if ckpt.tokenizers[name] != other.tokenizers[name]:
            return f"another '{name}' tokenizer"
    return None


def check_same_tokenizers(paths: list[str | Path], ckpts: list[Checkpoint], why: str) -> None:
    """One line naming the first checkpoint whose tokenizers are not the first one's, and what differs."""
    for path, ckpt in zip(paths[1:], ckpts[1:]):
        differs = tokenizer_difference(ckpt, ckpts[0])
        if differs:
            raise CheckpointError(f"{path} has other tokenizers than {paths[0]} ({differs}): {why}")


def model_difference(ckpt: Checkpoint, other: Checkpoint) -> str | None:
    """What makes `ckpt`'s network another one than `other`'s (None: the same): its kind, a field of its model
    config, or a tensor's name or shape. Dropout rates may differ: they change training, not what weights compute."""
    if ckpt.kind != other.kind:
        return f"a '{ckpt.kind}' model, not '{other.kind}'"
    mine, theirs = cfgmod.to_dict(ckpt.config.model), cfgmod.to_dict(other.config.model)
    for name in mine:
        if "dropout" not in name and mine[name] != theirs.get(name):
            return f"model.{name} {mine[name]}, not {theirs.get(name)}"
    if ckpt.model_state.keys() != other.model_state.keys():
        name = sorted(ckpt.model_state.keys() ^ other.model_state.keys())[0]
        return f"{'no' if name not in ckpt.model_state else 'an extra'} tensor {name}"
    for name, tensor in ckpt.model_state.items():
        if tensor.shape != other.model_state[name].shape:
            return f"{name} of shape {tuple(tensor.shape)}, not {tuple(other.model_state[name].shape)}"
    return None


def average_checkpoints(paths: list[str | Path], out: str | Path) -> Checkpoint:
    """Element-wise mean of the weights of `paths`, saved as a model-only checkpoint. They must hold the same
    network (`model_difference`) with the same tokenizers: a mean of other networks' weights is meaningless.

    Averaging the last few checkpoints smooths the noise of the final updates (Vaswani et al. 2017,
    section 6.1: the base models average the last 5 checkpoints).
    """
    if not paths:
        raise CheckpointError("average_checkpoints needs at least one checkpoint")
    ckpts = [load_checkpoint(p) for p in paths]
    first = ckpts[0]
    for path, ck in zip(paths[1:], ckpts[1:]):
        differs = model_difference(ck, first)
        if differs:
            raise CheckpointError(f"{path} holds another model than {paths[0]} ({differs}): cannot average them")
    check_same_tokenizers(paths, ckpts, "cannot average them (checkpoints of one run or of one prepared dataset)")
    mean = {name: torch.stack([ck.model_state[name].double() for ck in ckpts]).mean(0).to(tensor.dtype)
            for name, tensor in first.model_state.items()}
    last = ckpts[-1]
    averaged = Checkpoint(last.kind, last.config, mean, last.tokenizers,
                          {**last.train_state, "averaged_from": [str(p) for p in paths]}, languages=last.languages)
    save_checkpoint(out, averaged)
    return averaged
