"""Token arrays on disk: safetensors files written a chunk at a time and read by memory-mapping.

A corpus larger than memory never exists whole in the process. `ArrayWriter` appends each array's chunks to an
unnamed spill file as they are encoded and, at the end, writes the safetensors file (header, then each array's
bytes) atomically; `map_arrays` maps a file's arrays without reading them, so the OS pages in only what a batch
touches and can drop those pages again under memory pressure (they are file-backed, not the process's own memory).

The format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data, offsets
counted from the end of the header. Files written here are read by `safetensors` and the reverse.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

import numpy as np

from attnkit.errors import DataError
from attnkit.io import atomic_open

_DTYPES = {"I8": np.int8, "U8": np.uint8, "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32,
           "I64": np.int64, "U64": np.uint64, "F16": np.float16, "F32": np.float32, "F64": np.float64}
_NAMES = {np.dtype(dtype): name for name, dtype in _DTYPES.items()}
_ALIGN = 8  # the header is padded with spaces so that the data starts 8-byte aligned, as safetensors writes it


def _read_header(path: Path) -> tuple[dict, int]:
    """(the JSON header, the byte where the data starts) of a safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= path.stat().st_size - 8:
            raise DataError(f"{path}: not a safetensors file (no header)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{path}: not a safetensors file (unreadable header: {e})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: not a safetensors file (the header is not a mapping)")
    return header, 8 + n


def _map_one(path: Path, name: str, info, start: int, size: int) -> np.ndarray:
    """One array of the file, memory-mapped read-only; a field that does not add up is a DataError naming it."""
    try:
        dtype, shape = np.dtype(_DTYPES[info["dtype"]]), tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path}: array {name}: unreadable entry {info!r} ({e!r})") from None
    if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or begin < 0 or start + end > size:
        raise DataError(f"{path}: array {name}: data_offsets {begin}..{end} do not hold shape {list(shape)} "
                        f"of {info['dtype']} within the file's {size:,} bytes (truncated?)")
    if begin == end:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)


def map_arrays(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: read-only memory-mapped array}, the file's metadata) of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    header, start = _read_header(path)
    metadata = header.pop("__metadata__", None) or {}
    size = path.stat().st_size
    return {name: _map_one(path, name, info, start, size) for name, info in header.items()}, metadata


class ArrayWriter:
    """1-D arrays written chunk by chunk, then saved as one safetensors file at `path` (atomically: the file appears
    whole or not at all). Use as a context manager: leaving it by an exception writes nothing.

        with ArrayWriter(path, {"train": np.int32}) as out:
            for chunk in chunks:
                out.append("train", chunk)
            out.finish(metadata={"vocab": ...})
    """

    def __init__(self, path: str | os.PathLike, dtypes: dict[str, type | np.dtype]):
        self.path = Path(path)
        self.dtypes = {name: np.dtype(dtype) for name, dtype in dtypes.items()}
        self.lengths = dict.fromkeys(self.dtypes, 0)
        self._spills: dict[str, IO[bytes]] = {}
        self._open = contextlib.ExitStack()

    def __enter__(self) -> ArrayWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        spill = functools.partial(tempfile.TemporaryFile, dir=self.path.parent)  # unnamed: gone when closed
        self._spills = {name: self._open.enter_context(spill()) for name in self.dtypes}
        return self

    def __exit__(self, *exc) -> None:
        self._open.close()

    def append(self, name: str, chunk) -> None:
        """Add `chunk`'s values (any 1-D sequence) to the end of array `name`."""
        chunk = np.ascontiguousarray(chunk, dtype=self.dtypes[name]).reshape(-1)
        self._spills[name].write(chunk.tobytes())
        self.lengths[name] += chunk.size

    def _header(self, metadata: dict[str, str] | None) -> bytes:
        header, offset = {}, 0
        for name, dtype in self.dtypes.items():
            n = self.lengths[name] * dtype.itemsize
            header[name] = {"dtype": _NAMES[dtype], "shape": [self.lengths[name]], "data_offsets": [offset, offset + n]}
            offset += n
        if metadata:
            header["__metadata__"] = dict(metadata)
        text = json.dumps(header, ensure_ascii=False).encode("utf-8")
        return text + b" " * (-(8 + len(text)) % _ALIGN)

    def finish(self, metadata: dict[str, str] | None = None) -> None:
        """Write the file: the header, then every array's bytes in the order `dtypes` named them."""
        header = self._header(metadata)
        with atomic_open(self.path, "wb", encoding=None) as f:
            f.write(len(header).to_bytes(8, "little") + header)
            for spill in self._spills.values():
                spill.seek(0)
                shutil.copyfileobj(spill, f, 1 << 24)
