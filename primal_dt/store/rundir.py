"""A run directory and the typed records kept in it: one dataclass, one writer and one reader each.

    RUN_DIR/
      config.json            RunConfig: the task's name, the config's name and the resolved Config
      ckpt.pt                the latest Snapshot, with the TrainingState that --resume continues
      checkpoints/step_N.pt  copies of the newest train.keep_checkpoints ckpt.pt files
      best.pt                the Snapshot of the best evaluation so far
      eval_queue/step_N.pt   Snapshots with an EvalRequest, waiting for the evaluator
      eval.jsonl             one EvalRecord per evaluation (results.py)
      spectrum_windows.pt    the fixed windows the attention spectrum is measured on (spectrum.py)
      return_curve_step_N.*  a target sweep's record and figure (conditioning.py)
      videos/                MP4 files of rendered episodes (video.py)
      train.log              a sweep run's output (sweep.py)
      events.out.tfevents.*  TensorBoard

Training writes snapshots; evaluation, the evaluation service, the spectrum, sweeps, reports and
the command line read them, each with read_snapshot, which checks the file once and returns typed
fields. A snapshot file is one torch.save'd dictionary of tensors and plain values (numbers,
strings, lists, dicts), so torch.load(weights_only=True) opens it and a file crafted to run code
is refused; it carries a digest of each of its parts (integrity.py), which every read verifies.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

import gymnasium as gym
import torch
from torch import Tensor

from primal_dt.common.config import Config, config_from_dict
from primal_dt.common.errors import CheckpointError, ConfigError, PrimalDTError, first_line
from primal_dt.data.episodes import ReferenceScores, TaskData
from primal_dt.data.tasks import Task, env_for_gym_id, make_env
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.integrity import damaged_parts, describe, seal

FORMAT = "primal-dt-checkpoint"
VERSION = 1


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
    def results(self) -> Path:
        return self.path / "eval.jsonl"

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
            return [run.config_file, run.checkpoint, run.results, *steps]
        return [run.best, run.spectrum_windows]

    def release(self) -> None:
        """Remove the lock file, then let go of it: a finished run leaves no lock behind."""
        if self._file is not None:
            self.path.unlink(missing_ok=True)
            self._file.close()
            self._file = None


# --- config.json ---------------------------------------------------------------------------------


@dataclass
class RunConfig:
    """What a run was started with: config.json. `config_name` names the config file it came from
    (dt, primal-dt, ...), which reports group runs by."""

    task: str
    config_name: str
    config: Config


def write_run_config(run: RunDir, record: RunConfig) -> None:
    data = {"task": record.task, "config_name": record.config_name, **record.config.to_dict()}
    atomic_write(run.config_file, lambda file: file.write(json.dumps(data, indent=2).encode()))


def read_run_config(run: RunDir) -> RunConfig:
    """config.json as a RunConfig; a missing or foreign file is one CheckpointError."""
    try:
        data = json.loads(run.config_file.read_text())
        task, name = data.pop("task"), data.pop("config_name", None)
        config = config_from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as err:
        raise CheckpointError(
            f"{run.config_file} is not a primal-dt run config: {first_line(err)}"
        ) from None
    if name is None:  # a run made before config.json named its config
        name = config_name_of(run.path.name)
    return RunConfig(task, name, config)


# --- snapshots -----------------------------------------------------------------------------------


@dataclass
class TaskRecord:
    """The task a policy was trained on, with what evaluating it needs: its environment, the
    target returns, and the reference scores its normalised scores are computed from."""

    name: str
    dataset_ids: tuple[str, ...]
    env_id: str
    env_kwargs: dict[str, Any]
    max_episode_steps: int
    eval_targets: tuple[float, ...]
    reference: ReferenceScores | None
    dataset_best_return: float | None = None  # the best episode return in the training data

    @classmethod
    def of(cls, data: TaskData) -> TaskRecord:
        """The record of a task's loaded data."""
        return cls(
            name=data.task.name,
            dataset_ids=tuple(data.task.dataset_ids),
            env_id=data.env_id,
            env_kwargs=data.env_kwargs,
            max_episode_steps=data.max_episode_steps,
            eval_targets=data.eval_targets,
            reference=data.reference,
            dataset_best_return=data.best_return,
        )

    def task(self) -> Task:
        """The task to load its data again (where it is found now)."""
        return Task(self.name, self.dataset_ids, env_for_gym_id(self.env_id))

    def make_env(self, **extra: Any) -> gym.Env:
        """Its environment, as evaluation makes it (extra: e.g. a render mode)."""
        return make_env(self.env_id, self.max_episode_steps, **self.env_kwargs, **extra)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["dataset_ids"], data["eval_targets"] = list(self.dataset_ids), list(self.eval_targets)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        reference = data.get("reference")
        return cls(
            name=str(data["name"]),
            dataset_ids=tuple(data.get("dataset_ids", ())),
            env_id=str(data["env_id"]),
            env_kwargs=dict(data["env_kwargs"]),
            max_episode_steps=int(data["max_episode_steps"]),
            eval_targets=tuple(float(t) for t in data["eval_targets"]),
            reference=ReferenceScores(**reference) if reference else None,
            dataset_best_return=data.get("dataset_best_return"),
        )


@dataclass
class EvalRequest:
    """What the trainer asks of the evaluator for a queued snapshot."""

    episodes: int
    final: bool


@dataclass
class TrainingState:
    """Everything besides the policy that resuming needs to continue exactly: the optimizer,
    scheduler, sampler and RNG states, the loss sums pending for the next log, and how many
    records of eval.jsonl the trainer had printed (a resumed run prints the ones after them)."""

    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    sampler: dict[str, Any]
    rng_torch: Tensor
    rng_cuda: list[Tensor]  # the training device's CUDA generator state; empty on a CPU
    pending_sums: dict[str, Tensor]  # by metric name (the trainer's train_step names them)
    pending_count: int
    results_shown: int | None = None  # None: not recorded (older checkpoints): print none


@dataclass
class Snapshot:
    """A policy at one step: the Config, the task, the model's sizes, the state statistics and the
    weights; with an EvalRequest when it is queued for evaluation, and with the TrainingState
    when it is a checkpoint to resume from."""

    step: int
    config: Config
    task: TaskRecord
    state_dim: int
    act_dim: int
    max_timestep: int
    state_mean: Tensor
    state_std: Tensor
    weights: dict[str, Tensor]
    request: EvalRequest | None = None
    training: TrainingState | None = None
    # False for a file written before snapshots carried a digest (its integrity is unknown).
    sealed: bool = True

    def build_model(self, device: torch.device | str = "cpu") -> DecisionTransformer:
        """The snapshot's model with its weights, on device."""
        model = DecisionTransformer(
            self.config.model, self.state_dim, self.act_dim, self.max_timestep
        )
        try:
            model.load_state_dict(self.weights)
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"the checkpoint of step {self.step} does not match its model: {first_line(err)}"
            ) from None
        return model.to(device)


def payload_of(snapshot: Snapshot) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "step": snapshot.step,
        "config": snapshot.config.to_dict(),
        "task": snapshot.task.to_dict(),
        "dims": {
            "state_dim": snapshot.state_dim,
            "act_dim": snapshot.act_dim,
            "max_timestep": snapshot.max_timestep,
        },
        "state_mean": snapshot.state_mean,
        "state_std": snapshot.state_std,
        "model": snapshot.weights,
    }
    if snapshot.request is not None:
        payload["eval"] = dataclasses.asdict(snapshot.request)
    state = snapshot.training
    if state is not None:
        payload["optimizer"] = state.optimizer
        payload["scheduler"] = state.scheduler
        payload["sampler"] = state.sampler
        payload["rng"] = {"torch": state.rng_torch, "cuda": state.rng_cuda}
        payload["pending_log"] = {"sums": state.pending_sums, "count": state.pending_count}
        if state.results_shown is not None:
            payload["results_shown"] = state.results_shown
    return payload


def _snapshot(payload: dict[str, Any]) -> Snapshot:
    dims, request = payload["dims"], payload.get("eval")
    training = None
    if "optimizer" in payload:
        pending = payload.get("pending_log", {"sums": {}, "count": 0})
        sums = pending["sums"]
        if isinstance(sums, Tensor):  # written before the sums were named: a vector, in this order
            sums = dict(zip(("action_loss", "ksvd_loss", "grad_norm"), sums, strict=True))
        training = TrainingState(
            optimizer=payload["optimizer"],
            scheduler=payload["scheduler"],
            sampler=payload["sampler"],
            rng_torch=payload["rng"]["torch"],
            rng_cuda=list(payload["rng"]["cuda"]),
            pending_sums=dict(sums),
            pending_count=int(pending["count"]),
            results_shown=payload.get("results_shown"),
        )
    return Snapshot(
        step=int(payload["step"]),
        config=config_from_dict(payload["config"]),
        task=TaskRecord.from_dict(payload["task"]),
        state_dim=int(dims["state_dim"]),
        act_dim=int(dims["act_dim"]),
        max_timestep=int(dims["max_timestep"]),
        state_mean=payload["state_mean"],
        state_std=payload["state_std"],
        weights=payload["model"],
        request=EvalRequest(int(request["episodes"]), bool(request["final"])) if request else None,
        training=training,
    )


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    """Save atomically, with its digest: a crash leaves the previous file or the whole new one."""
    payload = seal(payload_of(snapshot))
    atomic_write(path, lambda file: torch.save(payload, file))


def read_snapshot(path: str | Path, map_location: str | torch.device = "cpu") -> Snapshot:
    """Load and check a snapshot file, or a run directory's latest checkpoint; any problem is one
    CheckpointError naming the file, what is wrong with it and the run's other checkpoints."""
    path = checkpoint_file(path)
    payload = _load(path, map_location)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a primal-dt checkpoint (no '{FORMAT}' marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {payload.get('version')}, this primal-dt reads {VERSION}"
        )
    damaged = damaged_parts(payload)
    if damaged:
        raise CheckpointError(
            f"{path} fails its integrity check: {describe(damaged)} the digest "
            f"written with them (the file was damaged or changed after primal-dt wrote it), so "
            f"nothing is loaded from it; {other_checkpoints(path)}"
        )
    try:
        snapshot = _snapshot(payload)
    except KeyError as err:
        raise CheckpointError(f"{path} is incomplete: missing {err}") from None
    except (TypeError, ValueError, AttributeError, ConfigError) as err:
        raise CheckpointError(
            f"checkpoint {path} does not match this primal-dt: {first_line(err)}"
        ) from None
    snapshot.sealed = damaged is not None
    return snapshot


def unsealed_note(path: Path) -> str:
    """The one line said of a checkpoint written before checkpoints carried a digest."""
    return (
        f"note: {path} was written before primal-dt checkpoints carried a digest: it loads, but "
        f"its integrity cannot be checked"
    )


ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


def _load(path: Path, map_location: str | torch.device) -> Any:
    """torch.load(weights_only=True), its failures in words. torch's own messages end with advice
    to load the file with weights_only=False, which would run whatever code a crafted file holds:
    none of them is repeated."""
    with path.open("rb") as file:
        head = file.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        what = "it is empty" if not head else f"it starts with {head!r}, not a zip archive's PK"
        raise CheckpointError(
            f"{path} is not a checkpoint at all: torch.save writes a zip archive, and {what}; "
            f"{other_checkpoints(path)}"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain values, which primal-dt never "
            f"writes: it is refused unopened, since loading such objects can run code"
        ) from None
    except Exception as err:
        reason = first_line(err).split(". ")[0] or type(err).__name__
        raise CheckpointError(
            f"{path} is damaged (truncated or corrupt: {reason}); {other_checkpoints(path)}"
        ) from None


def other_checkpoints(path: Path) -> str:
    """Where the run of a checkpoint file keeps its other checkpoints, in words, for an error."""
    queued = RunDir(path.parent.parent)
    run = queued if queued.queue == path.parent else folder_of(path)
    kept = [run.checkpoint, run.best, *reversed(run.saved_checkpoints())]
    others = [p for p in kept if p.is_file() and p.resolve() != path.resolve()]
    if not others:
        return "its run keeps no other checkpoint"
    return f"the run's other checkpoints are {', '.join(map(str, others))}"


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's latest checkpoint."""
    path = Path(path)
    if path.is_dir():
        run = RunDir(path)
        if not run.checkpoint.is_file():
            raise CheckpointError(
                f"{path} is not a primal-dt run directory: it has no {run.checkpoint.name}"
            )
        return run.checkpoint
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def checkpoints_to_evaluate(path: str | Path, every: bool = False) -> list[Path]:
    """A checkpoint file; or a run directory's latest checkpoint, or all it keeps (every)."""
    path = Path(path)
    if every and path.is_dir():
        kept = RunDir(path).saved_checkpoints()
        if kept:
            return kept
    return [checkpoint_file(path)]
