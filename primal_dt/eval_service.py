"""Evaluation beside training: checkpoints are queued as files and another process evaluates them.

At each evaluation step the trainer writes a policy snapshot to RUN_DIR/eval_queue/step_N.pt and
goes straight on. An evaluation process (started by the trainer, or `primal-dt eval --watch RUN_DIR`
on a second machine sharing the directory) takes the snapshots in step order, evaluates each,
appends the result to RUN_DIR/eval.jsonl, logs its scalars to TensorBoard in the same run at the
snapshot's step, keeps the best policy as best.pt and only then deletes the snapshot. A snapshot
that cannot be evaluated gives an error line in eval.jsonl instead, and training is not disturbed.
Because the queue is files, nothing is lost when an evaluator stops: the next one carries on.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from primal_dt.cpu import yield_cpu
from primal_dt.device import resolve_device
from primal_dt.errors import PrimalDTError, first_line
from primal_dt.evaluate import EvalOptions, add_videos, evaluate_snapshot, load_policy
from primal_dt.results import EvalRecord, append_result, describe, read_results
from primal_dt.run import (
    RunDir,
    RunLock,
    Snapshot,
    atomic_copy,
    read_snapshot,
    step_of,
    write_snapshot,
)
from primal_dt.video import gif_summary, read_frames

PR_SET_PDEATHSIG = 1  # prctl(2)


def queue_snapshot(run: RunDir, snapshot: Snapshot) -> Path:
    """Hand a policy (with its EvalRequest) to the evaluator: an atomic write into the queue."""
    path = run.queued(snapshot.step)
    write_snapshot(path, snapshot)
    return path


class Evaluator:
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
        scores = [r.score for r in read_results(run) if r.score is not None]
        self._best = max(scores, default=-math.inf)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    def evaluate(self, path: Path, name: str | None = None) -> EvalRecord:
        """Evaluate one checkpoint (read once, one model), record the result or the failure, and
        return the record, in which the checkpoint is called `name` (default: its path)."""
        name = name or str(path)
        try:
            snapshot = read_snapshot(path, map_location=self.device)
            policy = load_policy(snapshot, self.device, f"checkpoint {path}")
            record = evaluate_snapshot(snapshot, policy, self.options, name)
            videos = snapshot.config.eval.video_episodes if record.final else 0
            if videos:
                options = replace(self.options, videos=videos)
                add_videos(record, snapshot, policy, options, self.run.videos)
        except Exception as err:  # a bad snapshot must never stop the service
            record = EvalRecord(
                step_of(path), name, error=f"{type(err).__name__}: {first_line(err)}"
            )
            append_result(self.run, record)
            self.log(describe(record))
            return record
        assert record.score is not None
        if record.score > self._best:
            self._best = record.score
            atomic_copy(path, self.run.best)
            record.best = True
        self._log_scalars(record)
        self._log_videos(record)
        self._log_spectrum(snapshot, policy.model)
        append_result(self.run, record)
        self.log(describe(record))
        return record

    def _log_spectrum(self, snapshot: Snapshot, model: torch.nn.Module) -> None:
        """The snapshot's attention spectrum as TensorBoard images (spectrum.py). Optional: when
        it cannot be computed (no matplotlib, dataset not on this machine) only it is missing."""
        from primal_dt.spectrum import log_spectrum

        try:
            log_spectrum(self._writer, self.run, snapshot, model)
        except Exception as err:
            reason = f"{type(err).__name__}: {first_line(err)}"
            self.log(f"step {snapshot.step}: attention spectrum not logged: {reason}")
        self._writer.flush()

    def _log_videos(self, record: EvalRecord) -> None:
        """Each video as an animated GIF in TensorBoard (IMAGES tab), at a quarter of the frames
        and a quarter of the width and height, so the event file stays small."""
        for video in record.videos:
            try:
                frames, fps = read_frames(Path(video), every=4)
                target, seed = re.search(r"target_(.+)_seed_(\d+)", Path(video).name).groups()
                small = [frame[::4, ::4] for frame in frames]
                summary = gif_summary(f"video/target_{target}/seed_{seed}", small, fps)
            except Exception as err:  # the MP4 file is what was asked for; this is extra
                self.log(f"step {record.step}: {video} not put into TensorBoard: {first_line(err)}")
                continue
            self._writer.file_writer.add_summary(summary, record.step)
        self._writer.flush()

    def _log_scalars(self, record: EvalRecord) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self._writer is None:
            # Never with a purge_step: a resumed run's trainer purges (train.py); a purge from
            # this file, which starts later, would drop what the resumed trainer logged since.
            self._writer = SummaryWriter(str(self.run.path), filename_suffix=".eval")
        for s in record.results:
            tag = f"eval/{s.target:g}"
            self._writer.add_scalar(f"{tag}/return", s.return_mean, record.step)
            self._writer.add_scalar(f"{tag}/episode_length", s.length_mean, record.step)
            if s.normalized_mean is not None:
                self._writer.add_scalar(f"{tag}/normalized_return", s.normalized_mean, record.step)
        if record.final and record.reference is not None:
            self._writer.add_scalar("eval/final_normalized_return", record.score, record.step)
        self._writer.flush()

    def evaluate_queue(self) -> int:
        """Evaluate and remove every queued snapshot; returns how many there were."""
        snapshots = self.run.queued_snapshots()
        for path in snapshots:
            self.evaluate(path, name=str(self.run))  # the snapshot itself is deleted next
            path.unlink(missing_ok=True)
        return len(snapshots)

    def evaluate_new_checkpoints(self) -> int:
        """Evaluate saved checkpoints (checkpoints/step_N.pt) whose step has no result yet."""
        saved = self.run.saved_checkpoints()
        # A trainer queues a snapshot before it saves the checkpoint of the same step, so listing
        # the queue after the checkpoints sees every step that the queue will evaluate anyway.
        skip = {step_of(p) for p in self.run.queued_snapshots()}
        skip |= {r.step for r in read_results(self.run)}
        fresh = [p for p in saved if step_of(p) not in skip]
        for path in fresh:
            if path.exists():  # the trainer may have rotated it out meanwhile
                self.evaluate(path)
        return len(fresh)


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's PR_SET_PDEATHSIG; elsewhere
    the serving loop's parent check remains), and exit now if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def serve(
    run_dir: str,
    options: EvalOptions,
    finish: Any,
    parent: int,
    poll_seconds: float = 0.5,
) -> None:
    """The evaluation process beside training: evaluate queued snapshots until the trainer sets
    `finish`, then empty the queue and exit. Ctrl-C is left to the trainer, which stops us; if the
    trainer dies without a word (SIGKILL), so do we, at once (die_with_parent), so that no orphan
    appends a result to a run that a new trainer has since resumed. We run at the lowest priority
    (cpu.py), and on a CPU with one thread: training's cores and its thread count stay its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)
    yield_cpu()
    device = resolve_device(options.device, "eval.device")
    if device.type == "cpu":
        torch.set_num_threads(1)
    with Evaluator(RunDir(Path(run_dir)), options, device, lambda line: None) as ev:
        while os.getppid() == parent:
            finishing = finish.is_set()
            ev.evaluate_queue()
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
    if not RunDir(run_dir).config_file.is_file():
        raise PrimalDTError(
            f"--watch: {run_dir} is not a primal-dt run directory (it has no "
            f"{RunDir(run_dir).config_file.name}); give the run directory that train prints"
        )
    lock = RunLock(RunDir(run_dir), "eval").acquire()  # one evaluator per run
    log(f"watching {run_dir} for checkpoints (Ctrl-C stops)")
    try:
        with Evaluator(RunDir(run_dir), options, device, log) as evaluator:
            while not stop():
                if not evaluator.evaluate_queue() + evaluator.evaluate_new_checkpoints():
                    time.sleep(poll_seconds)
    finally:
        lock.release()


class EvalService:
    """The trainer's handle on its evaluation process (started with spawn, so CUDA is safe). A
    context manager: entering starts the process; leaving on an error stops it at once, with the
    queued snapshots left for the next evaluator."""

    def __init__(self, run: RunDir, options: EvalOptions) -> None:
        self.run, self.options = run, options
        self.context = multiprocessing.get_context("spawn")
        self.finish_event = self.context.Event()
        self.process: Any = None

    def __enter__(self) -> EvalService:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)

    def start(self) -> None:
        # Not a daemon: eval.workers > 1 starts environment processes of its own.
        self.process = self.context.Process(
            target=serve,
            args=(str(self.run), self.options, self.finish_event, os.getpid()),
            name="primal-dt-eval",
        )
        self.process.start()

    def check(self, log: Callable[[str], None]) -> None:
        """Restart the process if it died (out of memory, killed...); training goes on."""
        if not self.process.is_alive():
            log(f"evaluation process exited with code {self.process.exitcode}; restarting it")
            self.start()

    def finish(self) -> None:
        """Wait until every queued snapshot is evaluated."""
        self.finish_event.set()
        self.process.join()
        if self.process.exitcode != 0 and self.run.queued_snapshots():
            # It died with work left: finish the queue here rather than lose the final result.
            print("evaluation process failed; evaluating the rest here", file=sys.stderr)
            device = resolve_device(self.options.device, "eval.device")
            with Evaluator(self.run, self.options, device, lambda line: None) as evaluator:
                evaluator.evaluate_queue()
