"""Errors a user can fix. The CLI prints them as one line and exits non-zero, without a traceback."""

import difflib
from collections.abc import Iterable


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
