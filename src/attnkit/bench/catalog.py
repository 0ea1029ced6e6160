"""The standard workloads and the peer toolkits, named once (no torch import: the CLI's help reads them).

Workloads are those of ../shared/bench/WORKLOADS.md; a peer is measured when its package is installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

# (family, what the row measures) per workload; peak RSS (MT (d)) is a column of every row.
WORKLOADS: dict[str, tuple[str, str]] = {
    "mt-train": ("mt", "(a) training, target tokens/s"),
    "mt-greedy": ("mt", "(b) greedy decoding, generated tokens/s"),
    "mt-beam5": ("mt", "(c) beam 5 decoding, generated tokens/s"),
    "lm-train-xl": ("lm", "(a) training, XL, memory carried"),
    "lm-train-vanilla": ("lm", "(a) training, vanilla"),
    "lm-eval-xl": ("lm", "(b-XL) evaluation, segments + memory"),
    "lm-eval-vanilla": ("lm", "(b-vanilla) evaluation, sliding window"),
}
TRAIN_WORKLOADS = tuple(w for w in WORKLOADS if "-train" in w)
GROUPS = {"all": list(WORKLOADS), "mt": [w for w in WORKLOADS if WORKLOADS[w][0] == "mt"],
          "lm": [w for w in WORKLOADS if WORKLOADS[w][0] == "lm"]}


@dataclass(frozen=True)
class Peer:
    module: str  # its adapters: attnkit.bench.<module>
    package: str  # the import name of the library
    pip: str  # what to pip install
    label: str  # how the tables name it


PEERS: dict[str, Peer] = {
    "huggingface": Peer("huggingface", "transformers", "transformers", "HF transformers"),
    "xtransformers": Peer("xtransformers", "x_transformers", "x-transformers", "x-transformers"),
}
TOOLKIT_LABELS = {"attnkit": "attnkit", "machine": "machine", **{name: p.label for name, p in PEERS.items()}}


def installed(peer: str) -> bool:
    """Whether a peer's library can be imported (checked without importing it)."""
    return importlib.util.find_spec(PEERS[peer].package) is not None


def version(peer: str) -> str:
    try:
        return importlib.metadata.version(PEERS[peer].pip)
    except importlib.metadata.PackageNotFoundError:
        return ""
