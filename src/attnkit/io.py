"""File helpers: atomic writes (temp file + rename) and guarded output folders."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from attnkit.errors import AttnkitError


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside `path`; on success fsync and rename it over `path`.

    A crash (or SIGKILL) at any moment leaves either the old file or the new one, never a mix.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def ensure_new_output(path: str | os.PathLike, force: bool, what: str = "output") -> Path:
    """Refuse to overwrite an existing file or non-empty folder unless `force` is given."""
    path = Path(path)
    if path.exists() and not force and (path.is_file() or any(path.iterdir())):
        raise AttnkitError(f"{what} '{path}' already exists; pass --force to overwrite it")
    return path


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create `path` and check now, not after an hour of training, that files can be written there."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test."):
            pass
    except OSError as e:
        raise AttnkitError(f"cannot write to folder '{path}': {e.strerror or e}") from None
    return path
