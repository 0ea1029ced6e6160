"""Fine-tuning: a translation run that starts from a checkpoint's weights (`attnkit train --init-from CHECKPOINT`).

The checkpoint may be an attnkit run's or an imported model's (opus-mt / Marian, a Firefox model). The run keeps its
model exactly: its config is the checkpoint's model section (only the dropout rates may change, which shape
training, not what the weights compute), its data must be encoded with the checkpoint's own tokenizers (`attnkit
prepare --tokenizer-from CHECKPOINT`), so every id means what the model learnt, and it starts with a fresh optimizer
under the `finetune` preset's schedule unless another is named; `train.freeze` keeps parts of it as they are (the
embeddings, the encoder), which the optimizer then never sees. `train.lora_r` trains LoRA adapters alone, every
weight frozen (attnkit.nn.lora; Trainer.adapt attaches them); the run's weights-only checkpoints (best) hold them
merged, a plain model. The run's config records the checkpoint (`train.init_from`); a resume continues from the
run's own checkpoints. tests/test_finetune.py checks that the model starts with the checkpoint's dev loss, that a
mismatch of tokenizers or architecture is refused, and that a fine-tuning run resumes exactly; tests/test_lora.py
the same of a LoRA run, and that its checkpoints translate, export and run int8.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, load_checkpoint, tokenizer_difference
from attnkit.errors import AttnkitError, ConfigError

DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")  # what a fine-tuning run may set anew


def fine_tuning_config(path: str | Path, presets: list[str], overrides: list[str]) -> cfgmod.RunConfig:
    """The presets and overrides over the checkpoint's model section; `train.init_from` names the checkpoint. A
    preset or override that would change the architecture is refused, naming the fields."""
    ckpt = load_checkpoint(path)
    if cfgmod.family(ckpt.kind).task != "seq2seq":
        raise AttnkitError(f"{path} holds a '{ckpt.kind}' language model: --init-from takes a translation model")
    base = {"model": cfgmod.to_dict(ckpt.config.model), "train": {"init_from": str(path)}}  # LoRA's keys need it
    cfg = cfgmod.resolve(presets, overrides, base=base)
    own, asked = cfgmod.to_dict(ckpt.config.model), cfgmod.to_dict(cfg.model)
    changed = [f"model.{k} {own[k]} -> {asked.get(k)}" for k in own if k not in DROPOUTS and asked.get(k) != own[k]]
    if changed:
        raise AttnkitError(f"--init-from {path} keeps its model, but the presets or overrides change it: "
                           f"{'; '.join(changed)} (a fine-tuning preset sets train.* and the dropout rates only)")
    return cfgmod.replace(cfg, train=cfgmod.replace(cfg.train, init_from=str(path)))


def initial_checkpoint(path: str | Path, tokenizers: dict[str, bytes], data_dir: Path) -> Checkpoint:
    """The checkpoint a fine-tuning run starts from, refused in one line where the data was encoded with other
    tokenizers than its own."""
    ckpt = load_checkpoint(path)
    differs = tokenizer_difference(ckpt, dataclasses.replace(ckpt, tokenizers=tokenizers))
    if differs:
        raise AttnkitError(f"{data_dir} was prepared with other tokenizers than {path}'s ({differs}): prepare it with "
                           f"`attnkit prepare --tokenizer-from {path}` so that every id means what the model learnt")
    return ckpt


def freeze(model: nn.Module, parts: list[str]) -> None:
    """The named top-level parts of `model` stop learning (requires_grad off); an unknown name is a one-line error
    listing the parts there are."""
    children = {name: m for name, m in model.named_children() if any(True for _ in m.parameters())}
    unknown = [part for part in parts if part not in children]
    if unknown:
        raise ConfigError(f"train.freeze: {', '.join(unknown)} is not a part of this {type(model).__name__} (its "
                          f"parts with weights: {', '.join(children)})")
    for part in parts:
        children[part].requires_grad_(False)
