"""Files written whole or not at all: a reader, or a crash, sees the old file or the new one."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Let `write` fill a temporary file in path's folder, flush it to disk, then rename it over
    path: a reader, or a crash, only ever sees the old file or the whole new one. The file gets
    the umask's mode, as any other file would (mkstemp's own is 0600: unreadable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as tmp:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException as err:
        Path(tmp_name).unlink(missing_ok=True)
        # A full disk as what it is, naming the file: torch.save turns the OSError of its
        # writes into a RuntimeError ("unexpected pos ...") and the file's own errors name none.
        cause = err if isinstance(err, OSError) else err.__context__
        if isinstance(cause, OSError) and cause.errno and not cause.filename:
            raise OSError(cause.errno, cause.strerror, str(path)) from err
        raise


def remove_temporaries(path: Path) -> None:
    """Remove what atomic writes of `path` left behind when killed between write and rename."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def atomic_copy(source: Path, path: Path) -> None:
    """An atomic copy (the step checkpoints beside ckpt.pt, best.pt)."""
    with source.open("rb") as original:
        atomic_write(path, lambda file: shutil.copyfileobj(original, file))


def append_line(path: Path, line: str) -> None:
    """One line, written with a single append so concurrent writers never interleave (eval.jsonl,
    training.jsonl). A line the disk has no room for raises OSError and leaves nothing: never a line
    cut short, which the next line would be glued onto."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    written = 0
    try:
        while written < len(data):  # a full disk takes what fits: the next write says why
            count = os.write(fd, data[written:])
            if count == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += count
    except OSError as err:
        if written:
            os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR) - written)
        raise OSError(err.errno, err.strerror, str(path)) from None
    finally:
        os.close(fd)
