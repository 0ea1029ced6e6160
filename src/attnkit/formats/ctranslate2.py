"""The encoder-decoder Transformer as a CTranslate2 model (OpenNMT's C++ inference engine).

`export_checkpoint` writes a folder CTranslate2 loads (`model.bin`, `config.json`, the vocabularies: the pieces of
attnkit's sentencepiece model by id) plus the sentencepiece model(s) and `attnkit.json` (which tokenizer files and
decoding defaults go with it); `CT2Translator.from_dir(folder)` (`attnkit.formats.ct2_translator`) translates with
one as `attnkit.decode.Translator` does. docs/ctranslate2.md tells what is exported and how the scores map.

How the weights map onto CTranslate2's `TransformerSpec`: the packed [q; k; v] input projection of a
self-attention is CTranslate2's fused first linear map as it is; a cross-attention's q rows are its first map, its
[k; v] rows the second; post-LN is `pre_norm=False` (pre-LN, with its final LayerNorms, `pre_norm=True`); ReLU, GELU
(erf, as `F.gelu`) or swish (SiLU, CTranslate2's SWISH); the sinusoid table is the model's own, set explicitly
(CTranslate2's would put the sines and cosines in halves, not interleaved, from position 1); the embedding scale
sqrt(d_model) and the LayerNorm epsilon are written out (CTranslate2's default epsilon is not torch's); shared and
tied tables are one tensor, which CTranslate2 stores once; the output bias (`model.output_bias`, Marian's
final_logits_bias) is the projection's bias, where CTranslate2's own Marian converter puts it. Everything attnkit's
Transformer can be configured to be maps; a model that is not attnkit's Transformer, or has variant layers, is
refused in one line.

`ctranslate2` is imported inside the functions that use it: attnkit works without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnkit import __version__
from attnkit.checkpoint import load_checkpoint, model_from
from attnkit.config import BOS_ID, EOS_ID, UNK_ID, family
from attnkit.data.moses_bpe import MAGIC as MOSES_BPE
from attnkit.data.tokenizer_kinds import Tokenizer, tokenizer_from_bytes
from attnkit.errors import AttnkitError, CheckpointError, ConfigError
from attnkit.formats.ct2_translator import FORMAT, META_FILE, VERSION, CT2Translator, check_export, require_ctranslate2
from attnkit.io import atomic_folder, ensure_new_output
from attnkit.models import Transformer
from attnkit.models.transformer import removed_parts
from attnkit.nn import FeedForward, MultiHeadAttention, SinusoidalPositions

QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")  # weights; default: float32 as trained
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}  # gelu: F.gelu (erf) is CTranslate2's GELU
_MAPPED_VARIANTS = {"ConcatHeadsAttention"}  # attention without W^O (`model.variant: no-wo`, kyubyong)
_LANGUAGE_MODELS = {  # what each language-model kind is, for the refusal (`_not_exportable`)
    "transformer-xl": "a Transformer-XL language model: its relative attention over a memory of earlier segments "
                      "has no CTranslate2 equivalent",
    "vanilla-lm": "a vanilla Transformer language model (decoder only)",
    "recurrent-vanilla-lm": "a recurrent vanilla Transformer language model (decoder only, with memory)",
    "lstm-lm": "an LSTM language model",
}


# --- the model as a TransformerSpec ------------------------------------------------------------------------------
def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _set_linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _set_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_attention(spec, attn: MultiHeadAttention, norm: nn.LayerNorm, *, cross: bool) -> None:
    """attnkit's (3D, D) in_proj holds the q, k, v rows in that order, as CTranslate2's fused map does."""
    w, b, d = attn.in_proj.weight, attn.in_proj.bias, attn.d_model
    if cross:  # queries from the decoder, keys and values from the source
        _set_linear(spec.linear[0], w[:d], None if b is None else b[:d])
        _set_linear(spec.linear[1], w[d:], None if b is None else b[d:])
    else:
        _set_linear(spec.linear[0], w, b)
    out = getattr(attn, "out_proj", None)  # None: no W^O (ConcatHeadsAttention), which is the identity map
    _set_linear(spec.linear[-1], torch.eye(d) if out is None else out.weight, None if out is None else out.bias)
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec, ffn: FeedForward, norm: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, ffn.w1.weight, ffn.w1.bias)
    _set_linear(spec.linear_1, ffn.w2.weight, ffn.w2.bias)
    _set_norm(spec.layer_norm, norm)


def _set_inputs(spec, embeddings, model: Transformer, table: np.ndarray) -> None:
    embeddings.weight = table
    spec.scale_embeddings = float(model.embed_scale)  # sqrt(d_model), written out rather than implied
    spec.position_encodings.encodings = _array(model.positions.table)  # (P, D): row p is position p


def _check_exportable(model: nn.Module) -> float:
    """The model's one LayerNorm epsilon; what CTranslate2 cannot express raises a one-line error naming it."""
    if not isinstance(model, Transformer):
        raise ConfigError(f"only attnkit's encoder-decoder Transformer exports to CTranslate2, not a "
                          f"{type(model).__name__}")
    if removed_parts(model.config):
        raise ConfigError(f"{', '.join(removed_parts(model.config))}: CTranslate2's Transformer layers have every "
                          "part of the paper's")
    if model.config.activation not in _ACTIVATIONS:
        raise ConfigError(f"model.activation={model.config.activation!r} has no CTranslate2 equivalent "
                          f"(it has {', '.join(_ACTIVATIONS)})")
    variants = sorted({type(m).__name__ for m in model.modules()
                       if isinstance(m, MultiHeadAttention | SinusoidalPositions | FeedForward)
                       and type(m) not in (MultiHeadAttention, SinusoidalPositions, FeedForward)} - _MAPPED_VARIANTS)
    if variants:
        raise ConfigError(f"the model uses {', '.join(variants)}, a variant of attnkit's layers that CTranslate2's "
                          "Transformer cannot express")
    eps = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    if len(eps) != 1:
        raise ConfigError(f"CTranslate2 takes one LayerNorm epsilon; this model's LayerNorms use {sorted(eps)}")
    return eps.pop()


def _check_vocabulary(vocab: list[str], size: int, side: str) -> None:
    if len(vocab) != size:
        raise ConfigError(f"the {side} vocabulary has {len(vocab)} pieces, the model's {side} embedding {size} rows")
    if len(set(vocab)) != len(vocab):
        raise ConfigError(f"the {side} vocabulary repeats pieces: CTranslate2 maps pieces to ids by their text")


def transformer_spec(model: Transformer, src_vocab: list[str], tgt_vocab: list[str]):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights and the vocabularies (piece strings by id:
    PAD 0, BOS 1, EOS 2, UNK 3). Alignments come from the last decoder layer, its heads averaged, as attnkit's."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs.transformer_spec import TransformerSpec

    eps = _check_exportable(model)
    c = model.config
    _check_vocabulary(src_vocab, c.src_vocab_size, "source")
    _check_vocabulary(tgt_vocab, c.tgt_vocab_size, "target")
    spec = TransformerSpec.from_config((c.n_encoder_layers, c.n_decoder_layers), c.n_heads, pre_norm=c.norm_first,
                                       activation=common_spec.Activation[_ACTIVATIONS[c.activation]],
                                       alignment_layer=-1, alignment_heads=0)  # 0: every head, averaged
    cfg = spec.config
    cfg.layer_norm_epsilon = eps
    cfg.unk_token, cfg.bos_token, cfg.eos_token = tgt_vocab[UNK_ID], tgt_vocab[BOS_ID], tgt_vocab[EOS_ID]
    cfg.decoder_start_token = tgt_vocab[BOS_ID]
    cfg.add_source_eos = False  # sources come with their EOS, so that alignments may point at it as attnkit's do
    src_table = _array(model.src_embed.weight)
    tgt_table = src_table if model.own_tgt_embed is None else _array(model.tgt_embed.weight)
    enc, dec = spec.encoder, spec.decoder
    _set_inputs(enc, enc.embeddings[0], model, src_table)
    _set_inputs(dec, dec.embeddings, model, tgt_table)
    for layer_spec, layer in zip(enc.layer, model.encoder):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.attn_block.norm, cross=False)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    for layer_spec, layer in zip(dec.layer, model.decoder):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_block.norm, cross=False)
        _set_attention(layer_spec.attention, layer.cross_attn, layer.cross_block.norm, cross=True)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    if c.norm_first:  # pre-LN stacks end with a LayerNorm
        _set_norm(enc.layer_norm, model.encoder_norm)
        _set_norm(dec.layer_norm, model.decoder_norm)
    dec.projection.weight = tgt_table if model.out_proj is None else _array(model.out_proj.weight)
    if model.out_bias is not None:  # as CTranslate2's Marian converter stores final_logits_bias
        dec.projection.bias = _array(model.out_bias)
    spec.register_source_vocabulary(list(src_vocab))
    spec.register_target_vocabulary(list(tgt_vocab))
    return spec


# --- writing an export --------------------------------------------------------------------------------------------
def _check_replaceable(out: Path, force: bool) -> None:
    """An existing folder is replaced only with `force`, and only if it is empty or an export itself."""
    ensure_new_output(out, force, "output folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "model.bin").exists())):
        raise AttnkitError(f"'{out}' is not a CTranslate2 model folder, so --force will not replace it; "
                           "choose another --out")


def save_ctranslate2(model: Transformer, src_vocab: list[str], tgt_vocab: list[str], out_dir: str | os.PathLike,
                     quantization: str | None = None, *, files: dict[str, bytes] | None = None,
                     force: bool = False) -> Path:
    """Write `model` as a CTranslate2 model folder (atomically: a temp folder renamed into place), with `files`
    (name -> bytes) beside it. `quantization`: one of QUANTIZATIONS for the weights, None keeps float32."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)} "
                          "(or none for float32)")
    out = Path(out_dir)
    _check_replaceable(out, force)
    spec = transformer_spec(model, src_vocab, tgt_vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    with atomic_folder(out) as tmp:
        spec.save(str(tmp))
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
    return out


def _vocabulary(tok: Tokenizer, size: int) -> list[str]:
    """The piece of every id; rows of an embedding larger than the tokenizer get placeholder names."""
    if size < tok.vocab_size:
        raise CheckpointError(f"the model has {size} embedding rows for a tokenizer of {tok.vocab_size} pieces")
    return tok.pieces(list(range(tok.vocab_size))) + [f"<attnkit_unused_{i}>" for i in range(tok.vocab_size, size)]


def _not_exportable(kind: str) -> str | None:
    """What a checkpoint of `kind` holds when it is not an encoder-decoder Transformer (None when it is one), decided
    by its family, so that every language model and RNN kind is named as what it is, not as a checkpoint lacking a
    translation tokenizer (tests/test_export_ctranslate2.py)."""
    if kind == "transformer":
        return None
    if family(kind).task == "lm":
        return _LANGUAGE_MODELS.get(kind, f"a '{kind}' language model")
    return f"an RNN encoder-decoder ('{kind}'): CTranslate2 runs Transformers, and an RNN is not one"


def export_checkpoint(checkpoint_path: str | os.PathLike, out_dir: str | os.PathLike,
                      quantization: str | None = None, *, force: bool = False) -> Path:
    """Export an attnkit Transformer checkpoint to a CTranslate2 folder with its tokenizer(s) and `attnkit.json`."""
    ckpt = load_checkpoint(checkpoint_path)
    why = _not_exportable(ckpt.kind)
    if why:
        raise CheckpointError(f"{checkpoint_path} holds {why}; CTranslate2 export takes an encoder-decoder "
                              "Transformer translation model")
    if "src" not in ckpt.tokenizers:
        raise CheckpointError(f"{checkpoint_path} holds no tokenizer, and an export needs it")
    model = model_from(ckpt, checkpoint_path).eval()
    joint = "tgt" not in ckpt.tokenizers
    blobs = {side: ckpt.tokenizers["src" if joint else side] for side in ("src", "tgt")}
    suffix = ".moses-bpe" if blobs["src"].startswith(MOSES_BPE) else ".model"  # else a sentencepiece model
    names = {side: ("tokenizer" if joint else {"src": "source", "tgt": "target"}[side]) + suffix for side in blobs}
    toks = {side: tokenizer_from_bytes(blob) for side, blob in blobs.items()}
    c, t = ckpt.config.model, ckpt.config.train
    meta = {"format": FORMAT, "version": VERSION, "attnkit": __version__, "checkpoint": str(checkpoint_path),
            "kind": ckpt.kind, "quantization": quantization or "float32", "tokenizers": names,
            "max_positions": c.max_positions, "decoder_layers": c.n_decoder_layers,
            "decode": {"max_len_a": t.max_len_a, "max_len_b": t.max_len_b}}
    files = {names[side]: blobs[side] for side in names}
    files[META_FILE] = (json.dumps(meta, indent=2) + "\n").encode()
    return save_ctranslate2(model, _vocabulary(toks["src"], c.src_vocab_size),
                            _vocabulary(toks["tgt"], c.tgt_vocab_size), out_dir, quantization, files=files,
                            force=force)


__all__ = ["FORMAT", "META_FILE", "QUANTIZATIONS", "VERSION", "CT2Translator", "check_export", "export_checkpoint",
           "require_ctranslate2", "save_ctranslate2", "transformer_spec"]
