"""Reading and writing corpus text: plain or gzip, strict UTF-8, errors that name the file and line.

Corpora arrive from many places; a bad byte on line 20 481 should be reported as exactly that,
not as a traceback from deep inside a tokenizer.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from attnkit.errors import DataError
from attnkit.io import atomic_write_text

T = TypeVar("T")

# character classes of the scripts that decide a CJK text (Unicode blocks; compatibility and extension blocks too)
HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
KANA = re.compile("[\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
UNSPACED = re.compile(f"{HAN.pattern}|{KANA.pattern}")  # Han and kana: scripts written without spaces between words


def _read_bytes(path: Path) -> bytes:
    """All bytes of `path`, gunzipped when the name ends in `.gz`."""
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; corrupt deflate data a zlib.error
        raise DataError(f"{path}: cannot read: {e}") from None


def _strip_cr(line: bytes) -> bytes:
    """Drop the \r of a \r\n terminator only, so trailing spaces and tabs in the data survive."""
    return line[:-1] if line.endswith(b"\r") else line


def _decode_line(raw: bytes, path: Path | str, lineno: int) -> str:
    """Decode one line; decoding line by line is what lets the error carry a line number."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


# A UTF-8 byte order mark: Windows editors (Notepad, Excel's "CSV UTF-8") start a file with it. It marks the
# encoding, it is not text: left in, it would be the first character of line 1 (one more unknown token, a
# reference that never matches).
BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _drop_bom(data: bytes, name: Path | str) -> bytes:
    """The start of a text without its UTF-8 byte order mark; UTF-16 (PowerShell's `>` writes it) is refused
    saying so, rather than as "invalid UTF-8" at its first byte."""
    if data.startswith(UTF16_BOMS):
        raise DataError(f"{name}: UTF-16 text (it starts with a UTF-16 byte order mark); attnkit reads UTF-8: "
                        f"convert it, e.g. iconv -f UTF-16 -t UTF-8")
    return data.removeprefix(BOM)


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a plain or `.gz` text file without their line terminators (and without a leading UTF-8 BOM)."""
    path = Path(path)
    data = _read_bytes(path)
    if not _drop_bom(data, path):
        raise DataError(f"{path} is empty")
    return split_lines(data, path)


def split_lines(data: bytes, name: Path | str) -> list[str]:
    """Decoded lines of `data` (read from `name`) without their terminators."""
    # split on b"\n" only: str.splitlines would also split on \x0b, \x1c, U+2028 ... inside a sentence
    raw_lines = _drop_bom(data, name).split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    return [_decode_line(_strip_cr(raw), name, i) for i, raw in enumerate(raw_lines, start=1)]


def iter_lines(stream: IO, name: str = "<stdin>") -> Iterator[str]:
    """Lines of a stream (e.g. sys.stdin) as they arrive, split and decoded exactly as read_lines does."""
    binary = getattr(stream, "buffer", None)  # a text stream would also split on \r and decode without line numbers
    for lineno, raw in enumerate(stream if binary is None else binary, start=1):
        if isinstance(raw, str):  # an in-memory text stream (io.StringIO)
            raw = raw.encode("utf-8", "surrogatepass")
        if lineno == 1:
            raw = _drop_bom(raw, name)
            if not raw:  # a BOM alone is no line, as in a file
                return
        yield _decode_line(_strip_cr(raw.removesuffix(b"\n")), name, lineno)


def stream_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines read_lines returns, one at a time from disk: for corpora larger than memory."""
    path, empty = Path(path), True
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for line in iter_lines(f, str(path)):
                empty = False
                yield line
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    if empty:
        raise DataError(f"{path} is empty")


CHUNK_LINES = 10_000  # lines the streaming prepares encode at a time: their memory does not grow with the corpus


def chunked(items: Iterable[T], size: int | None = None) -> Iterator[list[T]]:
    """`items` in lists of `size` (CHUNK_LINES when None; the last list shorter), read as they come."""
    items = iter(items)
    while chunk := list(itertools.islice(items, size or CHUNK_LINES)):
        yield chunk


def lone_surrogate(text: str) -> int:
    """The 1-based character of `text`'s first lone surrogate (0: none): a Python string (and JSON's "\\ud800") can
    hold one, no UTF-8 file can, and the tokenizer fails on it with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start + 1
    return 0


def check_unicode(texts: Iterable[str], number_from: int = 1) -> None:
    """DataError naming the first text that is not Unicode (`lone_surrogate`)."""
    for i, text in enumerate(texts, start=number_from):
        if at := lone_surrogate(text):
            raise DataError(f"input {i}: not valid Unicode (a lone surrogate at character {at})")


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Source and target lines of a parallel corpus, checked to be aligned line for line."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    return src, tgt


def resolve_prefix(prefix: str | os.PathLike, lang: str) -> Path:
    """`PREFIX.LANG`, or its gzipped twin `PREFIX.LANG.gz`, whichever exists (plain wins)."""
    plain = Path(f"{prefix}.{lang}")
    for candidate in (plain, Path(f"{plain}.gz")):
        if candidate.is_file():
            return candidate
    raise DataError(f"no such file: {plain}(.gz)")


def write_lines(path: str | os.PathLike, lines: list[str]) -> None:
    """Write one line per string, atomically, in the format read_lines reads back."""
    atomic_write_text(path, "".join(line + "\n" for line in lines))
