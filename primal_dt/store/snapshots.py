"""Snapshots: the checkpoints of a run (ckpt.pt, best.pt, checkpoints/step_N.pt, eval_queue/).

Training writes snapshots; evaluation, the evaluation service, the spectrum, sweeps, reports and
the command line read them, each with read_snapshot, which checks the file once and returns typed
fields. A snapshot file is one torch.save'd dictionary of tensors and plain values (numbers,
strings, lists, dicts), so torch.load(weights_only=True) opens it and a file crafted to run code
is refused; it carries a digest of each of its parts (integrity.py), which every read verifies.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

from primal_dt.common.config import Config
from primal_dt.common.errors import CheckpointError, ConfigError, first_line
from primal_dt.common.loading import config_from_dict
from primal_dt.data.episodes import ReferenceScores, TaskData
from primal_dt.data.tasks import Task, env_for_gym_id, make_env
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.atomic import atomic_write
from primal_dt.store.integrity import damaged_parts, describe, seal
from primal_dt.store.locks import RunLock
from primal_dt.store.rundir import RunDir, folder_of

FORMAT = "primal-dt-checkpoint"
VERSION = 1


@dataclass
class TaskInfo:
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
    def of(cls, data: TaskData) -> TaskInfo:
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
    def from_dict(cls, data: dict[str, Any]) -> TaskInfo:
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
    task: TaskInfo
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
        task=TaskInfo.from_dict(payload["task"]),
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
        if run.unsaved_start:
            holder = RunLock(run, "train").holder()
            if holder is not None:  # a live start, before its first checkpoint
                raise CheckpointError(
                    f"{path} has no checkpoint yet: process {holder} is training it and saves "
                    f"its first at step train.ckpt_every; evaluate it then"
                )
            raise CheckpointError(run.unsaved_start_advice())
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
