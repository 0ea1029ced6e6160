"""Marian (opus-mt) models as Hugging Face stores them (`MarianMTModel`): imported as attnkit checkpoints, and
attnkit Transformers exported as such folders. docs/import.md has the whole mapping table. This module holds the
import and the export; the layers' names are `layer_names`' (fairseq's, which HF's Marian took), reading the
folder's files is `marian_folder`'s, the vocabularies and the sentencepiece models in attnkit's ids (`Side`,
`side_tokenizer`) are `marian_vocab`'s.

V vocabulary, D model dim, F FFN dim, P positions.

A Marian model is attnkit's post-LN Transformer: the same sublayers in every layer, embeddings scaled by sqrt(D)
(`scale_embedding`), LayerNorms of epsilon 1e-5 and no final one, queries scaled by 1/sqrt(head dim); its FFN may
use swish (SiLU) and its logits have a bias (`final_logits_bias`, attnkit's `output_bias`). q, k and v are three
maps where attnkit packs them as the [q; k; v] rows of one `in_proj`. Three layouts differ, each with an exact map:

- Positions. Marian's sinusoid puts the sines in channels [0, D/2) and the cosines in [D/2, D), attnkit's
  interleaves them (sin at 2i, cos at 2i + 1), at the same frequencies. So attnkit's channel j of the residual
  stream is Marian's channel `stream_order(D)[j]`, and every tensor touching the stream takes that order: embedding
  columns, the input columns of every map reading the stream (q, k, v, FFN w1, the output projection: READS), the
  output rows and biases of every map writing it (attention out_proj, FFN w2: WRITES), LayerNorm weights and biases
  (WRITES). LayerNorm statistics and dot products over the stream do not depend on the order of its channels, so
  the permuted network computes the same function: the logits test proves it against `transformers`.
- Ids. attnkit's are fixed (PAD 0, BOS 1, EOS 2, UNK 3); Marian's come from vocab.json (</s> 0, <unk> 1, <pad>
  last), and its decoder starts from <pad>. Import puts the rows in attnkit's order (`Side`): PAD is Marian's pad,
  BOS a copy of the decoder-start row (the embedding decoding starts from), EOS and UNK Marian's, then Marian's
  other ids in order, then one row for each piece a sentencepiece model produces that vocab.json lacks (Marian reads
  it as <unk>: a copy of unk's row). BOS (where it copies pad) and those rows get NEVER added to their logit, so the
  softmax over attnkit's vocabulary is Marian's, and a score is Marian's log-probability.
- Tokenizers. Marian maps the pieces source.spm / target.spm produce to ids through vocab.json. Import writes, per
  side, a sentencepiece model whose ids are the model's (`side_tokenizer`): every piece in attnkit's id order, those
  the side's spm produces with their type and score, the others UNUSED (sentencepiece never produces those, so the
  segmentation stays the original's), the spm's normaliser kept.

Export keeps attnkit's ids (pad 0, decoder start 1 = BOS, eos 2, unk 3) and applies the inverse channel order, so
an attnkit-trained model leaves without fields Marian lacks. Attention without W^O (`model.variant: no-wo`) leaves
with an identity W^O. `transformers` is never imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save as st_save

from attnkit.checkpoint import Checkpoint, load_checkpoint
from attnkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, RunConfig, TrainConfig, TransformerConfig, family
from attnkit.data.moses_bpe import MAGIC as MOSES_BPE
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, DataError
from attnkit.formats.layer_names import layer_table, model_shapes, reorder
from attnkit.formats.marian_bergamot import import_marian_native, is_marian_native
from attnkit.formats.marian_folder import (
    MarianConfig,
    Weights,
    read_config,
    read_tokenizer_config,
    read_weights,
    resolve_source,
)
from attnkit.formats.marian_vocab import NEVER, Side, read_sides, read_spm, side_tokenizer
from attnkit.io import atomic_folder, ensure_new_output
from attnkit.models.transformer import removed_parts
from attnkit.nn.positions import halves_order as stream_order  # attnkit's channel j is Marian's order[j]
from attnkit.nn.positions import sinusoid_table

LAYER_NORM_EPS = 1e-5  # torch's default, which every LayerNorm of HF's Marian uses
# Marian's decoding length limit is 3 x the source (marian's --max-length-factor); attnkit's a * |src| + b
MAX_LEN_A, MAX_LEN_B = 3.0, 10
# --- import ---------------------------------------------------------------------------------------------------------
def _check_positions(w: Weights, m: MarianConfig, order: torch.Tensor) -> None:
    """Marian's positions are computed, not learned; a stored table that is not that sinusoid is refused."""
    marian = sinusoid_table(m.max_positions, m.d_model)[:, torch.argsort(order)]  # attnkit's table, Marian's layout
    for side in ("encoder", "decoder"):
        name = f"{side}.embed_positions.weight"
        if w.has(name) and (w.get(name, tuple(marian.shape)) - marian).abs().max() > 1e-3:
            raise CheckpointError(f"{w.path}: tensor '{w.prefix}{name}' is not Marian's sinusoid (sines, then "
                                  "cosines); attnkit computes its positions")


def _model_config(m: MarianConfig, sides: dict[str, Side], share: bool) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=len(sides["src"].ids), tgt_vocab_size=len(sides["tgt"].ids), d_model=m.d_model,
        n_heads=m.n_heads, d_ff=m.d_ff, n_encoder_layers=m.n_encoder_layers, n_decoder_layers=m.n_decoder_layers,
        dropout=m.dropout, attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
        activation=m.activation, norm_first=False, share_embeddings=share,
        tie_output=m.tie and m.scale_embedding, output_bias=True, max_positions=m.max_positions)


def _embeddings(w: Weights, m: MarianConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's and the decoder's tables, (V, D) in Marian's ids and channels, as MarianMTModel loads them: a
    shared table is saved once (`shared.weight`, or under either side's name), and a model whose word embeddings are
    not tied keeps one table per side even where the vocabulary is shared."""
    src_rows, tgt_rows = (m.vocab_size, m.d_model), (m.decoder_vocab_size, m.d_model)
    names = {side: f"{side}.embed_tokens.weight" for side in ("encoder", "decoder")}
    if m.share and m.tie:
        table = w.first(["shared.weight", names["encoder"], names["decoder"]], src_rows)
        return table, table
    shared = ["shared.weight"] if m.share else []
    return w.first([names["encoder"], *shared], src_rows), w.first([names["decoder"], *shared], tgt_rows)


def _vocabulary_tensors(w: Weights, m: MarianConfig, sides: dict[str, Side], order: torch.Tensor,
                        tables: tuple[torch.Tensor, torch.Tensor], share: bool) -> dict[str, torch.Tensor]:
    """Embeddings, output projection and bias in attnkit's rows and channels. Without `scale_embedding` Marian adds
    the embeddings unscaled: attnkit's tables are divided by sqrt(D), and the output keeps the unscaled table."""
    src, tgt = tables
    scale = 1.0 if m.scale_embedding else 1 / math.sqrt(m.d_model)
    out = {"src_embed.weight": sides["src"].table(src, order) * scale}
    if not share:
        out["own_tgt_embed.weight"] = sides["tgt"].table(tgt, order) * scale
    if not (m.tie and m.scale_embedding):
        output = tgt if m.tie else w.get("lm_head.weight", (m.decoder_vocab_size, m.d_model), top=True)
        out["out_proj.weight"] = sides["tgt"].table(output, order)
    bias = w.get("final_logits_bias", (1, m.decoder_vocab_size), top=True)[0] if w.has("final_logits_bias", True) \
        else torch.zeros(m.decoder_vocab_size)  # as MarianMTModel loads a file without it
    out["out_bias"] = bias[sides["tgt"].ids]
    out["out_bias"][sides["tgt"].never] += NEVER
    return out


def import_marian(source: str | os.PathLike, *, src_lang: str | None = None, tgt_lang: str | None = None
                  ) -> Checkpoint:
    """An attnkit checkpoint (kind transformer, tokenizers inside) of a MarianMTModel folder: config.json, the weights
    (model.safetensors; pytorch_model.bin only when trusted), source.spm, target.spm, vocab.json (target_vocab.json
    with separate vocabularies) and tokenizer_config.json where there is one. `source` may name a model in the Hugging
    Face cache where huggingface_hub is installed; nothing is downloaded. The languages are recorded as given, else
    as tokenizer_config.json names them. A Marian model folder or file of Marian's own (model.*.bin or .npz with
    model.yml inside, vocab.*.spm; the Bergamot models) goes to `marian_bergamot.import_marian_native`."""
    if is_marian_native(source):
        return import_marian_native(source, src_lang=src_lang, tgt_lang=tgt_lang)
    folder = resolve_source(source)
    m = read_config(folder)
    tok = read_tokenizer_config(folder)
    spms = {"src": read_spm(folder / "source.spm"), "tgt": read_spm(folder / "target.spm")}
    sides = read_sides(folder, m, tok, spms)
    w = read_weights(folder)
    order = stream_order(m.d_model)
    _check_positions(w, m, order)
    tables = _embeddings(w, m)
    share = m.share and torch.equal(*tables)  # one attnkit table where Marian's two are one
    config = _model_config(m, sides, share)
    shapes = model_shapes(config)
    state = {}
    for name, marian_names, how in layer_table(m.n_encoder_layers, m.n_decoder_layers):
        part = (shapes[name][0] // len(marian_names), *shapes[name][1:])
        state[name] = reorder(torch.cat([w.get(n, part) for n in marian_names]), how, order)
    state.update(_vocabulary_tensors(w, m, sides, order, tables, share))
    if not state["out_bias"].any():  # nothing to add (attnkit's own exports): the model without the bias, exactly
        del state["out_bias"]
        config = dataclasses.replace(config, output_bias=False)
        shapes = model_shapes(config)
    if {k: tuple(v.shape) for k, v in state.items()} != shapes:  # the table covers attnkit's model, all of it
        raise AttnkitError(f"import of {folder}: the weights mapped do not make attnkit's model (a bug in attnkit)")
    tokenizers = {side: side_tokenizer(spms[side], sides[side].names) for side in ("src", "tgt")}
    for side, blob in tokenizers.items():
        try:
            SubwordTokenizer.from_bytes(blob)
        except DataError as e:
            raise CheckpointError(f"{folder / ('source.spm' if side == 'src' else 'target.spm')}: {e}") from None
    if tokenizers["src"] == tokenizers["tgt"]:  # one tokenizer for both sides, as attnkit's joint vocabularies
        del tokenizers["tgt"]
    languages = {"src": src_lang or tok.get("source_lang"), "tgt": tgt_lang or tok.get("target_lang")}
    return Checkpoint(kind="transformer", config=RunConfig(model=config, train=TrainConfig(
        max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B)), model_state=state, tokenizers=tokenizers,
        languages={k: str(v) for k, v in languages.items() if v})


# --- export -----------------------------------------------------------------------------------------------------------
def _refusal(ckpt: Checkpoint) -> str | None:
    """Why MarianMTModel cannot express a checkpoint's model (None: it can)."""
    if ckpt.kind == "transformer-xl":
        return "a Transformer-XL language model: Marian has no relative attention over a memory"
    if family(ckpt.kind).task == "lm":
        return f"a '{ckpt.kind}' language model (decoder only), not an encoder-decoder translation model"
    if ckpt.kind != "transformer":
        return f"an RNN encoder-decoder ('{ckpt.kind}'): MarianMTModel is a Transformer"
    c = ckpt.config.model
    reasons = [
        (removed_parts(c), f"{', '.join(removed_parts(c))}: MarianMTModel's layers have every part of the paper's"),
        (c.norm_first, "a pre-LN Transformer (model.norm_first): MarianMTModel's layers are post-LN"),
        (c.positions != "sinusoidal", f"model.positions: {c.positions}: MarianMTModel's positions are sinusoids"),
        (c.variant == "kyubyong", f"Kyubyong Park's Transformer (model.variant: kyubyong): LayerNorms of epsilon "
                                  f"1e-08 and dropout on the embeddings only, where MarianMTModel's LayerNorms are "
                                  f"{LAYER_NORM_EPS:g} and it drops out every sublayer"),
        (c.norm_eps != LAYER_NORM_EPS, f"LayerNorms of epsilon {c.norm_eps:g} (model.norm_eps), where "
                                       f"MarianMTModel's are {LAYER_NORM_EPS:g}"),
        (c.activation not in ("relu", "gelu", "swish"), f"the {c.activation} activation"),
        (c.d_model % 2 == 1, f"an odd d_model ({c.d_model}): Marian's sinusoid pairs its channels"),
        ("src" not in ckpt.tokenizers, "no tokenizer"),
        (any(blob.startswith(MOSES_BPE) for blob in ckpt.tokenizers.values()),
         "a Moses + BPE tokenizer (fairseq's pipeline): MarianMTModel reads sentencepiece models"),
    ]
    return next((why for bad, why in reasons if bad), None)


def _pieces(blob: bytes, rows: int, where: str) -> list[str]:
    tok = SubwordTokenizer.from_bytes(blob)
    if tok.vocab_size > rows:
        raise CheckpointError(f"{where}: its tokenizer has {tok.vocab_size} pieces for {rows} embedding rows")
    return tok.pieces(list(range(tok.vocab_size))) + [f"<attnkit_unused_{i}>" for i in range(tok.vocab_size, rows)]


def _with_identity_wo(c: TransformerConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Attention without W^O (`model.variant: no-wo`, the heads' concatenation is the output) is attention whose W^O
    is the identity (D, D) with a zero bias: the form MarianMTModel holds."""
    if c.variant != "no-wo":
        return state
    missing = {name for name, _, _ in layer_table(c.n_encoder_layers, c.n_decoder_layers)} - state.keys()
    return {**state, **{name: torch.eye(c.d_model) if name.endswith(".weight") else torch.zeros(c.d_model)
                        for name in missing if ".out_proj." in name}}


def _marian_state(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    c, state = ckpt.config.model, _with_identity_wo(ckpt.config.model, ckpt.model_state)
    inverse = torch.argsort(stream_order(c.d_model))
    out = {}
    for name, marian_names, how in layer_table(c.n_encoder_layers, c.n_decoder_layers):
        parts = reorder(state[name].float(), how, inverse).chunk(len(marian_names))
        out.update({f"model.{n}": p.contiguous() for n, p in zip(marian_names, parts)})
    src = state["src_embed.weight"].float()[:, inverse]
    if c.share_embeddings:
        out["model.shared.weight"] = src.contiguous()
    else:
        out["model.encoder.embed_tokens.weight"] = src.contiguous()
        out["model.decoder.embed_tokens.weight"] = state["own_tgt_embed.weight"].float()[:, inverse].contiguous()
    if not c.tie_output:
        out["lm_head.weight"] = state["out_proj.weight"].float()[:, inverse].contiguous()
    bias = state["out_bias"].float() if getattr(c, "output_bias", False) else torch.zeros(c.tgt_vocab_size)
    out["final_logits_bias"] = bias[None].contiguous()  # (1, V)
    return out


def _marian_config(c: TransformerConfig) -> dict:
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.tgt_vocab_size, "d_model": c.d_model, "encoder_layers": c.n_encoder_layers,
        "decoder_layers": c.n_decoder_layers, "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads, "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
        "activation_function": c.activation, "max_position_embeddings": c.max_positions, "scale_embedding": True,
        "share_encoder_decoder_embeddings": c.share_embeddings, "tie_word_embeddings": c.tie_output,
        "dropout": c.dropout, "attention_dropout": c.attention_dropout, "activation_dropout": c.activation_dropout,
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID, "is_encoder_decoder": True, "dtype": "float32",
    }


def _generation_config(c: TransformerConfig) -> dict:
    """generate() as attnkit decodes: from BOS, PAD and BOS never produced, within the positions."""
    return {"decoder_start_token_id": BOS_ID, "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID, "bad_words_ids": [[PAD_ID], [BOS_ID]], "max_length": c.max_positions}


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()


def marian_files(ckpt: Checkpoint, where: str) -> dict[str, bytes]:
    """File name -> bytes of the MarianMTModel folder of an exportable checkpoint."""
    c = ckpt.config.model
    blobs = {"src": ckpt.tokenizers["src"], "tgt": ckpt.tokenizers.get("tgt", ckpt.tokenizers["src"])}
    src, tgt = _pieces(blobs["src"], c.src_vocab_size, where), _pieces(blobs["tgt"], c.tgt_vocab_size, where)
    separate = src != tgt  # one vocab.json where both sides' ids name the same pieces (two spms may still differ)
    files = {"config.json": _json(_marian_config(c)), "generation_config.json": _json(_generation_config(c)),
             "model.safetensors": st_save(_marian_state(ckpt), metadata={"format": "pt"}),
             "source.spm": blobs["src"], "target.spm": blobs["tgt"],
             "vocab.json": _json({p: i for i, p in enumerate(src)})}
    if separate:
        files["target_vocab.json"] = _json({p: i for i, p in enumerate(tgt)})
    files["tokenizer_config.json"] = _json({
        "tokenizer_class": "MarianTokenizer", "source_lang": ckpt.languages.get("src"),
        "target_lang": ckpt.languages.get("tgt"), "separate_vocabs": separate, "unk_token": src[UNK_ID],
        "eos_token": src[EOS_ID], "pad_token": src[PAD_ID], "model_max_length": c.max_positions})
    return files


def export_marian(checkpoint_path: str | os.PathLike, out_dir: str | os.PathLike, *, force: bool = False) -> Path:
    """Write an attnkit Transformer checkpoint as a `save_pretrained`-style MarianMTModel folder, which
    `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` read; what MarianMTModel cannot express is
    refused in one line. Written atomically: a temp folder renamed into place."""
    out = Path(out_dir)
    ensure_new_output(out, force, "output folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "config.json").is_file())):
        raise AttnkitError(f"'{out}' is not a model folder, so --force will not replace it; choose another --out")
    ckpt = load_checkpoint(checkpoint_path)
    why = _refusal(ckpt)
    if why:
        raise ConfigError(f"{checkpoint_path} holds {why}; MarianMTModel cannot express it")
    files = marian_files(ckpt, str(checkpoint_path))
    with atomic_folder(out) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return out


__all__ = ["NEVER", "MarianConfig", "Side", "export_marian", "import_marian", "layer_table", "stream_order"]
