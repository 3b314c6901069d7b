"""Recording evaluations of a run: the CheckpointEvaluator, and the processes that drive it from the
run's file queue.

The CheckpointEvaluator evaluates a snapshot (plan_evaluation decides how), appends the result to
RUN_DIR/eval.jsonl, logs its scalars (and videos, and the attention spectrum) to TensorBoard in
the same run at the snapshot's step, and keeps the best policy as best.pt; a snapshot that cannot
be evaluated gives an error record instead. What it could not log goes to its `log`.

Snapshots wait in RUN_DIR/eval_queue/step_N.pt until evaluated, then are deleted: `serve` is the
process beside training (evaluators.BackgroundEvaluator starts it), `watch` is `primal-dt eval
--watch RUN_DIR` on a machine sharing the directory. Because the queue is files, nothing is lost
when an evaluator stops: the next one carries on.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from primal_dt.common.cpu import evaluation_threads, yield_cpu
from primal_dt.common.device import resolve_device
from primal_dt.common.errors import PrimalDTError, first_line
from primal_dt.evaluation.rollout import (
    EvalOptions,
    add_videos,
    evaluation_record,
    load_policy,
    plan_evaluation,
)
from primal_dt.evaluation.video import gif_summary, read_frames, video_target_and_seed
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.dashboards import (
    evaluation_writer,
    log_evaluation,
    log_spectrum,
    log_summary,
)
from primal_dt.store.locks import RunLock
from primal_dt.store.results import (
    EvalResult,
    append_result,
    describe,
    read_results,
    target_score,
)
from primal_dt.store.rundir import RunDir, step_of
from primal_dt.store.snapshots import Snapshot, read_snapshot, write_snapshot

PR_SET_PDEATHSIG = 1  # prctl(2)


def queue_snapshot(run: RunDir, snapshot: Snapshot) -> Path:
    """Hand a policy (with its EvalRequest) to the evaluator: an atomic write into the queue."""
    path = run.queued(snapshot.step)
    write_snapshot(path, snapshot)
    return path


class CheckpointEvaluator:
    """Evaluates the checkpoints of one run directory and records what it finds: eval.jsonl,
    TensorBoard scalars and spectrum images at each checkpoint's step, and best.pt. A context
    manager: leaving it closes its TensorBoard writer."""

    def __init__(
        self,
        run: RunDir,
        options: EvalOptions,
        device: torch.device,
        log: Callable[[str], None] = print,
    ) -> None:
        self.run, self.options, self.device, self.log = run, options, device, log
        self._writer: Any = None
        scores = [score for r in read_results(run) if (score := target_score(r)) is not None]
        self._best = max(scores, default=-math.inf)

    def __enter__(self) -> CheckpointEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def evaluate_file(self, path: Path, name: str | None = None) -> EvalResult:
        """Evaluate one snapshot file (read once); the result calls it `name` (default: its path)."""
        name = name or str(path)
        try:
            snapshot = read_snapshot(path, map_location=self.device)
        except Exception as err:  # a bad snapshot must never stop the evaluator
            return self.failed(step_of(path), name, err)
        return self.evaluate_snapshot(snapshot, name)

    def evaluate_snapshot(self, snapshot: Snapshot, name: str) -> EvalResult:
        """Evaluate a snapshot as plan_evaluation resolves it (one model), record the result or
        the failure, and return the result."""
        try:
            policy = load_policy(snapshot, self.device, f"snapshot of step {snapshot.step}")
            plan = plan_evaluation(snapshot, self.options)
            record = evaluation_record(snapshot, policy, plan, name)
            if plan.videos:
                add_videos(record, snapshot, policy, plan, self.run.videos)
        except Exception as err:  # a bad snapshot must never stop the evaluator
            return self.failed(snapshot.step, name, err)
        return self.keep(snapshot, policy.model, record)

    def keep(
        self, snapshot: Snapshot, model: DecisionTransformer, record: EvalResult
    ) -> EvalResult:
        """Record an evaluation of the snapshot (whose model it loaded): best.pt where it is the
        best so far, TensorBoard's scalars, videos and spectrum, and eval.jsonl."""
        assert record.score is not None
        if record.score > self._best:
            self._best = record.score
            write_snapshot(self.run.best, snapshot)
            record.best = True
        self._log_scalars(record)
        self._log_videos(record)
        self._log_spectrum(snapshot, model)
        append_result(self.run, record)
        return record

    def failed(self, step: int, name: str, err: Exception) -> EvalResult:
        """Record why the snapshot of `step` could not be evaluated."""
        record = EvalResult(step, name, error=f"{type(err).__name__}: {first_line(err)}")
        append_result(self.run, record)
        return record

    def _log_spectrum(self, snapshot: Snapshot, model: DecisionTransformer) -> None:
        """The snapshot's attention spectrum as TensorBoard images (spectrum.py). Optional: when
        it cannot be computed (no matplotlib, dataset not on this machine) only it is missing."""
        from primal_dt.evaluation.spectrum import spectrum_images

        try:
            log_spectrum(self._writer, snapshot.step, spectrum_images(self.run, snapshot, model))
        except Exception as err:
            reason = f"{type(err).__name__}: {first_line(err)}"
            self.log(f"step {snapshot.step}: attention spectrum not logged: {reason}")
        self._writer.flush()

    def _log_videos(self, record: EvalResult) -> None:
        """Each video as an animated GIF in TensorBoard (IMAGES tab), at a quarter of the frames
        and a quarter of the width and height, so the event file stays small."""
        for video in record.videos:
            try:
                frames, fps = read_frames(Path(video), every=4)
                target, seed = video_target_and_seed(Path(video).name)
                small = [frame[::4, ::4] for frame in frames]
                summary = gif_summary(f"video/target_{target}/seed_{seed}", small, fps)
            except Exception as err:  # the MP4 file is what was asked for; this is extra
                self.log(f"step {record.step}: {video} not put into TensorBoard: {first_line(err)}")
                continue
            log_summary(self._writer, summary, record.step)
        self._writer.flush()

    def _log_scalars(self, record: EvalResult) -> None:
        if self._writer is None:
            self._writer = evaluation_writer(self.run.path)
        log_evaluation(self._writer, record)

    def evaluate_queue(self) -> list[EvalResult]:
        """Evaluate and remove every queued snapshot, in step order."""
        records = []
        for path in self.run.queued_snapshots():
            records.append(self.evaluate_file(path, name=str(self.run)))
            path.unlink(missing_ok=True)  # only now: a stopped evaluator leaves it for the next
        return records

    def evaluate_new_checkpoints(self) -> list[EvalResult]:
        """Evaluate saved checkpoints (checkpoints/step_N.pt) whose step has no result yet."""
        saved = self.run.saved_checkpoints()
        # A trainer queues a snapshot before it saves the checkpoint of the same step, so listing
        # the queue after the checkpoints sees every step that the queue will evaluate anyway.
        skip = {step_of(p) for p in self.run.queued_snapshots()}
        skip |= {r.step for r in read_results(self.run)}
        fresh = [p for p in saved if step_of(p) not in skip]
        return [
            self.evaluate_file(path) for path in fresh if path.exists()
        ]  # rotated out meanwhile


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's PR_SET_PDEATHSIG; elsewhere
    the serving loop's parent check remains), and exit now if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def start_serving(parent: int, options: EvalOptions) -> torch.device:
    """What an evaluation process beside training does first (serve's, and a pack's): leave
    Ctrl-C to the trainer, die with it, take the lowest priority and, on a CPU, one thread;
    returns the device it evaluates on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)
    yield_cpu()
    device = resolve_device(options.device, "eval.device")
    evaluation_threads(device.type)
    return device


def serve(
    run_dir: str,
    options: EvalOptions,
    finish: Any,
    parent: int,
    notes: Any,
    poll_seconds: float = 0.5,
) -> None:
    """The evaluation process beside training: evaluate queued snapshots until the trainer sets
    `finish`, then empty the queue and exit. Ctrl-C is left to the trainer, which stops us; if the
    trainer dies without a word (SIGKILL), so do we, at once (die_with_parent), so that no orphan
    appends a result to a run that a new trainer has since resumed. We run at the lowest priority
    (cpu.py), and on a CPU with one thread: training's cores and its thread count stay its own.
    Our notes (a spectrum or video not logged) go to the trainer through `notes`, a queue."""
    device = start_serving(parent, options)
    with CheckpointEvaluator(RunDir(Path(run_dir)), options, device, notes.put) as ev:
        serve_until(finish, parent, lambda finishing: ev.evaluate_queue(), poll_seconds)


def serve_until(
    finish: Any, parent: int, evaluate: Callable[[bool], object], poll_seconds: float
) -> None:
    """The serving loop of serve and serve_pack: evaluate(finishing) what is queued, then wait,
    until the trainer sets `finish` (one more round after it, so nothing queued is left) or
    its process is gone."""
    while os.getppid() == parent:
        finishing = finish.is_set()
        evaluate(finishing)
        if finishing:
            return
        finish.wait(poll_seconds)


def watch(
    run_dir: Path,
    options: EvalOptions,
    device: torch.device,
    poll_seconds: float = 2.0,
    stop: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = print,
) -> None:
    """`primal-dt eval --watch`: evaluate queued snapshots and newly saved checkpoints as they
    appear, until interrupted (or until stop() says so)."""
    run = RunDir(run_dir)
    if not any(path.exists() for path in (run.config_file, run.checkpoint, run.queue)):
        raise PrimalDTError(
            f"--watch: {run_dir} is not a primal-dt run directory (it has no "
            f"{run.config_file.name}, {run.checkpoint.name} or {run.queue.name}); give the run "
            f"directory that train prints"
        )
    lock = RunLock(RunDir(run_dir), "eval").acquire()  # one evaluator per run
    evaluation_threads(device.type)
    log(f"watching {run_dir} for checkpoints (Ctrl-C stops)")
    try:
        with CheckpointEvaluator(RunDir(run_dir), options, device, log) as evaluator:
            while not stop():
                records = evaluator.evaluate_queue() + evaluator.evaluate_new_checkpoints()
                for record in records:
                    log(describe(record))
                if not records:
                    time.sleep(poll_seconds)
    finally:
        lock.release()
