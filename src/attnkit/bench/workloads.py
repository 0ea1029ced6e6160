"""The standard workloads' shapes and synthetic data (../shared/bench/WORKLOADS.md), and what a toolkit must
provide to be measured on them: an MT adapter (build, logits, generate), LM adapters (build, forward) and, for
the opus-mt-shape workloads, a Marian adapter (a model read from one Hugging Face MarianMTModel directory).

B batch, S source length, T target / segment length, M memory length, W vanilla window, V vocabulary,
D model dim, N evaluation tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

PAD, BOS, EOS = 0, 1, 2  # WORKLOADS.md: PAD 0, BOS 1, EOS 2, UNK 3
Mems = list[torch.Tensor] | None  # per layer (B, M, D), or whatever the toolkit carries


# --- shapes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MTShape:
    """Workload MT: encoder-decoder, shared vocabulary, tied embeddings, dropout 0.1."""

    vocab: int = 8000
    d_model: int = 256
    heads: int = 4
    ffn: int = 1024
    layers: int = 3  # encoder layers = decoder layers
    dropout: float = 0.1
    src_len: int = 24
    tgt_len: int = 24  # training target length and the exact number of generated tokens
    train_batch: int = 64
    greedy_batch: int = 64
    beam_batch: int = 16
    beam: int = 5
    warmup: int = 5
    steps: int = 20
    decode_runs: int = 3  # after one warm-up run


@dataclass(frozen=True)
class LMShape:
    """Workload LM: character-level decoder-only; XL = segment + memory, vanilla = window of `context`."""

    vocab: int = 256
    d_model: int = 256
    heads: int = 4
    ffn: int = 1024
    layers: int = 4
    dropout: float = 0.1
    batch: int = 32
    segment: int = 128
    memory: int = 384
    context: int = 512  # = segment + memory: the XL attention length and the vanilla window
    eval_tokens: int = 16384
    eval_warmup_segments: int = 8
    eval_passes: int = 3
    window_warmup: int = 8
    windows: int = 256
    warmup: int = 5
    steps: int = 20


# Transformer-base (Vaswani et al. 2017, table 3) for the mt-base-* decoding workloads; the rest as MT.
MT_BASE = MTShape(vocab=32000, d_model=512, heads=8, ffn=2048, layers=6)
# The shape of the Helsinki-NLP opus-mt models (Marian base; opus-mt-zh-en's vocabulary of 65,001) for the
# mt-opus-* decoding workloads; swish, the output bias and the shared table come with the model (bench.opus).
MT_OPUS = MTShape(vocab=65001, d_model=512, heads=8, ffn=2048, layers=6)


@dataclass(frozen=True)
class Shapes:
    mt: MTShape = field(default_factory=MTShape)
    lm: LMShape = field(default_factory=LMShape)
    mt_base: MTShape = MT_BASE
    mt_opus: MTShape = MT_OPUS
    matmul: tuple[int, ...] = (1024, 2048, 4096)  # n x n x n products; the fastest rate is the machine's peak
    matmul_runs: int = 5  # after one warm-up
    quick: bool = False


STANDARD = Shapes()
# The smoke mode: tiny shapes that exercise every code path in seconds. NOT the standard workloads.
QUICK = Shapes(
    MTShape(vocab=64, d_model=32, heads=2, ffn=64, layers=1, src_len=6, tgt_len=6, train_batch=4, greedy_batch=4,
            beam_batch=2, warmup=1, steps=2, decode_runs=1),
    LMShape(d_model=32, heads=2, ffn=64, layers=1, batch=2, segment=16, memory=48, context=64, eval_tokens=64,
            eval_warmup_segments=1, eval_passes=1, window_warmup=1, windows=4, warmup=1, steps=2),
    matmul=(128, 256), matmul_runs=3, quick=True,
    mt_base=MTShape(vocab=96, d_model=48, heads=4, ffn=96, layers=2, src_len=6, tgt_len=6, greedy_batch=4,
                    beam_batch=2, decode_runs=1),
    mt_opus=MTShape(vocab=203, d_model=32, heads=2, ffn=64, layers=2, src_len=6, tgt_len=6, greedy_batch=4,
                    beam_batch=2, decode_runs=1))


def mt_shape(workload: str, shapes: Shapes) -> MTShape:
    """The MT shape a workload runs at: Transformer-base for mt-base-*, opus-mt's for mt-opus-*, else MT's."""
    if workload.startswith("mt-opus-"):
        return shapes.mt_opus
    return shapes.mt_base if workload.startswith("mt-base-") else shapes.mt


# --- data (WORKLOADS.md, "Synthetic data only") ----------------------------------------------------
def mt_batch(b: int, shape: MTShape = MTShape()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S), decoder input [BOS] + tgt[:, :-1] (B, T), labels tgt (B, T); ids 4 .. V-1."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, shape.vocab, (b, shape.src_len), generator=g)
    tgt = torch.randint(4, shape.vocab, (b, shape.tgt_len), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS), tgt[:, :-1]], 1)
    return src, tgt_in, tgt


# A Marian vocabulary (vocab.json of an opus-mt model): EOS 0, UNK 1, then the pieces, PAD the last id (Marian's
# decoder starts from it). bench.opus builds the source pieces first, then the target ones.
MARIAN_EOS, MARIAN_UNK, MARIAN_FIRST_PIECE = 0, 1, 2


def marian_source_pieces(vocab: int) -> int:
    """How many of a V-token Marian vocabulary's pieces are source pieces (ids 2 .. 2 + n - 1): half of them."""
    return (vocab - 3) // 2


def opus_sources(b: int, shape: MTShape = MT_OPUS) -> torch.Tensor:
    """(B, S) Marian ids, the same for every toolkit: S - 1 random source pieces, then EOS as MarianTokenizer ends
    a sentence (the generator rule of WORKLOADS.md's MT data, over the source pieces)."""
    g = torch.Generator().manual_seed(0)
    first = MARIAN_FIRST_PIECE
    pieces = torch.randint(first, first + marian_source_pieces(shape.vocab), (b, shape.src_len - 1), generator=g)
    return torch.cat([pieces, torch.full((b, 1), MARIAN_EOS)], 1)


def lm_train_data(shape: LMShape = LMShape()) -> torch.Tensor:
    """(B, n*T + 1) byte streams for the n = warm-up + timed steps of the training workload."""
    n = shape.warmup + shape.steps
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, shape.vocab, (shape.batch, n * shape.segment + 1), generator=g)


def lm_train_batch(data: torch.Tensor, i: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step i: input columns [i*T, i*T+T) (B, T) and the same shifted by one as labels (B, T)."""
    return data[:, i * t : i * t + t], data[:, i * t + 1 : i * t + t + 1]


def lm_eval_data(shape: LMShape = LMShape()) -> torch.Tensor:
    """(N + W + 1,) one stream: N scored tokens plus room for full windows."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, shape.vocab, (shape.eval_tokens + shape.context + 1,), generator=g)


# --- toolkits: what a workload needs from a library ------------------------------------------------
# What a library opens around its training steps, as its own training loop does: (model, device, tokens per step,
# dtype) -> a context manager. attnkit's is its CPU room's training scope; a library with none gets plain_training.
TrainingContext = Callable[[nn.Module, torch.device, int, str], contextlib.AbstractContextManager]


def plain_training(model: nn.Module, device: torch.device, tokens: int, dtype: str
                   ) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class MTAdapter:
    build: Callable[[MTShape], nn.Module]
    logits: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # src (B, S), tgt_in (B, T) -> (B, T, V)
    generate: Callable[[nn.Module, torch.Tensor, int, int], torch.Tensor]  # src (B, S), beam, n_new -> (B, n_new)
    notes: str
    training: TrainingContext = plain_training


def decoding_only(model: object, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """The logits of an adapter that only decodes (an inference engine, the Marian workloads)."""
    raise RuntimeError("this adapter decodes only: it gives no training logits")


@dataclass(frozen=True)
class LMAdapter:
    build: Callable[[LMShape], nn.Module]
    forward: Callable[[nn.Module, torch.Tensor, Mems, LMShape], tuple[torch.Tensor, Mems]]  # x (B, T) -> (B, T, V)
    notes: str
    training: TrainingContext = plain_training


@dataclass(frozen=True)
class Toolkit:
    name: str
    version: str
    mt: MTAdapter | None = None
    lm: dict[str, LMAdapter] = field(default_factory=dict)  # "xl" and/or "vanilla"
    missing: dict[str, str] = field(default_factory=dict)  # workload -> why this toolkit cannot run it
    # The mt-opus-* workloads: build reads the cached MarianMTModel directory of the shape (bench.opus), generate
    # takes and returns Marian ids (vocab.json's), whatever ids the toolkit uses inside.
    marian: MTAdapter | None = None
