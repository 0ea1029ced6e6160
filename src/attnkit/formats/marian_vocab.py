"""A Marian model's vocabularies and tokenizers in attnkit's ids (and a fairseq model's, the same way). Marian maps
the pieces source.spm / target.spm produce to ids through vocab.json (target_vocab.json with separate
vocabularies), fairseq through dict.txt; attnkit's ids are fixed (PAD 0, BOS 1, EOS 2, UNK 3). `Side` is one
embedding table's rows in attnkit's order, `read_sides` the one or two tables of a folder, and `side_tokenizer` a
sentencepiece model whose ids are those rows. `attnkit.formats.marian`'s docstring says why each row is where it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sentencepiece import sentencepiece_model_pb2 as spm_pb2

from attnkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.errors import CheckpointError
from attnkit.formats.marian_folder import MarianConfig, read_json

_PIECE = spm_pb2.ModelProto.SentencePiece
# Added to a logit that must take no probability: exp(-1e4) is 0 in float32, and the logit stays a finite number.
NEVER = -1e4
PRODUCED = (_PIECE.NORMAL, _PIECE.USER_DEFINED, _PIECE.BYTE)  # the piece types sentencepiece's encoder emits


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
        data = read_json(path, "the vocabulary: piece -> id")
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
            raise CheckpointError(f"{self.path}: no {token!r} ({field}); the model's vocabulary must hold it")
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
        # Marian's own models start from pad, fairseq's from </s>: BOS is a copy of that row, taking no probability.
        # A model exported by attnkit starts from a token of its own (BOS 1), which keeps its row: import then
        # undoes export.
        copied = start in (pad, eos)
        never = [BOS_ID] if copied else []
        if copied:
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


def read_sides(folder: Path, m: MarianConfig, tok: dict, spms: dict) -> dict[str, Side]:
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


__all__ = ["NEVER", "PRODUCED", "Side", "Vocab", "read_sides", "read_spm", "side_tokenizer"]
