"""Errors a user can fix. The CLI prints them as one line and exits non-zero, without a traceback."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message ("" if it has none): long library messages
    (PyTorch's state_dict mismatches, say) would otherwise break the one-line rule."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


class PrimalDTError(Exception):
    """Bad input or a missing resource, with a message that says how to fix it."""

    exit_code = 2


class ConfigError(PrimalDTError):
    """A config file or --set override that is wrong."""


class TaskError(PrimalDTError):
    """An unknown task, environment or dataset id."""


class DatasetError(PrimalDTError):
    """A dataset that is missing, cannot be downloaded, or holds unusable data."""


class CheckpointError(PrimalDTError):
    """A checkpoint or run directory that cannot be used."""
