"""The training loop: AdamW with linear warm-up and gradient clipping, on the action MSE plus
eta times the KSVD loss, with TensorBoard logs and resumable checkpoints. Evaluation is the
evaluator's (evaluation/evaluators.py): the loop hands it a snapshot every train.eval_every steps
and says what it reports.

The dataset lives on the training device and batches are sampled there; the loop reads values
back to the host only at logging, evaluation and checkpoint steps. Matrix products run in bf16
under autocast where the device multiplies bf16 in hardware (train.precision "auto", resolved
once per run: device.py), and AdamW is fused wherever torch has it.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from primal_dt.common.config import Config
from primal_dt.common.device import as_precision, autocast
from primal_dt.common.errors import CheckpointError, PrimalDTError, first_line
from primal_dt.common.progress import Progress, progress_bar
from primal_dt.common.signals import StopSignals
from primal_dt.data.episodes import Batch, TaskData, WindowSampler
from primal_dt.evaluation.evaluators import RunEvaluator
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.atomic import atomic_copy
from primal_dt.store.dashboards import copy_run, log_training, training_writer
from primal_dt.store.locks import RunLock
from primal_dt.store.results import EvalResult
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import (
    EvalRequest,
    Snapshot,
    TaskInfo,
    TrainingState,
    write_snapshot,
)
from primal_dt.store.training_log import Session, begin_session, log_point
from primal_dt.training.compiling import (
    compile_cache,
    damaged_files,
    damaged_note,
    repair,
    still_damaged,
)
from primal_dt.training.memory import out_of_memory_named
from primal_dt.training.step import WholeStep, action_loss, advance_schedule

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

Metrics = dict[str, torch.Tensor]  # named scalars of one step, on the training device


class TrainingDiverged(PrimalDTError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(PrimalDTError):
    """SIGINT or SIGTERM stopped the run after saving a checkpoint."""

    prefix = "stopped"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class EvaluationFailed(PrimalDTError):
    """Training finished but its final evaluation did not."""

    exit_code = 1


@dataclass
class Trainer:
    """One run: the model, its optimiser, data and evaluator, and where it writes."""

    config: Config
    data: TaskData
    run_dir: RunDir
    device: torch.device
    model: DecisionTransformer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: WindowSampler
    evaluator: RunEvaluator
    state_mean: np.ndarray
    state_std: np.ndarray
    step: int = 0
    # Sums of each step's metrics (train_step) since the last log, and their count: saved in
    # checkpoints so a run stopped between two logs logs the same averages after resuming.
    pending: Metrics = field(default_factory=dict)
    pending_count: int = 0
    # train.compile: the whole step compiled (step.py), built at the first step (after a resume
    # has restored the optimiser whose state it updates).
    whole_step: WholeStep | None = None
    # Where the run trains in a pack (training/pack.py), what brings its weights, optimiser,
    # scheduler and random state up to date before they are logged, evaluated or saved.
    sync: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.locks = [RunLock(self.run_dir, "train"), *self.evaluator.locks]
        self.on_cuda = self.device.type == "cuda"
        self.notes: list[str] = []  # to say when training starts
        # The first compiled step compiles or loads the kernels (first_compiled_step).
        self.compile_pending = self.config.train.compile
        self.say: Callable[[str], None] = partial(print, file=sys.stderr)  # begin() sets it
        self.tick = time.perf_counter()  # when the last log was (begin() sets it)
        self.session = Session(time.time(), self.step)  # (_open_writer's)

    def hold(self) -> None:
        """Take the run directory's locks (see RunLock): a second writer is refused, and then
        none of them is kept."""
        try:
            for lock in self.locks:
                lock.acquire()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for lock in self.locks:
            lock.release()

    def snapshot(self, request: EvalRequest | None = None, resumable: bool = False) -> Snapshot:
        """The policy as it is now; resumable adds what continuing the run needs."""
        if self.sync is not None:
            self.sync()
        training = None
        if resumable:
            training = TrainingState(
                optimizer=self.optimizer.state_dict(),
                scheduler=self.scheduler.state_dict(),
                sampler=self.sampler.state_dict(),
                rng_torch=torch.get_rng_state(),
                rng_cuda=[torch.cuda.get_rng_state(self.device)] if self.on_cuda else [],
                pending_sums={name: value.cpu() for name, value in self.pending.items()},
                pending_count=self.pending_count,
                results_shown=self.evaluator.shown,
            )
        return Snapshot(
            step=self.step,
            config=self.config,
            task=TaskInfo.of(self.data),
            state_dim=self.model.state_dim,
            act_dim=self.model.act_dim,
            max_timestep=self.model.max_timestep,
            state_mean=torch.as_tensor(self.state_mean),
            state_std=torch.as_tensor(self.state_std),
            weights=self.model.state_dict(),
            request=request,
            training=training,
        )

    def save(self) -> None:
        """ckpt.pt (the latest), and checkpoints/step_N.pt keeping the newest keep_checkpoints."""
        self._check_finite()  # never save a diverged model
        write_snapshot(self.run_dir.checkpoint, self.snapshot(resumable=True))
        keep = self.config.train.keep_checkpoints
        if keep:
            atomic_copy(self.run_dir.checkpoint, self.run_dir.step_checkpoint(self.step))
            for old in self.run_dir.saved_checkpoints()[:-keep]:
                old.unlink()

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
            exact = self.sampler.load_state_dict(state.sampler, snapshot.step)
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match the model: {first_line(err)}"
            ) from None
        self.state_mean = snapshot.state_mean.numpy()
        self.state_std = snapshot.state_std.numpy()
        torch.set_rng_state(state.rng_torch)
        if self.on_cuda and exact and state.rng_cuda:
            # One state: the training device's. Older checkpoints kept one per visible GPU.
            index = self.device.index or 0 if len(state.rng_cuda) > 1 else 0
            torch.cuda.set_rng_state(state.rng_cuda[index], self.device)
        if not exact:
            self.notes.append(
                f"resumed on {self.device.type} from a checkpoint saved on another device type: "
                f"training goes on, but cannot end bit-identical to an uninterrupted run"
            )
        self.step = snapshot.step
        self.pending = {name: value.to(self.device) for name, value in state.pending_sums.items()}
        self.pending_count = state.pending_count
        self.evaluator.resume(state.results_shown)

    def train_step(self, batch: Batch) -> Metrics:
        """One optimiser step; returns its metrics as device tensors (what `train/*` logs). The
        auxiliary loss (model.py) is logged under the model's aux_loss_name (train/ksvd_loss, for
        Primal's KSVD loss). With train.compile, the whole step is one compiled graph (step.py),
        which computes what the eager step below computes."""
        if self.compile_pending:
            return self.first_compiled_step(batch)
        cfg = self.config.train
        self.model.redraw(self.step)  # random features and hashes: a function of the step
        if self.whole_step is not None:
            return self.whole_step(batch)
        with autocast(as_precision(cfg.precision), self.device):
            predicted, aux = self.model(
                batch.states, batch.actions, batch.returns_to_go, batch.timesteps, batch.mask
            )
        act_loss = action_loss(predicted, batch.actions, batch.mask)
        loss = act_loss + cfg.aux_weight * aux.float()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {
            "action_loss": act_loss.detach(),
            self.model.aux_loss_name: aux.detach().float(),
            "grad_norm": grad_norm.detach(),
        }

    def _compiled_sync(self) -> None:
        """The scheduler and the optimiser's step counts where the compiled steps left the run
        (they update the weights and the optimiser's moments in place, and count the steps on
        the device)."""
        advance_schedule(self.scheduler, self.step)
        if self.whole_step is not None:
            self.whole_step.sync()

    def first_compiled_step(self, batch: Batch) -> Metrics:
        """The first step of a compiled model, where its kernels are compiled or loaded from the
        compile cache; where a cached kernel cannot be loaded, the cache is repaired and the step
        compiled and run once more, from the same random state (compiling.py)."""
        cache = compile_cache()
        rng = torch.get_rng_state()
        rng_cuda = torch.cuda.get_rng_state(self.device) if self.on_cuda else None
        self.compile_pending = False
        self.whole_step = WholeStep(self.model, self.optimizer, self.config, self.device)
        if self.sync is None:
            self.sync = self._compiled_sync
        try:
            return self.train_step(batch)
        except Exception as err:  # only a damaged cache is handled; the rest is raised
            damaged = damaged_files(err, cache)
            if not damaged:
                raise
            self.say(damaged_note(damaged, cache))
            repair(cache)
        torch.set_rng_state(rng)  # the failed attempt stepped neither optimiser nor scheduler
        if rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda, self.device)
        self.whole_step = WholeStep(self.model, self.optimizer, self.config, self.device)
        try:
            return self.train_step(batch)
        except Exception as err:
            if damaged_files(err, cache):
                raise still_damaged(cache, err) from None
            raise

    def train(self, progress: bool = True, stop: StopSignals | None = None) -> EvalResult | None:
        """Train to config.train.steps; returns the final evaluation's record (None without one).

        Every eval_every steps (and at the end, with eval.final_episodes episodes) a snapshot of
        the policy goes to the evaluator; what it reports is printed at each log, and the final
        evaluation is waited for. SIGINT/SIGTERM stop the run after the current step with a
        checkpoint saved; pass `stop` to catch signals that come earlier (while the data loads).
        A run resumed at its last step only gets its final evaluation.
        """
        cfg = self.config.train
        stop = stop or StopSignals()
        first = self.step
        with (
            self.undone_unless_saved(first),
            out_of_memory_named(self.config),
            stop,
            ExitStack() as stack,
        ):
            bar = progress_bar(cfg.steps, self.step, self.data.task.name, progress)
            stack.enter_context(bar)  # returns the bar itself, typed as the join of its two kinds
            writer = self.begin(stack, partial(bar.write, file=sys.stderr))  # lines above the bar
            while self.step < cfg.steps:
                self.accumulate(self.train_step(self.sampler.sample(cfg.batch_size)))
                self.step += 1
                bar.update(1)
                self.after_step(writer, bar, stop)
                if stop.signum is not None:
                    raise self._interrupted(stop.signum)
            final = self.end(writer, first)
        self.copy_to_task_charts()
        return self._final(final)

    def copy_to_task_charts(self) -> None:
        """A finished run's returns and auxiliary loss copied where its task's charts find them
        (dashboards.py), once its writers, the evaluator's included, are closed."""
        copy_run(self.run_dir.path, self.data.task.name)

    @contextmanager
    def undone_unless_saved(self, first: int) -> Iterator[None]:
        """A new run (first == 0) that fails before its first checkpoint leaves nothing behind:
        what its start wrote is removed once its writers are closed (RunDir.clear_start)."""
        try:
            yield
        except BaseException:
            if first == 0 and self.run_dir.unsaved_start:
                self.run_dir.clear_start()
            raise

    def begin(self, stack: ExitStack, say: Callable[[str], None]) -> SummaryWriter:
        """What a run does before its first step: take its locks, open TensorBoard and the
        evaluator (the stack closes them however training ends), say its notes and the results a
        resumed run never printed, and give a run resumed at its last step its final evaluation.
        Lines go to `say`."""
        self.hold()
        stack.callback(self.release)
        writer = self._open_writer(stack)
        self.say = say
        for note in self.notes:
            say(note)
        stack.enter_context(self.evaluator)
        self.evaluator.collect(say)  # a resumed run's results never printed before
        if self.step >= self.config.train.steps and self.evaluator.needs_final(
            self.step, self.config.eval.final_episodes
        ):
            self._evaluate(final=True)
        self.tick = time.perf_counter()
        return writer

    def after_step(self, writer: SummaryWriter, bar: Progress | None, stop: StopSignals) -> None:
        """What follows a step (self.step counts it already): the log, the evaluation and the
        checkpoint that fall on it, and a checkpoint where a stop was asked for."""
        cfg = self.config.train
        last = self.step == cfg.steps
        if self.step % cfg.log_every == 0 or last:
            if self.sync is not None:
                self.sync()  # the learning rate it logs
            self.tick = self._log(writer, bar, self.tick)
            self.evaluator.collect(self.say)
        if last and self.config.eval.final_episodes:
            self._evaluate(final=True)
        elif cfg.eval_every and self.step % cfg.eval_every == 0:
            self._evaluate(final=False)
        if self.step % cfg.ckpt_every == 0 or last or stop.signum is not None:
            self.save()

    def end(self, writer: SummaryWriter, first: int) -> EvalResult | None:
        """After the last step (first: the step this start began at): wait for the evaluations
        and return the final one's record (None without one)."""
        writer.flush()
        shown = self.evaluator.shown
        final = self.evaluator.finish(self.say, self.step)
        # What it printed since the last save counts too (a run that only evaluated here
        # leaves its checkpoint as it was).
        if self.evaluator.shown != shown and self.step > first:
            self.save()
        return final

    def accumulate(self, metrics: Metrics) -> None:
        """Add one step's metrics to the sums the next log averages."""
        for name, value in metrics.items():
            self.pending[name] = self.pending[name] + value if name in self.pending else value
        self.pending_count += 1

    def _open_writer(self, stack: ExitStack) -> SummaryWriter:
        """TensorBoard (dashboards.training_writer), closed by the stack; the session's start."""
        self.session = begin_session(self.run_dir, self.step)
        task, aux_name = self.data.task.name, self.model.aux_loss_name
        return stack.enter_context(
            training_writer(self.run_dir.path, self.step, task, self.config, aux_name)
        )

    def _log(self, writer: SummaryWriter, bar: Progress | None, tick: float) -> float:
        """Each metric's mean since the last log to TensorBoard, training.jsonl and the bar."""
        self._check_finite()
        now = time.perf_counter()
        names = list(self.pending)
        sums = torch.stack([self.pending[name] for name in names])
        means = dict(zip(names, (sums / self.pending_count).tolist(), strict=True))
        aux_name = self.model.aux_loss_name
        scalars = {
            **means,
            "loss": means["action_loss"] + self.config.train.aux_weight * means[aux_name],
            "lr": self.scheduler.get_last_lr()[0],
            "steps_per_sec": self.pending_count / (now - tick),
        }
        log_training(writer, self.step, scalars)
        log_point(self.run_dir, self.session, self.step, scalars)
        postfix: dict[str, str] = {"action": f"{means['action_loss']:.4f}"}
        postfix[aux_name.removesuffix("_loss")] = f"{means[aux_name]:.3g}"  # ksvd=...
        if bar is not None:
            bar.set_postfix(refresh=False, **postfix)  # type: ignore[arg-type]  # (no key is ordered_dict)
        self.pending, self.pending_count = {}, 0
        return now

    def _evaluate(self, final: bool) -> None:
        self._check_finite()  # never evaluate a diverged model
        episodes = self.config.eval.final_episodes if final else self.config.eval.episodes
        self.evaluator.submit(self.snapshot(EvalRequest(episodes, final)))

    def _interrupted(self, signum: int) -> TrainingInterrupted:
        return TrainingInterrupted(
            f"stopped by {signal.Signals(signum).name} at step {self.step}; checkpoint saved to "
            f"{self.run_dir.checkpoint}; continue with: primal-dt train --resume {self.run_dir}",
            signum,
        )

    def _final(self, final: EvalResult | None) -> EvalResult | None:
        if final is not None and final.error is not None:
            raise EvaluationFailed(
                f"training finished but its final evaluation failed: {final.error}; "
                f"the checkpoint is {self.run_dir.checkpoint}, evaluate it with "
                f"primal-dt eval --ckpt {self.run_dir}"
            )
        return final

    def _check_finite(self) -> None:
        if any(not torch.isfinite(value).all() for value in self.pending.values()):
            values = ", ".join(f"{name} {value.item()}" for name, value in self.pending.items())
            ckpt = self.run_dir.checkpoint
            kept = (
                f"the last good checkpoint, {ckpt}, is kept"
                if ckpt.exists()
                else "no checkpoint had been saved yet"
            )
            raise TrainingDiverged(
                f"training diverged before step {self.step} ({values}); {kept}; "
                f"try a lower train.lr"
            )
