"""What a translation asks for (`DecodeOptions`: the search and its limits; the `quantize` a Translator runs) and
what it gets back (`Translation`).

`attnkit.decode.Translator` takes the one and returns the other; the CLI, the service and the CTranslate2 runner
share both, so a result means the same whichever ran the search.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from attnkit.cpu import int8_unavailable
from attnkit.decode.search import Hypothesis
from attnkit.errors import ConfigError


@dataclass(frozen=True)
class DecodeOptions:
    """How to search. beam 1 = greedy; sampling=True draws instead (temperature, top-k, top-p, seed)."""

    beam: int = 1
    nbest: int = 1
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    len_penalty: float = 1.0  # alpha; beam search ranks by score / penalty(length)
    len_style: str = "length"  # length: |Y|^alpha | gnmt: ((5 + |Y|) / 6)^alpha
    min_len: int = 0
    max_len_a: float | None = None  # None: the checkpoint's training setting
    max_len_b: int | None = None
    max_len: int = 0  # at most this many output tokens whatever the source length (0: a * |src| + b alone)
    no_repeat_ngram: int = 0
    attention_layer: int = -1

    def __post_init__(self) -> None:
        if self.beam < 1 or self.nbest < 1:
            raise ConfigError("--beam and --nbest must be at least 1")
        if self.nbest > self.beam and not self.sampling:
            raise ConfigError(f"--nbest {self.nbest} needs --beam of at least {self.nbest}")
        if self.len_style not in ("length", "gnmt"):
            raise ConfigError(f"--len-style must be length or gnmt, not {self.len_style!r}")
        if not 0.0 < self.top_p <= 1.0 or not self.temperature > 0 or self.top_k < 0:
            raise ConfigError("sampling needs temperature > 0, top_k >= 0 and 0 < top_p <= 1")
        if min(self.min_len, self.no_repeat_ngram, self.max_len) < 0:
            raise ConfigError("--min-len, --max-len and --no-repeat-ngram must not be negative")
        if not all(math.isfinite(x) for x in (self.len_penalty, self.temperature, self.max_len_a or 0.0)):
            raise ConfigError("--lenpen, --temperature and --max-len-a must be finite numbers")


@dataclass(frozen=True)
class TermUse:
    """A glossary term a source held, and whether its translation uses the target term (`note`: why not)."""

    source: str
    target: str
    placed: bool
    note: str = ""


@dataclass
class Translation:
    source: str
    text: str
    score: float  # summed log-probability of the output (EOS included)
    src_pieces: list[str]
    tgt_pieces: list[str]
    attention: torch.Tensor | None = None  # (len(tgt_pieces)+1, H, S): cross-attention of the chosen layer
    norm_score: float = 0.0  # the score the search ranked by
    nbest: list[Translation] = field(default_factory=list)  # the other hypotheses, best first
    tokens: list[int] = field(default_factory=list)  # the output's ids, without BOS and EOS
    terms: list[TermUse] = field(default_factory=list)  # the glossary terms the source held (translate(glossary=))

    @property
    def alignment(self) -> list[int]:
        """For each target piece, the source position it attends to most (heads averaged)."""
        if self.attention is None:
            raise ValueError("translate with need_attention=True to get alignments")
        return self.attention[: len(self.tgt_pieces)].mean(1).argmax(-1).tolist()


def pad_nbest(hyps: list, n: int) -> list[Hypothesis]:
    """Exactly n hypotheses: where constraints leave fewer paths (a forced prefix, a tiny length limit), the last
    one found is repeated, so that `--nbest n` always prints n lines per input."""
    return hyps[:n] + hyps[-1:] * (n - len(hyps))


QUANTIZATIONS = ("int8",)  # what `quantize` may name besides none (float32)


def usable_quantization(quantize: str | None, device: torch.device) -> str | None:
    """`quantize` where it runs fast on `device`; None (float32) with a warning saying why where it does not."""
    if quantize in (None, "none", "float32"):
        return None
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"quantize must be one of none, {', '.join(QUANTIZATIONS)}; got {quantize!r}")
    why = int8_unavailable() if device.type == "cpu" else f"int8 products run on the CPU only, not on {device}"
    if why:
        warnings.warn(f"--quantize int8: {why}; decoding in float32 instead", stacklevel=3)
        return None
    return quantize


__all__ = ["QUANTIZATIONS", "DecodeOptions", "TermUse", "Translation", "pad_nbest", "usable_quantization"]
