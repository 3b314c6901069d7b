"""The training loop: AdamW with linear warm-up and gradient clipping, on the action MSE plus
eta times the KSVD loss, with TensorBoard logs, resumable checkpoints, and evaluation handed to a
separate process (eval_service) so the loop never waits for rollouts.

The dataset lives on the training device and batches are sampled there; the loop reads values
back to the host only at logging, evaluation and checkpoint steps. On CUDA it runs under bf16
autocast with fused AdamW.
"""

from __future__ import annotations

import json
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams
from tqdm.auto import tqdm

from primal_dt.checkpoint import (
    CHECKPOINT_NAME,
    copy_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from primal_dt.config import Config, config_from_dict
from primal_dt.data import Batch, TaskData, WindowSampler, load_task_data
from primal_dt.errors import CheckpointError, ConfigError, PrimalDTError, first_line
from primal_dt.eval_service import (
    EvalOptions,
    EvalService,
    ResultsTail,
    describe,
    drop_results_after,
    queue_snapshot,
)
from primal_dt.evaluate import EnvSetup, Policy, TargetResult, evaluate
from primal_dt.model import DecisionTransformer
from primal_dt.tasks import Task, env_for_gym_id


class TrainingDiverged(PrimalDTError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(PrimalDTError):
    """SIGINT or SIGTERM stopped the run after saving a checkpoint."""

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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"train.device is {name} but no CUDA device is available; use cpu or auto"
        )
    return torch.device(name)


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
class Trainer:
    """One run: the model, its optimiser and data, and where it writes."""

    config: Config
    data: TaskData
    run_dir: Path
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
    # The module the training step calls: the model, or its torch.compile'd wrapper (which
    # shares its parameters; checkpoints always save the plain model's state_dict).
    forward_model: torch.nn.Module | None = None

    def __post_init__(self) -> None:
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
        device = resolve_device(config.train.device)
        seed_everything(config.train.seed)
        state_mean, state_std = data.state_stats()
        longest = max(len(ep.rewards) for ep in data.episodes)
        model = DecisionTransformer(
            config.model, data.state_dim, data.act_dim, max(data.max_episode_steps, longest)
        ).to(device)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config.train.lr,
            weight_decay=config.train.weight_decay,
            fused=device.type == "cuda",
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
            config,
            data,
            run_dir,
            device,
            model,
            optimizer,
            scheduler,
            sampler,
            state_mean,
            state_std,
        )

    # --- checkpoints -------------------------------------------------------------------------

    def task_record(self) -> dict[str, Any]:
        ref = self.data.reference
        return {
            "name": self.data.task.name,
            "dataset_ids": list(self.data.task.dataset_ids),
            "env_id": self.data.env_id,
            "env_kwargs": self.data.env_kwargs,
            "max_episode_steps": self.data.max_episode_steps,
            "eval_targets": list(self.eval_targets()),
            "reference": None
            if ref is None
            else {"random": ref.random, "expert": ref.expert, "source": ref.source},
        }

    def policy_payload(self) -> dict[str, Any]:
        """What evaluating the policy needs: weights, config, statistics and task."""
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "task": self.task_record(),
            "dims": {
                "state_dim": self.model.state_dim,
                "act_dim": self.model.act_dim,
                "max_timestep": self.model.max_timestep,
            },
            "state_mean": torch.as_tensor(self.state_mean),
            "state_std": torch.as_tensor(self.state_std),
            "model": self.model.state_dict(),
        }

    def payload(self) -> dict[str, Any]:
        """policy_payload and everything resuming needs besides."""
        return {
            **self.policy_payload(),
            "pending_log": {"sums": self.pending.cpu(), "count": self.pending_count},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def save(self) -> Path:
        """ckpt.pt (the latest), and checkpoints/step_N.pt keeping the newest keep_checkpoints."""
        path = self.run_dir / CHECKPOINT_NAME
        save_checkpoint(path, self.payload())
        keep = self.config.train.keep_checkpoints
        if keep:
            folder = self.run_dir / "checkpoints"
            folder.mkdir(exist_ok=True)
            copy_checkpoint(path, folder / f"step_{self.step:08d}.pt")
            for old in sorted(folder.glob("step_*.pt"))[:-keep]:
                old.unlink()
        return path

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Put the run back exactly as it was when ckpt was saved."""
        dims = ckpt["dims"]
        if (dims["state_dim"], dims["act_dim"]) != (self.model.state_dim, self.model.act_dim):
            raise CheckpointError(
                f"checkpoint is for state/action sizes {dims['state_dim']}/{dims['act_dim']} but "
                f"the dataset has {self.model.state_dim}/{self.model.act_dim}"
            )
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            self.sampler.load_state_dict(ckpt["sampler"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match the model: {first_line(err)}"
            ) from None
        self.state_mean = ckpt["state_mean"].numpy()
        self.state_std = ckpt["state_std"].numpy()
        torch.set_rng_state(ckpt["rng"]["torch"])
        if ckpt["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        self.step = int(ckpt["step"])
        if "pending_log" in ckpt:
            self.pending = ckpt["pending_log"]["sums"].to(self.device)
            self.pending_count = int(ckpt["pending_log"]["count"])

    # --- evaluation --------------------------------------------------------------------------

    def eval_targets(self) -> tuple[float, ...]:
        return tuple(self.config.eval.targets) or self.data.eval_targets

    def env_setup(self) -> EnvSetup:
        return EnvSetup(
            env_id=self.data.env_id,
            env_kwargs=self.data.env_kwargs,
            max_episode_steps=self.data.max_episode_steps,
            eval_targets=self.eval_targets(),
            reference=self.data.reference,
        )

    def evaluate(self) -> list[TargetResult]:
        """Evaluate the current model here and now (the run itself hands this to eval_service)."""
        policy = Policy(
            self.model,
            torch.as_tensor(self.state_mean, device=self.device),
            torch.as_tensor(self.state_std, device=self.device),
            self.config.train.return_scale,
            self.device,
        )
        cfg = self.config.eval
        return evaluate(
            policy, self.env_setup(), cfg.episodes, self.config.train.seed, workers=cfg.workers
        )

    def eval_options(self) -> EvalOptions:
        return EvalOptions(
            device=self.config.eval.device,
            workers=self.config.eval.workers,
            purge_after=self.step or None,
        )

    # --- the loop ----------------------------------------------------------------------------

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimiser step; returns (action loss, KSVD loss, gradient norm) as device tensors."""
        cfg = self.config.train
        autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
        )
        with autocast:
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

    def run(self, progress: bool = True, stop: StopSignals | None = None) -> dict[str, Any] | None:
        """Train to config.train.steps; returns the final evaluation's record (None without one).

        Every eval_every steps (and at the end, with eval.final_episodes episodes) a snapshot of
        the policy goes to the evaluation process, which runs beside training; its results are
        printed as they arrive and the final one is waited for. SIGINT/SIGTERM stop the run after
        the current step with a checkpoint saved; pass `stop` to catch signals that come earlier
        (while the data loads).
        """
        cfg, eval_cfg = self.config.train, self.config.eval
        # On resume, drop any events logged after the checkpoint by the interrupted process.
        writer = SummaryWriter(str(self.run_dir), purge_step=self.step + 1 if self.step else None)
        if self.step == 0:
            self._write_hparams(writer)
        evaluating = bool(cfg.eval_every or eval_cfg.final_episodes)
        service = None
        if evaluating and eval_cfg.service == "process":
            service = EvalService(self.run_dir, self.eval_options())
            service.start()
        results = ResultsTail(self.run_dir)
        tick = time.perf_counter()
        bar = tqdm(
            total=cfg.steps, initial=self.step, disable=not progress, desc=self.data.task.name,
            unit="step", dynamic_ncols=True,
        )  # fmt: skip
        stop = stop or StopSignals()
        finished = False

        def say(line: str) -> None:  # progress lines go to stderr, above the bar
            bar.write(line, file=sys.stderr)

        with stop:
            try:
                while self.step < cfg.steps:
                    batch = self.sampler.sample(cfg.batch_size)
                    self.pending += torch.stack(self.train_step(batch))
                    self.pending_count += 1
                    self.step += 1
                    bar.update(1)
                    final = self.step == cfg.steps
                    if self.step % cfg.log_every == 0 or final:
                        self._check_finite()
                        now = time.perf_counter()
                        rate = self.pending_count / (now - tick)
                        self._log_train(writer, self.pending / self.pending_count, rate, bar)
                        self.pending.zero_()
                        self.pending_count, tick = 0, now
                        for record in results.new():
                            say(describe(record))
                        if service is not None:
                            service.check(say)
                    if final and eval_cfg.final_episodes:
                        self._check_finite()
                        queue_snapshot(
                            self.run_dir, self.policy_payload(), eval_cfg.final_episodes, True
                        )
                    elif cfg.eval_every and self.step % cfg.eval_every == 0:
                        self._check_finite()  # never evaluate a diverged model
                        queue_snapshot(
                            self.run_dir, self.policy_payload(), eval_cfg.episodes, False
                        )
                    if self.step % cfg.ckpt_every == 0 or final or stop.signum is not None:
                        self._check_finite()  # never save a diverged model
                        self.save()
                    if stop.signum is not None:
                        name = signal.Signals(stop.signum).name
                        raise TrainingInterrupted(
                            f"stopped by {name} at step {self.step}; checkpoint saved to "
                            f"{self.run_dir / CHECKPOINT_NAME}; continue with: "
                            f"primal-dt train --resume {self.run_dir}",
                            stop.signum,
                        )
                writer.flush()
                if service is not None:
                    if eval_cfg.final_episodes:
                        say(
                            f"training done; waiting for the final evaluation "
                            f"({eval_cfg.final_episodes} episodes per target)"
                        )
                    service.finish()
                elif evaluating and eval_cfg.service == "external":
                    say(
                        f"training done; its evaluation snapshots wait in {self.run_dir}/eval_queue "
                        f"for: primal-dt eval --watch {self.run_dir}"
                    )
                finished = True
            finally:
                if service is not None and not finished:
                    service.stop()
                bar.close()
                writer.close()
        final_record = None
        for record in results.new():
            print(describe(record), file=sys.stderr)
            if record["step"] == self.step and (record.get("final") or "error" in record):
                final_record = record
        if final_record is not None and "error" in final_record:
            raise EvaluationFailed(
                f"training finished but its final evaluation failed: {final_record['error']}; "
                f"the checkpoint is {self.run_dir / CHECKPOINT_NAME}, evaluate it with "
                f"primal-dt eval --ckpt {self.run_dir}"
            )
        return final_record if service is not None else None

    def _check_finite(self) -> None:
        if not torch.isfinite(self.pending).all():
            act, ksvd, grad_norm = self.pending.tolist()
            ckpt = self.run_dir / CHECKPOINT_NAME
            kept = (
                f"the last good checkpoint, {ckpt}, is kept"
                if ckpt.exists()
                else "no checkpoint had been saved yet"
            )
            raise TrainingDiverged(
                f"training diverged before step {self.step} (action loss {act}, KSVD loss {ksvd}, "
                f"gradient norm {grad_norm}); {kept}; try a lower train.lr"
            )

    def _log_train(
        self, writer: SummaryWriter, means: torch.Tensor, steps_per_sec: float, bar: tqdm
    ) -> None:
        act, ksvd, grad_norm = means.tolist()
        total = act + self.config.train.ksvd_weight * ksvd
        scalars = {
            "train/action_loss": act,
            "train/ksvd_loss": ksvd,
            "train/loss": total,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": grad_norm,
            "train/steps_per_sec": steps_per_sec,
        }
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, self.step)
        bar.set_postfix(action=f"{act:.4f}", ksvd=f"{ksvd:.3g}", refresh=False)

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


def start_run(config: Config, task: Task, run_dir: Path) -> Trainer:
    """A new run in run_dir, which must not already hold one."""
    if (run_dir / CHECKPOINT_NAME).exists():
        raise CheckpointError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir} "
            f"or choose another --run-dir"
        )
    data = load_task_data(task, config.data.download)
    trainer = Trainer.create(config, data, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(
        json.dumps({"task": task.name, **config.to_dict()}, indent=2)
    )
    return trainer


def resume_run(run_dir: Path, steps: int | None = None, download: bool | None = None) -> Trainer:
    """Continue the run in run_dir from its checkpoint, to its configured or to `steps` steps."""
    ckpt = load_checkpoint(run_dir)
    config = config_from_dict(ckpt["config"])
    if steps is not None:
        config.train.steps = steps
    if download is not None:
        config.data.download = download
    record = ckpt["task"]
    task = Task(
        name=record["name"],
        dataset_ids=tuple(record["dataset_ids"]),
        env=env_for_gym_id(record["env_id"]),
    )
    data = load_task_data(task, config.data.download)
    if data.env_id != record["env_id"]:
        raise CheckpointError(
            f"{run_dir} was trained on {record['env_id']} but its dataset is now for {data.env_id}"
        )
    trainer = Trainer.create(config, data, run_dir)
    trainer.restore(ckpt)
    drop_results_after(run_dir, trainer.step)
    if trainer.step >= config.train.steps:
        raise ConfigError(
            f"{run_dir} is already at step {trainer.step} of {config.train.steps}; "
            f"pass --steps N with N > {trainer.step} to train further"
        )
    return trainer
