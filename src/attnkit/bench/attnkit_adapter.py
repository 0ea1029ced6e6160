"""attnkit's adapters for the standard workloads: the models and searches users get from attnkit, in float32
and (variant "int8", decoding only) with the int8 weights of `attnkit translate --quantize int8`.

The bench's measuring processes are attnkit's own, so they take the allocator setting the `attnkit` command
takes for decoding (`attnkit.runtime.keep_freed_memory`, glibc keeps freed memory for reuse); the tables'
notes say so.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch
from torch import nn

from attnkit import __version__
from attnkit.bench.catalog import MT_DECODING
from attnkit.bench.workloads import LMAdapter, LMShape, Mems, MTAdapter, MTShape, Toolkit
from attnkit.config import TransformerConfig, TransformerXLConfig
from attnkit.decode import beam_search, greedy_search
from attnkit.models import Transformer, build_model
from attnkit.nn import PackedWeights, int8_kernels, int8_unavailable, prepacked
from attnkit.runtime import keep_freed_memory

# The benchmarks never change a model's weights: its prepacked copies are made once, as a Translator's are.
_PACKED: weakref.WeakKeyDictionary[nn.Module, dict[bool, PackedWeights]] = weakref.WeakKeyDictionary()


def packed_for(model: nn.Module, int8: bool = False) -> PackedWeights:
    per_kind = _PACKED.setdefault(model, {})
    return per_kind.setdefault(int8, PackedWeights(int8=int8))


def attnkit_mt_build(s: MTShape) -> nn.Module:
    keep_freed_memory()  # as the attnkit command does for decoding
    return Transformer(TransformerConfig(src_vocab_size=s.vocab, tgt_vocab_size=s.vocab, d_model=s.d_model,
                                         n_heads=s.heads, d_ff=s.ffn, n_encoder_layers=s.layers,
                                         n_decoder_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                         activation_dropout=s.dropout))


def attnkit_mt_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int, int8: bool = False) -> torch.Tensor:
    """Exactly n_new tokens per source (EOS blocked by min_len) -> (B, n_new)."""
    kw = dict(max_len_a=0.0, max_len_b=n_new, min_len=n_new)
    with prepacked(packed_for(model, int8)):
        hyps = greedy_search(model, src, **kw) if beam == 1 else beam_search(model, src, beam=beam, **kw)
    return torch.tensor([h[0].tokens for h in hyps])


def attnkit_lm_build(kind: str) -> Callable[[LMShape], nn.Module]:
    def build(s: LMShape) -> nn.Module:
        keep_freed_memory()
        cfg = TransformerXLConfig(kind=kind, vocab_size=s.vocab, d_model=s.d_model, n_heads=s.heads, d_ff=s.ffn,
                                  n_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                  max_positions=max(1024, s.context))
        return build_model(kind, cfg)

    return build


def attnkit_lm_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    with prepacked(packed_for(model)):
        return model(x, mems, mem_len=s.memory)  # logits (B, T, V), memory L x (B, <= M, D) (vanilla: [])


def attnkit_mt_logits(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    return model(src, tgt_in)  # (B, T, V)


MT_NOTES = "Transformer: post-LN, ReLU, sinusoidal positions, one table for source, target and output"
ATTNKIT = Toolkit(
    name="attnkit", version=__version__,
    mt=MTAdapter(attnkit_mt_build, attnkit_mt_logits, attnkit_mt_generate, MT_NOTES),
    lm={"xl": LMAdapter(attnkit_lm_build("transformer-xl"), attnkit_lm_forward,
                        "TransformerXL: post-LN, ReLU, relative sinusoidal positions with u/v biases, tied"),
        "vanilla": LMAdapter(attnkit_lm_build("vanilla-lm"), attnkit_lm_forward,
                             "VanillaLM: post-LN, ReLU, absolute sinusoidal positions, tied")},
)


def int8_toolkit() -> Toolkit:
    """Decoding with int8 weights and dynamically quantised inputs (every linear map, output projection included)."""
    why = int8_unavailable()
    notes = MT_NOTES + "; int8 weights (one scale per row), inputs quantised per product" + (
        "" if why else f" ({int8_kernels()})")
    return Toolkit(name="attnkit-int8", version=__version__,
                   mt=MTAdapter(attnkit_mt_build, attnkit_mt_logits,
                                functools.partial(attnkit_mt_generate, int8=True),
                                notes),
                   missing={w: why for w in MT_DECODING} if why else {})


def toolkit(variant: str = "") -> Toolkit:
    return int8_toolkit() if variant == "int8" else ATTNKIT
