"""The training loop: AdamW with linear warm-up and gradient clipping, on the action MSE plus
eta times the KSVD loss, with TensorBoard logs, resumable checkpoints, and evaluation handed to a
separate process (eval_service) so the loop never waits for rollouts.

The dataset lives on the training device and batches are sampled there; the loop reads values
back to the host only at logging, evaluation and checkpoint steps. Matrix products run in bf16
under autocast on CUDA (train.precision), and AdamW is fused wherever torch has it (device.py).
"""

from __future__ import annotations

import random
import re
import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from primal_dt.config import Config
from primal_dt.cpu import training_threads
from primal_dt.dashboards import run_layout
from primal_dt.data import Batch, TaskData, WindowSampler, load_task_data
from primal_dt.device import adamw, autocast, resolve_device
from primal_dt.errors import CheckpointError, ConfigError, PrimalDTError, first_line
from primal_dt.eval_service import EvalService, queue_snapshot
from primal_dt.evaluate import EvalOptions
from primal_dt.model import DecisionTransformer
from primal_dt.progress import Progress, progress_bar
from primal_dt.results import EvalRecord, ResultsTail, describe, drop_results_after, final_missing
from primal_dt.run import (
    EvalRequest,
    RunConfig,
    RunDir,
    RunLock,
    Snapshot,
    TaskRecord,
    TrainingState,
    atomic_copy,
    read_snapshot,
    run_of,
    step_of,
    write_run_config,
    write_snapshot,
)
from primal_dt.tasks import Task, env_for_gym_id


class TrainingDiverged(PrimalDTError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(PrimalDTError):
    """SIGINT or SIGTERM stopped the run after saving a checkpoint."""

    label = "stopped"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class EvaluationFailed(PrimalDTError):
    """Training finished but its final evaluation did not."""

    exit_code = 1


class StopSignals:
    """Turn SIGINT/SIGTERM into a request to stop after the current step, so the loop can save a
    checkpoint and flush its logs instead of dying halfway through a write. A second signal
    interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if not self._previous and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_run_dir(task: str, config_name: str, seed: int) -> Path:
    safe_task = re.sub(r"[^A-Za-z0-9._-]+", "_", task)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / safe_task / f"{config_name}-s{seed}-{stamp}"


def action_loss(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the action entries of real (unpadded) steps."""
    weights = mask.unsqueeze(-1).to(predicted.dtype)
    squared = (predicted.float() - target) ** 2 * weights
    return squared.sum() / (weights.sum() * predicted.shape[-1]).clamp(min=1.0)


@dataclass
class Live:
    """What the loop talks to while it runs: TensorBoard, the progress bar, the evaluation process
    (None where nobody evaluates beside training) and the results it sends back."""

    writer: SummaryWriter
    bar: Progress
    service: EvalService | None
    results: ResultsTail
    tick: float

    def say(self, line: str) -> None:
        """A progress line, on stderr above the bar."""
        self.bar.write(line, file=sys.stderr)


@dataclass
class Trainer:
    """One run: the model, its optimiser and data, and where it writes."""

    config: Config
    data: TaskData
    run_dir: RunDir
    device: torch.device
    model: DecisionTransformer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: WindowSampler
    state_mean: np.ndarray
    state_std: np.ndarray
    step: int = 0
    # Sums of (action loss, KSVD loss, grad norm) since the last log, and their count: saved in
    # checkpoints so a run stopped between two logs logs the same averages after resuming.
    pending: torch.Tensor | None = None
    pending_count: int = 0
    # How many records of eval.jsonl have been printed (saved in checkpoints: a resumed run prints
    # those that came after, while the interrupted run was stopping).
    results_shown: int | None = None
    # The module the training step calls: the model, or its torch.compile'd wrapper (which
    # shares its parameters; checkpoints always save the plain model's state_dict).
    forward_model: torch.nn.Module | None = None
    # The run directory's writer locks: the trainer's, and the evaluator's where our own
    # evaluation process is the evaluator (eval.service = "process").
    locks: list[RunLock] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.locks = [RunLock(self.run_dir, "train")]
        if evaluates(self.config) and self.config.eval.service == "process":
            self.locks.append(RunLock(self.run_dir, "eval"))
        if self.pending is None:
            self.pending = torch.zeros(3, device=self.device)
        if self.forward_model is None:
            cfg = self.config.train
            self.forward_model = (
                torch.compile(self.model, mode=cfg.compile_mode, dynamic=False)
                if cfg.compile
                else self.model
            )

    @classmethod
    def create(cls, config: Config, data: TaskData, run_dir: Path) -> Trainer:
        device = resolve_device(config.train.device, "train.device")
        if config.eval.service == "process" and evaluates(config):
            resolve_device(
                config.eval.device, "eval.device"
            )  # checked now, not at the first evaluation
        if device.type == "cpu":
            # One count for the whole run: the weights' bits depend on it (cpu.py).
            torch.set_num_threads(training_threads(config.train.threads))
        seed_everything(config.train.seed)
        state_mean, state_std = data.state_stats()
        longest = max(len(ep.rewards) for ep in data.episodes)
        model = DecisionTransformer(
            config.model, data.state_dim, data.act_dim, max(data.max_episode_steps, longest)
        ).to(device)
        optimizer = adamw(
            model.parameters(), device, lr=config.train.lr, weight_decay=config.train.weight_decay
        )
        warmup = config.train.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warmup, 1.0) if warmup else 1.0
        )
        sampler = WindowSampler(
            data.episodes,
            state_mean,
            state_std,
            config.model.context_len,
            config.train.return_scale,
            device,
            seed=config.train.seed,
        )
        return cls(
            config, data, RunDir(run_dir), device, model, optimizer, scheduler, sampler,
            state_mean, state_std,
        )  # fmt: skip

    def hold(self) -> None:
        """Take the run directory's locks (see RunLock): a second writer is refused."""
        for lock in self.locks:
            lock.acquire()

    def release(self) -> None:
        for lock in self.locks:
            lock.release()

    # --- snapshots and checkpoints -----------------------------------------------------------

    def snapshot(self, request: EvalRequest | None = None, resumable: bool = False) -> Snapshot:
        """The policy as it is now; resumable adds what continuing the run needs."""
        data = self.data
        task = TaskRecord(
            name=data.task.name,
            dataset_ids=tuple(data.task.dataset_ids),
            env_id=data.env_id,
            env_kwargs=data.env_kwargs,
            max_episode_steps=data.max_episode_steps,
            eval_targets=tuple(self.config.eval.targets) or data.eval_targets,
            reference=data.reference,
            dataset_best_return=data.best_return,
        )
        training = None
        if resumable:
            training = TrainingState(
                optimizer=self.optimizer.state_dict(),
                scheduler=self.scheduler.state_dict(),
                sampler=self.sampler.state_dict(),
                rng_torch=torch.get_rng_state(),
                rng_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                pending_sums=self.pending.cpu(),
                pending_count=self.pending_count,
                results_shown=self.results_shown,
            )
        return Snapshot(
            step=self.step,
            config=self.config,
            task=task,
            state_dim=self.model.state_dim,
            act_dim=self.model.act_dim,
            max_timestep=self.model.max_timestep,
            state_mean=torch.as_tensor(self.state_mean),
            state_std=torch.as_tensor(self.state_std),
            weights=self.model.state_dict(),
            request=request,
            training=training,
        )

    def save(self) -> Path:
        """ckpt.pt (the latest), and checkpoints/step_N.pt keeping the newest keep_checkpoints."""
        self._check_finite()  # never save a diverged model
        write_snapshot(self.run_dir.checkpoint, self.snapshot(resumable=True))
        keep = self.config.train.keep_checkpoints
        if keep:
            atomic_copy(self.run_dir.checkpoint, self.run_dir.step_checkpoint(self.step))
            for old in self.run_dir.saved_checkpoints()[:-keep]:
                old.unlink()
        return self.run_dir.checkpoint

    def restore(self, snapshot: Snapshot) -> None:
        """Put the run back exactly as it was when the checkpoint was saved."""
        state = snapshot.training
        if state is None:
            raise CheckpointError(
                f"the checkpoint of step {snapshot.step} holds a policy only (no optimizer or "
                f"sampler state), so its run cannot be resumed from it"
            )
        if (snapshot.state_dim, snapshot.act_dim) != (self.model.state_dim, self.model.act_dim):
            raise CheckpointError(
                f"checkpoint is for state/action sizes {snapshot.state_dim}/{snapshot.act_dim} "
                f"but the dataset has {self.model.state_dim}/{self.model.act_dim}"
            )
        try:
            self.model.load_state_dict(snapshot.weights)
            self.optimizer.load_state_dict(state.optimizer)
            self.scheduler.load_state_dict(state.scheduler)
            self.sampler.load_state_dict(state.sampler)
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match the model: {first_line(err)}"
            ) from None
        self.state_mean = snapshot.state_mean.numpy()
        self.state_std = snapshot.state_std.numpy()
        torch.set_rng_state(state.rng_torch)
        if state.rng_cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state.rng_cuda)
        self.step = snapshot.step
        self.pending = state.pending_sums.to(self.device)
        self.pending_count = state.pending_count
        self.results_shown = state.results_shown

    # --- the loop ----------------------------------------------------------------------------

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimiser step; returns (action loss, KSVD loss, gradient norm) as device tensors."""
        cfg = self.config.train
        with autocast(cfg.precision, self.device):
            predicted, ksvd = self.forward_model(
                batch.states, batch.actions, batch.returns_to_go, batch.timesteps, batch.mask
            )
        act_loss = action_loss(predicted, batch.actions, batch.mask)
        loss = act_loss + cfg.ksvd_weight * ksvd.float()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return act_loss.detach(), ksvd.detach().float(), grad_norm.detach()

    def run(self, progress: bool = True, stop: StopSignals | None = None) -> EvalRecord | None:
        """Train to config.train.steps; returns the final evaluation's record (None without one).

        Every eval_every steps (and at the end, with eval.final_episodes episodes) a snapshot of
        the policy goes to the evaluation process, which runs beside training; its results are
        printed as they arrive and the final one is waited for. SIGINT/SIGTERM stop the run after
        the current step with a checkpoint saved; pass `stop` to catch signals that come earlier
        (while the data loads). A run resumed at its last step only gets its final evaluation.
        """
        cfg = self.config.train
        stop = stop or StopSignals()
        with stop, ExitStack() as stack:
            self.hold()
            stack.callback(self.release)
            live = self._start(stack, progress)
            self._queue_missing_final()
            while self.step < cfg.steps:
                self.pending += torch.stack(self.train_step(self.sampler.sample(cfg.batch_size)))
                self.pending_count += 1
                self.step += 1
                live.bar.update(1)
                final = self.step == cfg.steps
                if self.step % cfg.log_every == 0 or final:
                    self._log(live)
                self._queue_due_evaluation(final)
                if self.step % cfg.ckpt_every == 0 or final or stop.signum is not None:
                    self.save()
                if stop.signum is not None:
                    raise self._interrupted(stop.signum)
            self._wait_for_evaluations(live)
        return self._final_result(live)

    def _start(self, stack: ExitStack, progress: bool) -> Live:
        """Open the run's outputs; the stack closes them (and stops the evaluation process if
        the loop fails) however the loop ends."""
        # On resume, drop every event (train/* and eval/*) logged after the checkpoint by the
        # interrupted run. Only this writer purges: TensorBoard reads a run's event files in the
        # order they were created and a purge drops the points of every file read before it, so
        # it must come from the first file the resumed run creates.
        purge = self.step + 1 if self.step else None
        writer = stack.enter_context(SummaryWriter(str(self.run_dir.path), purge_step=purge))
        if self.step == 0:
            self._write_hparams(writer)
            writer.add_custom_scalars(run_layout())
        service = None
        if evaluates(self.config) and self.config.eval.service == "process":
            options = EvalOptions(device=self.config.eval.device, workers=self.config.eval.workers)
            service = stack.enter_context(EvalService(self.run_dir, options))
        bar = stack.enter_context(
            progress_bar(self.config.train.steps, self.step, self.data.task.name, progress)
        )
        live = Live(writer, bar, service, ResultsTail(self.run_dir, self.results_shown), 0.0)
        self._say_results(live)  # of a resumed run: those its predecessor never printed
        live.tick = time.perf_counter()
        return live

    def _log(self, live: Live) -> None:
        """The mean losses since the last log to TensorBoard and the bar, and the evaluation
        results that arrived meanwhile to the terminal."""
        self._check_finite()
        now = time.perf_counter()
        act, ksvd, grad_norm = (self.pending / self.pending_count).tolist()
        scalars = {
            "train/action_loss": act,
            "train/ksvd_loss": ksvd,
            "train/loss": act + self.config.train.ksvd_weight * ksvd,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": grad_norm,
            "train/steps_per_sec": self.pending_count / (now - live.tick),
        }
        for tag, value in scalars.items():
            live.writer.add_scalar(tag, value, self.step)
        live.bar.set_postfix(action=f"{act:.4f}", ksvd=f"{ksvd:.3g}", refresh=False)
        self.pending.zero_()
        self.pending_count, live.tick = 0, now
        self._say_results(live)
        if live.service is not None:
            live.service.check(live.say)

    def _say_results(self, live: Live) -> None:
        """Print the evaluation results that arrived since the last call."""
        for record in live.results.new():
            live.say(describe(record))
        self.results_shown = live.results.shown

    def _queue_due_evaluation(self, final: bool) -> None:
        """The final evaluation at the last step; a periodic one every eval_every steps."""
        ev, every = self.config.eval, self.config.train.eval_every
        if final and ev.final_episodes:
            self._queue_evaluation(EvalRequest(ev.final_episodes, final=True))
        elif every and self.step % every == 0:
            self._queue_evaluation(EvalRequest(ev.episodes, final=False))

    def _queue_missing_final(self) -> None:
        """A run resumed at its last step, whose final evaluation never ran, queues only that
        (unless its snapshot still waits in the queue)."""
        episodes, run = self.config.eval.final_episodes, self.run_dir
        at_end = self.step >= self.config.train.steps
        if (
            at_end
            and final_missing(run, self.step, episodes)
            and not run.queued(self.step).exists()
        ):
            self._queue_evaluation(EvalRequest(episodes, final=True))

    def _queue_evaluation(self, request: EvalRequest) -> None:
        self._check_finite()  # never evaluate a diverged model
        queue_snapshot(self.run_dir, self.snapshot(request))

    def _interrupted(self, signum: int) -> TrainingInterrupted:
        return TrainingInterrupted(
            f"stopped by {signal.Signals(signum).name} at step {self.step}; checkpoint saved to "
            f"{self.run_dir.checkpoint}; continue with: primal-dt train --resume {self.run_dir}",
            signum,
        )

    def _wait_for_evaluations(self, live: Live) -> None:
        live.writer.flush()
        final_episodes = self.config.eval.final_episodes
        if live.service is not None:
            if final_episodes:
                live.say(
                    f"training done; waiting for the final evaluation ({final_episodes} "
                    f"episodes per target)"
                )
            live.service.finish()
        elif evaluates(self.config) and self.config.eval.service == "external":
            live.say(
                f"training done; its evaluation snapshots wait in {self.run_dir.queue} for: "
                f"primal-dt eval --watch {self.run_dir}"
            )

    def _final_result(self, live: Live) -> EvalRecord | None:
        """Print the results not yet printed; the final evaluation's record, if there was one."""
        final = None
        for record in live.results.new():
            print(describe(record), file=sys.stderr)
            if record.step == self.step and (record.final or record.error is not None):
                final = record
        if final is not None and final.error is not None:
            raise EvaluationFailed(
                f"training finished but its final evaluation failed: {final.error}; "
                f"the checkpoint is {self.run_dir.checkpoint}, evaluate it with "
                f"primal-dt eval --ckpt {self.run_dir}"
            )
        return final if live.service is not None else None

    def _check_finite(self) -> None:
        if not torch.isfinite(self.pending).all():
            act, ksvd, grad_norm = self.pending.tolist()
            ckpt = self.run_dir.checkpoint
            kept = (
                f"the last good checkpoint, {ckpt}, is kept"
                if ckpt.exists()
                else "no checkpoint had been saved yet"
            )
            raise TrainingDiverged(
                f"training diverged before step {self.step} (action loss {act}, KSVD loss {ksvd}, "
                f"gradient norm {grad_norm}); {kept}; try a lower train.lr"
            )

    def _write_hparams(self, writer: SummaryWriter) -> None:
        """The run's settings in TensorBoard's hparams view, in this same run directory."""
        flat: dict[str, Any] = {"task": self.data.task.name}
        for section in ("model", "train", "eval"):
            for key, value in getattr(self.config, section).__dict__.items():
                flat[f"{section}.{key}"] = (
                    value if isinstance(value, int | float | str | bool) else str(value)
                )
        experiment, session_start, session_end = hparams(
            flat, {"eval/final_normalized_return": float("nan")}
        )
        for summary in (experiment, session_start, session_end):
            writer.file_writer.add_summary(summary)


def evaluates(config: Config) -> bool:
    """Whether the run evaluates at all, during training or at its end."""
    return bool(config.train.eval_every or config.eval.final_episodes)


def start_run(config: Config, task: Task, run_dir: Path, config_name: str = "default") -> Trainer:
    """A new run in run_dir, which must not already hold one; config_name names the config file
    the run came from, for reports."""
    run = RunDir(run_dir)
    if run.checkpoint.exists():
        raise CheckpointError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir} "
            f"or choose another --run-dir"
        )
    data = load_task_data(task, config.data.download)
    trainer = Trainer.create(config, data, run_dir)  # everything is checked: now write
    trainer.hold()
    if run.checkpoint.exists():  # another train got here first
        trainer.release()
        raise CheckpointError(f"{run_dir} already holds a run; choose another --run-dir")
    write_run_config(run, RunConfig(task.name, config_name, config))
    return trainer


def resume_run(path: Path, steps: int | None = None, download: bool | None = None) -> Trainer:
    """Continue the run in `path` (a run directory or its ckpt.pt) from its checkpoint, to its
    configured or to `steps` steps, or only to its final evaluation where that is what is left."""
    run = run_of(path)
    holder = RunLock(run, "train").holder()
    if holder is not None:  # also before its first checkpoint, when nothing else says it is a run
        raise RunLock(run, "train").busy(holder)
    snapshot = read_snapshot(run.path)
    config = snapshot.config
    if steps is not None:
        config.train.steps = steps
    if download is not None:
        config.data.download = download
    # Refused before anything is loaded or written: a run at its end with its final evaluation.
    at_end = snapshot.step >= config.train.steps
    if at_end and not final_missing(run, snapshot.step, config.eval.final_episodes):
        raise ConfigError(
            f"{run} is already at step {snapshot.step} of {config.train.steps}; "
            f"pass --steps N with N > {snapshot.step} to train further"
        )
    record = snapshot.task
    task = Task(record.name, record.dataset_ids, env_for_gym_id(record.env_id))
    data = load_task_data(task, config.data.download)
    if data.env_id != record.env_id:
        raise CheckpointError(
            f"{run} was trained on {record.env_id} but its dataset is now for {data.env_id}"
        )
    trainer = Trainer.create(config, data, run.path)
    trainer.restore(snapshot)
    trainer.hold()
    # The steps after the checkpoint are trained again, and evaluated again with them.
    drop_results_after(run, trainer.step)
    for queued in run.queued_snapshots():
        if step_of(queued) > trainer.step:
            queued.unlink()
    return trainer
