"""The standard workloads and the peer toolkits, named once (no torch import: the CLI's help reads them).

Workloads are those of ../shared/bench/WORKLOADS.md; a peer is measured when its package is installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

# (family, what the row measures) per workload; peak RSS (MT (d)) is a column of every row. The mt-base-*
# workloads are MT (b) and (c) at the shape of Transformer-base (see workloads.MT_BASE); the mt-opus-* ones the
# same at the shape of the opus-mt models, on one random MarianMTModel directory every toolkit reads (bench.opus).
WORKLOADS: dict[str, tuple[str, str]] = {
    "mt-train": ("mt", "(a) training, target tokens/s"),
    "mt-greedy": ("mt", "(b) greedy decoding, generated tokens/s"),
    "mt-beam5": ("mt", "(c) beam 5 decoding, generated tokens/s"),
    "mt-base-greedy": ("mt-base", "(b) greedy decoding at the Transformer-base shape, generated tokens/s"),
    "mt-base-beam5": ("mt-base", "(c) beam 5 decoding at the Transformer-base shape, generated tokens/s"),
    "mt-opus-greedy": ("mt-opus", "(b) greedy decoding of an opus-mt-shape Marian model, generated tokens/s"),
    "mt-opus-beam5": ("mt-opus", "(c) beam 5 decoding of an opus-mt-shape Marian model, generated tokens/s"),
    "lm-train-xl": ("lm", "(a) training, XL, memory carried"),
    "lm-train-vanilla": ("lm", "(a) training, vanilla"),
    "lm-eval-xl": ("lm", "(b-XL) evaluation, segments + memory"),
    "lm-eval-vanilla": ("lm", "(b-vanilla) evaluation, sliding window"),
    "lm-train-lstm": ("lm", "(a) training, LSTM, state carried (attnkit's own, beside a plain PyTorch loop)"),
}
TRANSFORMER_WORKLOADS = tuple(w for w in WORKLOADS if w != "lm-train-lstm")  # what the Transformer toolkits run
TRAIN_WORKLOADS = tuple(w for w in WORKLOADS if "-train" in w)
MT_DECODING = tuple(w for w in WORKLOADS if w.startswith("mt-") and w != "mt-train")
OPUS_WORKLOADS = tuple(w for w in WORKLOADS if WORKLOADS[w][0] == "mt-opus")
GROUPS = {"all": list(WORKLOADS), "mt": [w for w in WORKLOADS if WORKLOADS[w][0].startswith("mt")],
          "lm": [w for w in WORKLOADS if WORKLOADS[w][0] == "lm"], "opus": list(OPUS_WORKLOADS)}


@dataclass(frozen=True)
class Peer:
    module: str  # its adapters: attnkit.bench.<module>, whose toolkit(variant) returns them
    package: str  # the import name of the library
    pip: str  # what to pip install
    label: str  # how the tables name it
    variant: str = ""  # e.g. "int8": the same library in another precision
    workloads: tuple[str, ...] = TRANSFORMER_WORKLOADS  # the workloads it is planned on


# attnkit itself, always measured; its int8 inference on the decoding workloads only.
OWN: dict[str, Peer] = {
    "attnkit": Peer("attnkit_adapter", "attnkit", "attnkit", "attnkit", workloads=tuple(WORKLOADS)),
    "attnkit-int8": Peer("attnkit_adapter", "attnkit", "attnkit", "attnkit int8", "int8", MT_DECODING),
}
PEERS: dict[str, Peer] = {
    "huggingface": Peer("huggingface", "transformers", "transformers", "HF transformers"),
    "xtransformers": Peer("xtransformers", "x_transformers", "x-transformers", "x-transformers",
                          workloads=tuple(w for w in TRANSFORMER_WORKLOADS if w not in OPUS_WORKLOADS)),  # no Marian
    "pytorch": Peer("plain", "torch", "torch", "plain PyTorch", workloads=("lm-train-lstm",)),
    "ctranslate2": Peer("ctranslate2", "ctranslate2", "ctranslate2", "CTranslate2", "float32", MT_DECODING),
    "ctranslate2-int8": Peer("ctranslate2", "ctranslate2", "ctranslate2", "CTranslate2 int8", "int8", MT_DECODING),
}
TOOLKITS = {**OWN, **PEERS}
TOOLKIT_LABELS = {"machine": "machine", **{name: p.label for name, p in TOOLKITS.items()}}


def installed(peer: str) -> bool:
    """Whether a toolkit's library can be imported (checked without importing it)."""
    return importlib.util.find_spec(TOOLKITS[peer].package) is not None


def version(peer: str) -> str:
    try:
        return importlib.metadata.version(TOOLKITS[peer].pip)
    except importlib.metadata.PackageNotFoundError:
        return ""
