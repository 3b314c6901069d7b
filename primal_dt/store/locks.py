"""One writer of each kind per run directory: locks the operating system releases with their
process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any

from primal_dt.common.errors import PrimalDTError
from primal_dt.store.atomic import remove_temporaries
from primal_dt.store.rundir import RunDir


def lock_file(path: Path) -> tuple[IO[str] | None, str]:
    """An exclusive lock on the file at path, with this process's pid written in it: (the open
    file, which holds the lock until closed or until the process dies, ""), or (None, the holder's
    pid) where another process holds it. A holder removes the file when it releases the lock
    (RunLock.release), so a lock taken on a file that is no longer at path is taken again."""
    while True:
        file = path.open("a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "?"
            file.close()
            return None, holder
        try:
            if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        file.close()
    file.truncate(0)
    file.write(str(os.getpid()))
    file.flush()
    return file, ""


class RunBusy(PrimalDTError):
    """Another process writes to this run directory."""


class RunLock:
    """One writer of each kind per run directory: the trainer (`train`, `--resume`) takes the
    "train" lock, and the "eval" lock too where its own evaluator records (eval.service "process"
    or "inline"); `eval --watch` takes the "eval" lock. The operating system releases a lock when
    its process dies, so a killed run never leaves its directory locked, and a writer that ends
    removes its lock file. Readers (`eval --ckpt`, `report`) take none."""

    def __init__(self, run: RunDir, role: str) -> None:
        self.run, self.role = run, role
        self.path = run.path / f".{role}.lock"
        self._file: Any = None

    def acquire(self) -> RunLock:
        """Take the lock (again a no-op while held); a held one is a RunBusy naming its holder."""
        if self._file is not None:
            return self
        self.run.path.mkdir(parents=True, exist_ok=True)
        file, holder = lock_file(self.path)
        if file is None:
            raise self.busy(holder)
        self._file = file
        for path in self._writes():  # no writer of ours is left to finish these
            remove_temporaries(path)
        return self

    def holder(self) -> str | None:
        """The pid of the process that holds this lock, or None where none does (this creates
        nothing)."""
        try:
            file = self.path.open("r")
        except FileNotFoundError:
            return None
        with file:
            try:
                fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return file.read().strip() or "?"
        return None

    def busy(self, holder: str) -> RunBusy:
        return RunBusy(
            f"{self.run} is in use: process {holder} is its {self.role} writer; wait for it to "
            f"end (or stop it), or use another run directory"
        )

    def _writes(self) -> list[Path]:
        """What this role writes atomically (step_* stands for any step)."""
        run = self.run
        if self.role == "train":
            steps = [run.checkpoints / "step_*.pt", run.queue / "step_*.pt"]
            return [run.config_file, run.checkpoint, run.eval_log, *steps]
        return [run.best, run.spectrum_windows]

    def release(self) -> None:
        """Remove the lock file, then let go of it: a finished run leaves no lock behind."""
        if self._file is not None:
            self.path.unlink(missing_ok=True)
            self._file.close()
            self._file = None
