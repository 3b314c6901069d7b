"""The quick start's `primal-dt train` command, read from docs/quickstart.md (its first command):
the one place it is written, read by the scripts that time it or draw its dashboards. No torch
here: bench_contention.py sets the thread variables before torch is imported."""

from __future__ import annotations

import shlex
from pathlib import Path

QUICKSTART_PAGE = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"


def quickstart_args() -> list[str]:
    """The command's arguments, without the program's name."""
    block = QUICKSTART_PAGE.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    command = block.replace("\\\n", " ").splitlines()[0]
    args = shlex.split(command, comments=True)
    assert args[:2] == ["primal-dt", "train"], args
    return args[1:]
