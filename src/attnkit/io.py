"""File helpers: atomic writes (temp file + rename) and guarded output folders."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from attnkit.errors import AttnkitError


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8", *,
                backup: str | os.PathLike | None = None) -> Iterator[IO]:
    """Open a temp file beside `path`; on success fsync and rename it over `path` (`atomic_path`).

    With `backup`, the file `path` held is first renamed to `backup`: the newest good copy survives
    even if the new file is later found damaged (there is a moment where only `backup` exists).

    A crash (or SIGKILL) at any moment leaves either the old file or the new one, never a mix. A failed
    write (full disk, lost permission) removes the temp file and raises an AttnkitError naming `path`.
    """
    binary = "b" in mode
    with atomic_path(path, backup=backup) as tmp, open(tmp, mode, encoding=None if binary else encoding) as f:
        yield f


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, backup: str | os.PathLike | None = None) -> Iterator[Path]:
    """The name of a temp file beside `path`, for a writer that takes a file name (safetensors' `save_file`
    writes tensors straight from memory); on success it is fsynced and renamed over `path`, with `atomic_open`'s
    promises: the old file or the new one, never a mix, and a failed write named in an AttnkitError.

    The file gets the mode a plain `open` would give it (0666 less the umask), set on what the name holds once
    the writer is done: mkstemp makes 0600, and a writer that replaces the file (safetensors' `save_file` renames
    a temp file of its own, also 0600) would undo a mode set before it ran (tests/test_outputs.py)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDWR)  # what the name holds now (a writer may have replaced the file)
        try:
            os.fchmod(fd, 0o666 & ~process_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        if backup is not None and path.exists():
            os.replace(path, backup)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _write_error(path, e) from None
        raise


def _write_error(path: Path, e: OSError) -> AttnkitError:
    hint = " (disk full)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    kept = f"; the previous {path.name} is unchanged" if path.exists() else ""
    return AttnkitError(f"cannot write '{path}': {e.strerror or e}{hint}{kept}")


_UMASK_LOCK = threading.Lock()


def process_umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux's /proc/self/status has an
    "Umask:" line); elsewhere by `_umask_by_setting` (both checked in tests/test_outputs.py)."""
    mask = _umask_from_status()
    return _umask_by_setting() if mask is None else mask


def _umask_from_status(status: str | os.PathLike = "/proc/self/status") -> int | None:
    """The "Umask:" line of a /proc status file (octal), None where there is no such file or line."""
    try:
        with open(status, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_by_setting() -> int:
    """os.umask has no getter: set it and put it back at once. The mask is process-wide, so the lock keeps two
    threads of attnkit from reading each other's stand-in, and the stand-in is the strictest one (0o077), so a file
    another thread creates in that instant is at worst private, never open to others."""
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, backup: str | os.PathLike | None = None) -> None:
    with atomic_open(path, "wb", backup=backup) as f:
        f.write(data)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_folder(out: str | os.PathLike) -> Iterator[Path]:
    """A temp folder beside `out`, to fill in the block: it becomes `out` when the block succeeds (a folder `out`
    held is moved aside, then removed) and is removed when it fails, so a kill never leaves a half-written folder
    under `out`'s name. A failed write raises an AttnkitError naming `out`."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        tmp.chmod(0o777 & ~process_umask())  # mkdtemp makes 0700; outputs get the usual permissions
    except OSError as e:
        raise _write_error(out, e) from None
    try:
        yield tmp
        old = out.with_name(f".{out.name}.old")
        moved = out.exists()
        if moved:
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            if moved:  # only what this call moved aside: a `.old` an earlier crash left is not `out`'s
                os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise _write_error(out, e) from None
        raise


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


def ensure_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Fail now, not after an hour of training, when `path`'s file system cannot hold `needed` bytes."""
    free = shutil.disk_usage(path).free
    if free < needed:
        raise AttnkitError(f"only {free / 2**20:,.0f} MiB free in '{path}', but {what} needs about "
                           f"{needed / 2**20:,.0f} MiB: free some space or choose another --out")


# Whether checkpoints that need pickle may be loaded (`--trust-checkpoint`); see attnkit.checkpoint.
trust_pickle: contextvars.ContextVar[bool] = contextvars.ContextVar("trust_pickle", default=False)
