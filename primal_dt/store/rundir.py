"""A run directory's layout: where each file of a run lives, and how runs are named and found.

    RUN_DIR/
      config.json            RunConfig: the task's name, the config's name and the resolved Config
      ckpt.pt                the latest Snapshot, with the TrainingState that --resume continues
      checkpoints/step_N.pt  copies of the newest train.keep_checkpoints ckpt.pt files, N in 8
                             digits (step_00001000.pt)
      best.pt                the Snapshot of the best evaluation so far
      eval_queue/step_N.pt   Snapshots with an EvalRequest, waiting for the evaluator
      eval.jsonl             one EvalResult per evaluation (results.py)
      training.jsonl         one LogPoint per log point: the losses, and when (training_log.py)
      facts.json             a report's copy of a run: its checkpoint's facts (run_facts.py)
      spectrum_windows.pt    the fixed windows the attention spectrum is measured on (spectrum.py)
      return_curve_step_N.*  a target sweep's record and figure (conditioning.py)
      videos/                MP4 files of rendered episodes (video.py)
      train.log              a sweep run's output (sweep.py)
      events.out.tfevents.*  TensorBoard: the trainer's file of each session, the evaluator's
                             (EVAL_EVENTS_SUFFIX) beside it

Each record has its own module, one dataclass, one writer and one reader: runconfig.py
(config.json), snapshots.py (ckpt.pt, best.pt, checkpoints/, eval_queue/), results.py (eval.jsonl),
training_log.py (training.jsonl), run_facts.py (facts.json). TensorBoard's files are written by
dashboards.py alone and never read back: what the report reads is in the records. locks.py holds
the writers' locks and atomic.py writes files whole or not at all.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

# The suffix of the evaluator's TensorBoard event files (the trainer's have none).
EVAL_EVENTS_SUFFIX = ".eval"


def step_of(path: Path) -> int:
    """The step in a step_N.pt file name."""
    return int(path.stem.removeprefix("step_"))


@dataclass(frozen=True)
class RunDir:
    """Where each file of a run lives; the only place the layout above is spelled out."""

    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def checkpoint(self) -> Path:
        return self.path / "ckpt.pt"

    @property
    def best(self) -> Path:
        return self.path / "best.pt"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def queue(self) -> Path:
        return self.path / "eval_queue"

    @property
    def eval_log(self) -> Path:
        return self.path / "eval.jsonl"

    @property
    def training_log(self) -> Path:
        return self.path / "training.jsonl"

    @property
    def facts(self) -> Path:
        return self.path / "facts.json"

    def small_files(self) -> list[Path]:
        """The run's records that a report's copy of it keeps (report.export_runs)."""
        named = [self.config_file, self.eval_log, self.training_log, *self.return_curves()]
        return [path for path in named if path.exists()]

    @property
    def spectrum_windows(self) -> Path:
        return self.path / "spectrum_windows.pt"

    @property
    def log(self) -> Path:
        return self.path / "train.log"

    @property
    def videos(self) -> Path:
        return self.path / "videos"

    def return_curve(self, step: int) -> tuple[Path, Path]:
        """A target sweep's record and figure (conditioning.py)."""
        stem = self.path / f"return_curve_step_{step:08d}"
        return stem.with_suffix(".json"), stem.with_suffix(".png")

    def return_curves(self) -> list[Path]:
        return sorted(self.path.glob("return_curve_step_*.json"))

    def step_checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:08d}.pt"

    def queued(self, step: int) -> Path:
        return self.queue / f"step_{step:08d}.pt"

    def saved_checkpoints(self) -> list[Path]:
        return sorted(self.checkpoints.glob("step_*.pt"))

    def queued_snapshots(self) -> list[Path]:
        return sorted(self.queue.glob("step_*.pt"))

    @property
    def unsaved_start(self) -> bool:
        """A start that wrote its config.json but never a checkpoint: it failed, or was killed,
        before its first one. Nothing in it can be resumed or evaluated."""
        return self.config_file.is_file() and not self.checkpoint.exists()

    def start_files(self) -> list[Path]:
        """What a start writes before its first checkpoint (train.log, a sweep's, is not the
        start's: the sweep wrote it before and appends to it)."""
        named = [
            *(self.config_file, self.best, self.checkpoints, self.queue, self.eval_log),
            self.training_log,
            *(self.spectrum_windows, self.videos, *self.path.glob("return_curve_step_*")),
            *self.path.glob("events.out.tfevents.*"),
        ]
        return [path for path in named if path.exists()]

    def clear_start(self) -> None:
        """Remove what an unsaved start wrote (start_files), and the folder where nothing else
        is left in it."""
        for path in self.start_files():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()

    def unsaved_start_advice(self) -> str:
        """What to say of an unsaved start where a run was expected."""
        return (
            f"{self.path} holds a start that saved no checkpoint (it failed or was killed before "
            f"its first one): train it again with primal-dt train --run-dir {self.path} ..., "
            f"which clears it, or remove the folder"
        )

    def __str__(self) -> str:
        return str(self.path)


def safe_name(text: str) -> str:
    """text as one file or folder name: what is not a letter, digit, '.', '_' or '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def run_dir_name(task: str, config_name: str, seed: int, stamp: str | None = None) -> Path:
    """Where a run goes below a runs directory: <task>/<config>-s<seed>, with -<time> where a
    plain `train` stamps it (a sweep's runs have none: a sweep finds its runs again by name);
    config_name_of reads the config name back for runs that predate config.json's."""
    return Path(safe_name(task)) / (f"{config_name}-s{seed}" + (f"-{stamp}" if stamp else ""))


def config_name_of(folder: str) -> str:
    """The config name in a run_dir_name folder (the folder itself where it is not one)."""
    match = re.fullmatch(r"(.+)-s\d+(-\d{8}-\d{6})?", folder)
    return match[1] if match else folder


def run_of(path: Path) -> RunDir:
    """The run a path names: a run directory, or its ckpt.pt."""
    return RunDir(path.parent) if RunDir(path.parent).checkpoint == path else RunDir(path)


def folder_of(checkpoint: Path) -> RunDir:
    """Where what is made from a checkpoint file goes: its run directory (the file's folder, or
    the run above checkpoints/step_N.pt)."""
    if checkpoint.is_dir():
        return RunDir(checkpoint)
    parent = checkpoint.parent
    return RunDir(parent.parent) if RunDir(parent.parent).checkpoints == parent else RunDir(parent)


def find_runs(root: Path) -> list[Path]:
    """Every run directory under root, at any depth: the folders holding a config.json."""
    return sorted(path.parent for path in root.rglob(RunDir(root).config_file.name))
