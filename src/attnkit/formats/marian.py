"""Marian (opus-mt) models as Hugging Face stores them (`MarianMTModel`): imported as attnkit checkpoints, and
attnkit Transformers exported as such folders. docs/import.md has the whole mapping table.

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
an attnkit-trained model leaves without fields Marian lacks. `transformers` is never imported.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sentencepiece import sentencepiece_model_pb2 as spm_pb2

from attnkit.checkpoint import Checkpoint, load_checkpoint
from attnkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, RunConfig, TrainConfig, TransformerConfig, family
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, DataError
from attnkit.io import atomic_folder, ensure_new_output, trust_pickle
from attnkit.models import Transformer
from attnkit.nn.positions import sinusoid_table

# Added to a logit that must take no probability: exp(-1e4) is 0 in float32, and the logit stays a finite number.
NEVER = -1e4
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # HF's gelu is erf's, as F.gelu
LAYER_NORM_EPS = 1e-5  # torch's default, which every LayerNorm of HF's Marian uses
# How a tensor meets the residual stream's channel order: its columns read the stream, its rows (or entries) write
# it, or neither (q, k, v and FFN w1 biases live in head or FFN space).
READS, WRITES, AS_IS = "reads", "writes", "as is"
_PIECE = spm_pb2.ModelProto.SentencePiece
PRODUCED = (_PIECE.NORMAL, _PIECE.USER_DEFINED, _PIECE.BYTE)  # the piece types sentencepiece's encoder emits
# Marian's decoding length limit is 3 x the source (marian's --max-length-factor); attnkit's a * |src| + b
MAX_LEN_A, MAX_LEN_B = 3.0, 10


# --- the one name-mapping table -----------------------------------------------------------------------------------
def stream_order(d_model: int) -> torch.Tensor:
    """(D,) attnkit's channel j of the residual stream is Marian's channel order[j]: sin_i sits at 2i in attnkit,
    at i in Marian; cos_i at 2i + 1 and D/2 + i."""
    half = torch.arange(d_model // 2)
    return torch.stack([half, half + d_model // 2], dim=1).flatten()  # (D/2, 2) -> (D,)


def _attention(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.in_proj.weight", tuple(f"{h}.{p}_proj.weight" for p in "qkv"), READS),
            (f"{a}.in_proj.bias", tuple(f"{h}.{p}_proj.bias" for p in "qkv"), AS_IS),
            (f"{a}.out_proj.weight", (f"{h}.out_proj.weight",), WRITES),
            (f"{a}.out_proj.bias", (f"{h}.out_proj.bias",), WRITES)]


def _norm(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.weight", (f"{h}.weight",), WRITES), (f"{a}.bias", (f"{h}.bias",), WRITES)]


def _ffn(a: str, h: str) -> list[tuple[str, tuple[str, ...], str]]:
    return [(f"{a}.w1.weight", (f"{h}.fc1.weight",), READS), (f"{a}.w1.bias", (f"{h}.fc1.bias",), AS_IS),
            (f"{a}.w2.weight", (f"{h}.fc2.weight",), WRITES), (f"{a}.w2.bias", (f"{h}.fc2.bias",), WRITES)]


def layer_table(n_encoder: int, n_decoder: int) -> list[tuple[str, tuple[str, ...], str]]:
    """(attnkit name, Marian names without the `model.` prefix, how the stream order applies) for every tensor of
    the layers; several Marian names are concatenated along dim 0 (q, k, v -> in_proj). Import and export both read
    it; the vocabulary tensors (embeddings, output projection and bias) reorder rows too and are mapped apart."""
    rows = []
    for i in range(n_encoder):
        a, h = f"encoder.{i}", f"encoder.layers.{i}"
        rows += _attention(f"{a}.self_attn", f"{h}.self_attn")
        rows += _norm(f"{a}.attn_block.norm", f"{h}.self_attn_layer_norm")
        rows += _ffn(f"{a}.ffn", h) + _norm(f"{a}.ffn_block.norm", f"{h}.final_layer_norm")
    for i in range(n_decoder):
        a, h = f"decoder.{i}", f"decoder.layers.{i}"
        rows += _attention(f"{a}.self_attn", f"{h}.self_attn")
        rows += _norm(f"{a}.self_block.norm", f"{h}.self_attn_layer_norm")
        rows += _attention(f"{a}.cross_attn", f"{h}.encoder_attn")
        rows += _norm(f"{a}.cross_block.norm", f"{h}.encoder_attn_layer_norm")
        rows += _ffn(f"{a}.ffn", h) + _norm(f"{a}.ffn_block.norm", f"{h}.final_layer_norm")
    return rows


def reorder(t: torch.Tensor, how: str, order: torch.Tensor) -> torch.Tensor:
    """A tensor in the other side's channel order: READS permutes its columns, WRITES its rows (or entries)."""
    if how == READS:
        return t[:, order]
    return t[order] if how == WRITES else t


# --- reading a Marian folder ------------------------------------------------------------------------------------
def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, not {type(data).__name__}")
    return data


_REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _field(cfg: dict, name: str, path: Path, tp: type, default: Any = _REQUIRED) -> Any:
    """config[name] of type `tp`, or `default` where it is absent (or null); one line naming the file and field."""
    value = cfg.get(name)
    if value is None:
        if default is _REQUIRED:
            raise CheckpointError(f"{path}: no field '{name}' (a MarianMTModel's config.json has it)")
        return default
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise CheckpointError(f"{path}: field '{name}' is {value!r}, not {_KINDS[tp]}")
    if tp is int and value < 0:
        raise CheckpointError(f"{path}: field '{name}' is {value}, not a count or id")
    return value


@dataclass(frozen=True)
class MarianConfig:
    """What attnkit reads of a MarianMTModel's config.json."""

    d_model: int
    n_heads: int
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    vocab_size: int  # rows of the encoder's (or the shared) embedding
    decoder_vocab_size: int
    max_positions: int
    activation: str  # attnkit's name
    scale_embedding: bool
    share: bool  # share_encoder_decoder_embeddings
    tie: bool  # tie_word_embeddings: the output projection is the decoder's embedding
    pad: int
    eos: int
    start: int  # decoder_start_token_id
    dropout: float
    attention_dropout: float
    activation_dropout: float


def _same(cfg: dict, path: Path, encoder: str, decoder: str, what: str) -> int:
    a, b = _field(cfg, encoder, path, int), _field(cfg, decoder, path, int)
    if a != b:
        raise CheckpointError(f"{path}: {encoder} {a} and {decoder} {b} differ; attnkit's Transformer has one {what}")
    return a


def read_config(folder: Path) -> MarianConfig:
    path = folder / "config.json"
    cfg = _read_json(path, "the model's config")
    if cfg.get("model_type", "marian") != "marian":
        raise CheckpointError(f"{path}: field 'model_type' is {cfg['model_type']!r}, not 'marian'")
    d, heads = _field(cfg, "d_model", path, int), _same(cfg, path, "encoder_attention_heads",
                                                         "decoder_attention_heads", "number of heads")
    if d < 2 or d % 2 or heads < 1 or d % heads:
        raise CheckpointError(f"{path}: field 'd_model' {d} does not split into {heads} heads of an even size")
    act = _field(cfg, "activation_function", path, str, "gelu")  # MarianConfig's default
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{path}: field 'activation_function' is {act!r}; attnkit has "
                              f"{', '.join(ACTIVATIONS)}")
    share = _field(cfg, "share_encoder_decoder_embeddings", path, bool, True)
    vocab = _field(cfg, "vocab_size", path, int)
    pad = _field(cfg, "pad_token_id", path, int)
    eos = cfg.get("eos_token_id", 0)
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise CheckpointError(f"{path}: field 'eos_token_id' is {eos!r}, not one id")
    return MarianConfig(
        d_model=d, n_heads=heads, d_ff=_same(cfg, path, "encoder_ffn_dim", "decoder_ffn_dim", "FFN size"),
        n_encoder_layers=_field(cfg, "encoder_layers", path, int),
        n_decoder_layers=_field(cfg, "decoder_layers", path, int),
        vocab_size=vocab, decoder_vocab_size=vocab if share else _field(cfg, "decoder_vocab_size", path, int, vocab),
        max_positions=_field(cfg, "max_position_embeddings", path, int, 1024), activation=ACTIVATIONS[act],
        scale_embedding=_field(cfg, "scale_embedding", path, bool, False), share=share,
        tie=_field(cfg, "tie_word_embeddings", path, bool, True), pad=pad, eos=eos,
        start=_field(cfg, "decoder_start_token_id", path, int, pad),
        dropout=_field(cfg, "dropout", path, float, 0.1), attention_dropout=_field(cfg, "attention_dropout", path,
                                                                                   float, 0.0),
        activation_dropout=_field(cfg, "activation_dropout", path, float, 0.0))


def _token_name(value: Any, default: str) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else default


@dataclass(frozen=True)
class Vocab:
    """One vocab.json: piece -> Marian id."""

    pieces: dict[str, int]
    path: Path

    @classmethod
    def read(cls, path: Path, rows: int) -> Vocab:
        data = _read_json(path, "the vocabulary: piece -> id")
        seen: dict[int, str] = {}
        for piece, i in data.items():
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < rows:
                raise CheckpointError(f"{path}: the id of {piece!r} is {i!r}, not one of the embedding's {rows} rows "
                                      "(config.json vocab_size)")
            if i in seen:
                raise CheckpointError(f"{path}: {seen[i]!r} and {piece!r} both have id {i}")
            seen[i] = piece
        return cls(data, path)

    def id_of(self, token: str, field: str, expected: int | None = None) -> int:
        if token not in self.pieces:
            raise CheckpointError(f"{self.path}: no {token!r} ({field}); a Marian vocabulary holds it")
        i = self.pieces[token]
        if expected is not None and i != expected:
            raise CheckpointError(f"{self.path}: {token!r} has id {i}, but config.json's {field} is {expected}")
        return i


@dataclass(frozen=True)
class Side:
    """One embedding table in attnkit's order: attnkit's row r is Marian's row `ids[r]` and piece `names[r]`;
    the rows in `never` get NEVER added to their logit (BOS, and the pieces vocab.json lacks)."""

    ids: list[int]
    names: list[str]
    never: list[int]

    @classmethod
    def of(cls, vocab: Vocab, rows: int, specials: dict[str, str], start: int, spms: Iterable) -> Side:
        pad = vocab.id_of(specials["pad"], "pad_token_id")
        eos = vocab.id_of(specials["eos"], "eos_token_id")
        unk = vocab.id_of(specials["unk"], "unk_token")
        if not 0 <= start < rows:
            raise CheckpointError(f"{vocab.path}: the decoder starts from id {start}, beyond the {rows} rows")
        by_id = {i: piece for piece, i in vocab.pieces.items()}
        ids = [pad, start, eos, unk, *(i for i in range(rows) if i not in (pad, start, eos, unk))]
        names = [by_id.get(i) or f"<marian_unused_{i}>" for i in ids]
        # Marian's own models start from pad: BOS is a copy of it, taking no probability. A model exported by
        # attnkit starts from a token of its own (BOS 1), which keeps its row: import then undoes export.
        never = [BOS_ID] if start == pad else []
        if start == pad:
            names[BOS_ID] = next(n for n in ("<s>", "<attnkit_bos>", "<attnkit_bos_>") if n not in vocab.pieces)
        extra = list(dict.fromkeys(p.piece for spm in spms for p in spm.pieces
                                   if p.type in PRODUCED and p.piece not in vocab.pieces))
        if len(set(names)) != len(names):
            raise CheckpointError(f"{vocab.path}: a piece is named like an id vocab.json leaves out "
                                  "(<marian_unused_N>)")
        return cls(ids + [unk] * len(extra), names + extra, never + list(range(len(ids), len(ids) + len(extra))))

    def table(self, marian: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """(V_marian, D) in Marian's ids and channels -> (V, D) in attnkit's."""
        return marian[self.ids][:, order]


def read_spm(path: Path):
    """A sentencepiece ModelProto, checked by loading it the way attnkit will."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (the sentencepiece model)")
    data = path.read_bytes()
    proto = spm_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
        SubwordTokenizer.from_bytes(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, sentencepiece's DataError
        raise CheckpointError(f"{path}: not a sentencepiece model ({' '.join(str(e).split())})") from None
    return proto


def side_tokenizer(spm, names: list[str]) -> bytes:
    """A sentencepiece model whose ids are attnkit's rows: `names` in order, those `spm` produces with their type and
    score, the others UNUSED (never produced), attnkit's four specials; the normaliser and training spec of `spm`.

    Unknown text decodes to nothing, as MarianTokenizer's decode(skip_special_tokens=True) drops <unk>."""
    known = {p.piece: p for p in spm.pieces if p.type in PRODUCED}
    out = spm_pb2.ModelProto()
    out.trainer_spec.CopyFrom(spm.trainer_spec)
    out.normalizer_spec.CopyFrom(spm.normalizer_spec)
    if spm.HasField("denormalizer_spec"):
        out.denormalizer_spec.CopyFrom(spm.denormalizer_spec)
    special = {PAD_ID: _PIECE.CONTROL, BOS_ID: _PIECE.CONTROL, EOS_ID: _PIECE.CONTROL, UNK_ID: _PIECE.UNKNOWN}
    for row, name in enumerate(names):
        piece = out.pieces.add()
        piece.piece = name
        if row in special:
            piece.type = special[row]
        elif name in known:
            piece.type, piece.score = known[name].type, known[name].score
        else:
            piece.type = _PIECE.UNUSED
    t = out.trainer_spec
    t.pad_id, t.bos_id, t.eos_id, t.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    t.pad_piece, t.bos_piece, t.eos_piece, t.unk_piece = (names[i] for i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID))
    t.vocab_size = len(names)
    t.unk_surface = ""
    return out.SerializeToString()


class Weights:
    """A MarianMTModel's tensors by name, each checked for presence and shape with a one-line error."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: Path):
        self.tensors, self.path = tensors, path
        # MarianMTModel's names start with `model.` (the bare MarianModel's do not); the output's never do
        self.prefix = "model." if any(k.startswith("model.") for k in tensors) else ""

    def has(self, name: str, top: bool = False) -> bool:
        return (name if top else self.prefix + name) in self.tensors

    def get(self, name: str, shape: tuple[int, ...], top: bool = False) -> torch.Tensor:
        key = name if top else self.prefix + name
        t = self.tensors.get(key)
        if t is None:
            raise CheckpointError(f"{self.path}: no tensor '{key}' (truncated, or not a MarianMTModel?)")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{self.path}: tensor '{key}' has shape {tuple(t.shape)}, config.json's "
                                  f"sizes make it {shape}")
        return t.float()

    def first(self, names: list[str], shape: tuple[int, ...]) -> torch.Tensor:
        """The first of several names a tied tensor may be saved under."""
        return self.get(next((n for n in names if self.has(n)), names[0]), shape)


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return st_load(path.read_bytes())
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def _pickled(path: Path) -> dict[str, torch.Tensor]:
    """pytorch_model.bin, a pickle: refused unless trusted (attnkit.checkpoint's rule), then read weights-only."""
    if not trust_pickle.get():
        raise CheckpointError(f"{path} is a pickle (torch.save) file, and loading one can run code hidden in it; "
                              "attnkit reads model.safetensors. Pass --trust-checkpoint only if you trust where this "
                              "file came from")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path}: not a readable torch.save file (truncated or corrupt?): "
                              f"{' '.join(str(e).split())[:300]}") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def read_weights(folder: Path) -> Weights:
    """model.safetensors, its shards (model.safetensors.index.json), or pytorch_model.bin (when trusted)."""
    single, index, pickled = (folder / n for n in ("model.safetensors", "model.safetensors.index.json",
                                                    "pytorch_model.bin"))
    if single.is_file():
        return Weights(_safetensors(single), single)
    if index.is_file():
        shards = _read_json(index, "the list of weight shards").get("weight_map")
        if not isinstance(shards, dict):
            raise CheckpointError(f"{index}: no field 'weight_map'")
        tensors: dict[str, torch.Tensor] = {}
        for shard in dict.fromkeys(shards.values()):
            if not (folder / str(shard)).is_file():
                raise CheckpointError(f"{index}: its shard {shard} is missing")
            tensors.update(_safetensors(folder / str(shard)))
        return Weights(tensors, index)
    if pickled.is_file():
        return Weights(_pickled(pickled), pickled)
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin (the weights)")


# --- import ---------------------------------------------------------------------------------------------------------
def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder (or a file in one); else a Hugging Face hub name, from huggingface_hub's cache only."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"no such folder: {source}") from None
    try:
        return Path(snapshot_download(repo_id=str(source), local_files_only=True))
    except Exception as e:  # noqa: BLE001 - huggingface_hub answers a name it cannot find offline in many ways
        raise CheckpointError(f"{source}: no such folder, nor a model in the Hugging Face cache ({type(e).__name__}); "
                              f"attnkit reads models offline: download it first (hf download {source} --local-dir "
                              "DIR) and import DIR") from None


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    return _read_json(path, "the tokenizer's settings") if path.exists() else {}


def _sides(folder: Path, m: MarianConfig, tok: dict, spms: dict) -> dict[str, Side]:
    """{"src", "tgt"} tables in attnkit's order; with shared embeddings one table, the pieces of both spms."""
    specials = {k: _token_name(tok.get(f"{k}_token"), d) for k, d in (("pad", "<pad>"), ("eos", "</s>"),
                                                                        ("unk", "<unk>"))}
    separate = tok.get("separate_vocabs", False) is True
    src_vocab = Vocab.read(folder / "vocab.json", m.vocab_size)
    tgt_vocab = Vocab.read(folder / "target_vocab.json", m.decoder_vocab_size) if separate else src_vocab
    src_vocab.id_of(specials["pad"], "pad_token_id", m.pad)
    tgt_vocab.id_of(specials["eos"], "eos_token_id", m.eos)
    if m.share:
        if tgt_vocab.pieces != src_vocab.pieces:
            raise CheckpointError(f"{folder / 'config.json'}: field 'share_encoder_decoder_embeddings' is true, but "
                                  "vocab.json and target_vocab.json differ")
        side = Side.of(src_vocab, m.vocab_size, specials, m.start, spms.values())
        return {"src": side, "tgt": side}
    # the encoder never reads BOS: its row copies the decoder's start where that id is the source's too
    src_start = m.start if m.start < m.vocab_size else m.pad
    return {"src": Side.of(src_vocab, m.vocab_size, specials, src_start, [spms["src"]]),
            "tgt": Side.of(tgt_vocab, m.decoder_vocab_size, specials, m.start, [spms["tgt"]])}


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
        tie_output=m.tie and m.scale_embedding, output_bias=True, max_positions=m.max_positions,
        layer_norm_eps=LAYER_NORM_EPS)


def _shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """attnkit's state-dict shapes for `config`, from a model built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Transformer(config).state_dict().items()}


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
    as tokenizer_config.json names them."""
    folder = resolve_source(source)
    m = read_config(folder)
    tok = _tokenizer_config(folder)
    spms = {"src": read_spm(folder / "source.spm"), "tgt": read_spm(folder / "target.spm")}
    sides = _sides(folder, m, tok, spms)
    w = read_weights(folder)
    order = stream_order(m.d_model)
    _check_positions(w, m, order)
    tables = _embeddings(w, m)
    share = m.share and torch.equal(*tables)  # one attnkit table where Marian's two are one
    config = _model_config(m, sides, share)
    shapes = _shapes(config)
    state = {}
    for name, marian_names, how in layer_table(m.n_encoder_layers, m.n_decoder_layers):
        part = (shapes[name][0] // len(marian_names), *shapes[name][1:])
        state[name] = reorder(torch.cat([w.get(n, part) for n in marian_names]), how, order)
    state.update(_vocabulary_tensors(w, m, sides, order, tables, share))
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
        (c.norm_first, "a pre-LN Transformer (model.norm_first): MarianMTModel's layers are post-LN"),
        (c.layer_norm_eps != LAYER_NORM_EPS, f"LayerNorms of epsilon {c.layer_norm_eps:g} (model.layer_norm_eps): "
                                             f"MarianMTModel's are {LAYER_NORM_EPS:g}"),
        (not c.output_projection, "attention without W^O (model.output_projection: false): MarianMTModel has W^O"),
        (c.zero_pad_positions, "no positions at padding (model.zero_pad_positions): MarianMTModel adds them"),
        (not c.sublayer_dropout, "dropout on the embeddings only (model.sublayer_dropout: false): MarianMTModel "
                                 "drops out every sublayer"),
        (c.activation not in ("relu", "gelu", "swish"), f"the {c.activation} activation"),
        (c.d_model % 2 == 1, f"an odd d_model ({c.d_model}): Marian's sinusoid pairs its channels"),
        ("src" not in ckpt.tokenizers, "no tokenizer"),
    ]
    return next((why for bad, why in reasons if bad), None)


def _pieces(blob: bytes, rows: int, where: str) -> list[str]:
    tok = SubwordTokenizer.from_bytes(blob)
    if tok.vocab_size > rows:
        raise CheckpointError(f"{where}: its tokenizer has {tok.vocab_size} pieces for {rows} embedding rows")
    return tok.pieces(list(range(tok.vocab_size))) + [f"<attnkit_unused_{i}>" for i in range(tok.vocab_size, rows)]


def _marian_state(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    c, state = ckpt.config.model, ckpt.model_state
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
