"""Checkpoints: written atomically, read without unpickling arbitrary objects.

A checkpoint is one torch.save'd dictionary of tensors and plain values (numbers, strings, lists,
dicts), so torch.load(weights_only=True) opens it and a file crafted to run code is refused. It holds
everything to evaluate (weights, config, normalisation statistics, task, reference scores) and to
resume (optimizer, scheduler, sampler and RNG states, step).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from primal_dt.errors import CheckpointError, first_line

FORMAT = "primal-dt-checkpoint"
VERSION = 1
CHECKPOINT_NAME = "ckpt.pt"
BEST_NAME = "best.pt"
REQUIRED_KEYS = ("step", "config", "task", "dims", "state_mean", "state_std", "model")


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Let `write` fill a temporary file in path's folder, flush it to disk, then rename it over
    path: a reader, or a crash, only ever sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as tmp:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    atomic_write(
        path, lambda file: torch.save({"format": FORMAT, "version": VERSION, **payload}, file)
    )


def copy_checkpoint(source: Path, path: Path) -> None:
    """An atomic copy (the step checkpoints beside ckpt.pt, best.pt)."""
    with source.open("rb") as original:
        atomic_write(path, lambda file: shutil.copyfileobj(original, file))


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's latest checkpoint."""
    path = Path(path)
    if path.is_dir():
        candidate = path / CHECKPOINT_NAME
        if not candidate.is_file():
            raise CheckpointError(
                f"{path} is not a primal-dt run directory: it has no {CHECKPOINT_NAME}"
            )
        return candidate
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def checkpoints_to_evaluate(path: str | Path, every: bool = False) -> list[Path]:
    """A checkpoint file; or a run directory's latest checkpoint, or all it keeps (every)."""
    path = Path(path)
    if every and path.is_dir():
        kept = sorted((path / "checkpoints").glob("step_*.pt"))
        if kept:
            return kept
    return [checkpoint_path(path)]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check a checkpoint; any problem is one CheckpointError naming the file."""
    path = checkpoint_path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        reason = first_line(err) or type(err).__name__
        raise CheckpointError(
            f"{path} is not a loadable primal-dt checkpoint (corrupt, truncated, or holding "
            f"objects other than tensors and plain values): {reason}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a primal-dt checkpoint (no '{FORMAT}' marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {payload.get('version')}, this primal-dt reads {VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path} is incomplete: missing {', '.join(missing)}")
    return payload
