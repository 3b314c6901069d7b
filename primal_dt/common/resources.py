"""Where the packaged data (envs/, configs/) lives: beside the code in a wheel, at the repo root otherwise."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # primal_dt/, above common/


def resource_dir(name: str) -> Path:
    """The envs/ or configs/ folder: inside the installed package, or the source checkout's top level."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"primal-dt's {name}/ folder is missing from {_PACKAGE}; reinstall primal-dt"
    )
