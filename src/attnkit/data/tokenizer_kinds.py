"""Every tokenizer a checkpoint can hold, read back from its stored bytes: a sentencepiece model (attnkit's own
and imported ones: attnkit.data.tokenizer) or Moses + BPE (fairseq's released models: attnkit.data.moses_bpe)."""

from __future__ import annotations

import os
from typing import Protocol

from attnkit.data.moses_bpe import MAGIC, MosesBPETokenizer
from attnkit.data.tokenizer import SubwordTokenizer, read_with


class Tokenizer(Protocol):
    """What translation needs of a tokenizer: SubwordTokenizer (sentencepiece) and attnkit.data.moses_bpe's."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, texts: list[str], dropout: float = 0.0) -> list[list[int]]: ...

    def decode(self, ids_batch: list[list[int]]) -> list[str]: ...

    def pieces(self, ids: list[int]) -> list[str]: ...

    def piece_id(self, piece: str) -> int: ...

    def to_bytes(self) -> bytes: ...


def tokenizer_from_bytes(b: bytes) -> Tokenizer:
    """A checkpoint's tokenizer: a sentencepiece model (attnkit's own and imported ones), or Moses + BPE (fairseq's
    released models, attnkit.data.moses_bpe); both have encode / decode / pieces / vocab_size / to_bytes."""
    return MosesBPETokenizer.from_bytes(b) if b.startswith(MAGIC) else SubwordTokenizer.from_bytes(b)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """tokenizer_from_bytes of a file (a DataError naming it)."""
    return read_with(path, tokenizer_from_bytes)


__all__ = ["Tokenizer", "load_tokenizer", "tokenizer_from_bytes"]
