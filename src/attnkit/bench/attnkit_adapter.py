"""attnkit's adapters for the standard workloads: the models and searches users get from attnkit, in float32
and (variant "int8", decoding only) with the int8 weights of `attnkit translate --quantize int8`. On the
mt-opus-* workloads the model is the opus-mt-shape MarianMTModel directory imported once by attnkit's Marian
importer (bench.opus), loaded as `attnkit translate` loads a checkpoint.

The bench's measuring processes are attnkit's own, so they take the allocator setting the `attnkit` command
takes for decoding (`attnkit.cpu.keep_freed_memory`, glibc keeps freed memory for reuse); the tables'
notes say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import sentencepiece as spm
import torch
from torch import nn

from attnkit import __version__
from attnkit.bench import opus
from attnkit.bench.catalog import MT_DECODING, OPUS_WORKLOADS
from attnkit.bench.int8_families import saturating_side
from attnkit.bench.workloads import LMAdapter, LMShape, Mems, MTAdapter, MTShape, Toolkit, decoding_only
from attnkit.checkpoint import load_checkpoint, model_from
from attnkit.config import EOS_ID, PAD_ID, UNK_ID, RNNLMConfig, TransformerConfig, TransformerXLConfig
from attnkit.cpu import for_inference, int8_kernels, int8_unavailable, keep_freed_memory, training_scope
from attnkit.decode import beam_search, greedy_search
from attnkit.models import Transformer, build_model

# The benchmarks never change a model's weights: its inference copy is made once, as a Translator's is.
_FAST: weakref.WeakKeyDictionary[nn.Module, dict[bool, nn.Module]] = weakref.WeakKeyDictionary()


def inference_copy(model: nn.Module, int8: bool = False) -> nn.Module:
    """attnkit.cpu.for_inference(model), made once per model and int8 setting (int8: the scheme from
    attnkit.bench.int8_families' variable)."""
    per_kind = _FAST.setdefault(model, {})
    if int8 not in per_kind:
        per_kind[int8] = for_inference(model, int8=int8, saturating=saturating_side())
    return per_kind[int8]


def attnkit_mt_build(s: MTShape) -> nn.Module:
    keep_freed_memory()  # as the attnkit command does for decoding
    return Transformer(TransformerConfig(src_vocab_size=s.vocab, tgt_vocab_size=s.vocab, d_model=s.d_model,
                                         n_heads=s.heads, d_ff=s.ffn, n_encoder_layers=s.layers,
                                         n_decoder_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                         activation_dropout=s.dropout))


def attnkit_mt_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int, int8: bool = False) -> torch.Tensor:
    """Exactly n_new tokens per source (EOS blocked by min_len) -> (B, n_new)."""
    kw = dict(max_len_a=0.0, max_len_b=n_new, min_len=n_new)
    fast = inference_copy(model, int8)
    hyps = greedy_search(fast, src, **kw) if beam == 1 else beam_search(fast, src, beam=beam, **kw)
    return torch.tensor([h[0].tokens for h in hyps])


def attnkit_lm_build(kind: str) -> Callable[[LMShape], nn.Module]:
    def build(s: LMShape) -> nn.Module:
        keep_freed_memory()
        cfg = TransformerXLConfig(kind=kind, vocab_size=s.vocab, d_model=s.d_model, n_heads=s.heads, d_ff=s.ffn,
                                  n_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                  max_positions=max(1024, s.context))
        return build_model(kind, cfg)

    return build


def attnkit_lstm_build(s: LMShape) -> nn.Module:
    keep_freed_memory()
    return build_model("lstm-lm", RNNLMConfig(vocab_size=s.vocab, d_model=s.d_model, n_layers=s.layers,
                                              dropout=s.dropout))


@contextlib.contextmanager
def attnkit_training(model: nn.Module, device: torch.device, tokens: int, dtype: str):
    """What attnkit's trainer opens around its steps: the CPU room's training scope, its rows padded for `tokens`
    per step where `dtype`'s kernel builds are costly (attnkit.cpu.training_scope)."""
    scope = training_scope(device, tokens)
    with scope.applied(model), scope.precision(dtype):
        yield


def attnkit_lm_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    """Training: the model itself (its training scope open); evaluation: its inference copy."""
    run = model if model.training else inference_copy(model)
    return run(x, mems, mem_len=s.memory)  # logits (B, T, V), memory L x (B, <= M, D) (vanilla: [])


def attnkit_mt_logits(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    return model(src, tgt_in)  # (B, T, V)


# --- the opus-mt-shape Marian model, imported ------------------------------------------------------
MARIAN_SPECIALS = {"</s>": EOS_ID, "<unk>": UNK_ID, "<pad>": PAD_ID}


@dataclass
class ImportedMarian:
    """attnkit's import of the Marian directory and its id maps (attnkit's ids are its own: PAD 0, BOS 1, ...)."""

    model: nn.Module
    to_own: torch.Tensor  # (V Marian,) attnkit's source id of each Marian id
    from_own: torch.Tensor  # (V attnkit,) the Marian id of each attnkit target id, -1 where none (BOS)
    params: int

    def eval(self) -> ImportedMarian:
        return self


def own_ids(tokenizer: bytes, vocab: list[str]) -> torch.Tensor:
    """(V Marian,) attnkit's id of each Marian piece in a checkpoint's sentencepiece model, matched by the piece;
    Marian's specials go to attnkit's."""
    sp = spm.SentencePieceProcessor(model_proto=tokenizer)
    ids = [MARIAN_SPECIALS.get(piece, sp.piece_to_id(piece)) for piece in vocab]
    lost = [p for p, i in zip(vocab, ids) if p not in MARIAN_SPECIALS and sp.id_to_piece(i) != p]
    if lost:
        raise RuntimeError(f"the imported tokenizer lacks {len(lost)} of vocab.json's pieces (first: {lost[0]!r})")
    return torch.tensor(ids)


def attnkit_marian_build(s: MTShape) -> ImportedMarian:
    keep_freed_memory()
    path = opus.ensure(s, ["attnkit"])["attnkit"]
    vocab = opus.marian_vocab(opus.part_path(s, "hf"))
    ckpt = load_checkpoint(path)
    model = model_from(ckpt, path).eval()
    to_own = own_ids(ckpt.tokenizers["src"], vocab)
    tgt = own_ids(ckpt.tokenizers.get("tgt", ckpt.tokenizers["src"]), vocab)
    from_own = torch.full((model.config.tgt_vocab_size,), -1).index_copy_(0, tgt, torch.arange(len(vocab)))
    return ImportedMarian(model, to_own, from_own, sum(p.numel() for p in model.parameters()))


def attnkit_marian_generate(m: ImportedMarian, src: torch.Tensor, beam: int, n_new: int, int8: bool = False
                            ) -> torch.Tensor:
    """(B, S) Marian ids -> (B, n_new) Marian ids, through attnkit's ids."""
    out = m.from_own[attnkit_mt_generate(m.model, m.to_own[src], beam, n_new, int8)]  # (B, n_new)
    if out.lt(0).any():  # BOS: the searches never produce it
        raise RuntimeError("the search produced a token that is not in vocab.json")
    return out


def marian_toolkit(tk: Toolkit) -> Toolkit:
    """tk with the opus-mt-shape workloads noted as missing where this machine cannot build their model."""
    why = opus.unavailable("attnkit")
    return dataclasses.replace(tk, missing={**{w: why for w in OPUS_WORKLOADS if why}, **tk.missing})


MT_NOTES = "Transformer: post-LN, ReLU, sinusoidal positions, one table for source, target and output"
MARIAN_NOTES = ("the MarianMTModel directory imported once by attnkit.formats.marian.import_marian (as `attnkit "
                "import --from marian` does) and loaded as `attnkit translate` loads a checkpoint: post-LN, swish, "
                "Marian's sinusoids, output bias, one table; PAD and BOS (Marian's pad) never produced; exactly T "
                "tokens: EOS banned before T, and one more decoder step, where the search ends the sentence with EOS")
ATTNKIT = Toolkit(
    name="attnkit", version=__version__,
    mt=MTAdapter(attnkit_mt_build, attnkit_mt_logits, attnkit_mt_generate, MT_NOTES, attnkit_training),
    marian=MTAdapter(attnkit_marian_build, decoding_only, attnkit_marian_generate, MARIAN_NOTES),
    lm={"xl": LMAdapter(attnkit_lm_build("transformer-xl"), attnkit_lm_forward,
                        "TransformerXL: post-LN, ReLU, relative sinusoidal positions with u/v biases, tied",
                        attnkit_training),
        "vanilla": LMAdapter(attnkit_lm_build("vanilla-lm"), attnkit_lm_forward,
                             "VanillaLM: post-LN, ReLU, absolute sinusoidal positions, tied", attnkit_training),
        "lstm": LMAdapter(attnkit_lstm_build, attnkit_lm_forward,
                          "LSTMLM: nn.LSTM's cells a layer at a time, time-major, attnkit's dropout between them, "
                          "embeddings scaled by sqrt(D), tied", attnkit_training)},
)


def int8_toolkit() -> Toolkit:
    """Decoding with int8 weights and dynamically quantised inputs (every linear map, output projection included)."""
    why = int8_unavailable()
    int8 = "; int8 weights (one scale per row), inputs quantised per product" + ("" if why else f" ({int8_kernels()})")
    return Toolkit(name="attnkit-int8", version=__version__,
                   mt=MTAdapter(attnkit_mt_build, attnkit_mt_logits,
                                functools.partial(attnkit_mt_generate, int8=True),
                                MT_NOTES + int8),
                   marian=MTAdapter(attnkit_marian_build, decoding_only,
                                    functools.partial(attnkit_marian_generate, int8=True), MARIAN_NOTES + int8),
                   missing={w: why for w in MT_DECODING} if why else {})


def toolkit(variant: str = "") -> Toolkit:
    return marian_toolkit(int8_toolkit() if variant == "int8" else ATTNKIT)
