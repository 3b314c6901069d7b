"""Errors a user can fix. The CLI prints them as one line and exits non-zero, without a traceback."""

import difflib
import errno
from collections.abc import Iterable
from pathlib import Path


def first_line(err: BaseException) -> str:
    """The first line of an exception's message ("" if it has none): long library messages
    (PyTorch's state_dict mismatches, say) would otherwise break the one-line rule."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the closest of choices to a mistyped word, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


class PrimalDTError(Exception):
    """Bad input or a missing resource, with a message that says how to fix it."""

    exit_code = 2
    prefix = "error"  # how the command line introduces the message: "primal-dt: error: ..."


class ConfigError(PrimalDTError):
    """A config file or --set override that is wrong."""


class TaskError(PrimalDTError):
    """An unknown task, environment or dataset id."""


class DatasetError(PrimalDTError):
    """A dataset that is missing, cannot be downloaded, or holds unusable data."""


class CheckpointError(PrimalDTError):
    """A checkpoint or run directory that cannot be used."""


class OutOfMemory(PrimalDTError):
    """A step that needs more memory than the device has."""


def blocking_file(path: Path) -> Path | None:
    """The file that stands where path needs a folder (path itself or one above it), if any."""
    for part in (path, *path.parents):
        if part.exists():
            return part if not part.is_dir() else None
    return None


def describe_os_error(err: OSError) -> str:
    """One true line for a file-system fault: what is wrong with which path, and the fix."""
    path = Path(err.filename) if err.filename else None
    if path is not None and err.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = blocking_file(path.parent if err.errno == errno.ENOTDIR else path)
        if blocker == path:
            return f"{path} is a file, where a folder is needed; choose another path"
        if blocker is not None:
            return f"{blocker} is a file, where a folder is needed for {path}; choose another path"
    where = f": {path}" if path else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the disk{where}; free some space or choose another path"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{err.strerror}{where}; choose a path this account can write to"
    return f"{err.strerror or err}{where}; check that the path is writable and the disk has space"


def check_folder(path: Path, option: str) -> None:
    """A path that must be, or become, a folder: refused before anything is done where a file
    stands in its way."""
    blocker = blocking_file(path)
    if blocker is not None:
        where = "" if blocker == path else f": {blocker} is a file"
        raise ConfigError(f"{option} {path} must be a folder{where}; give another path")
