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

import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from primal_dt.checkpoint import BEST_NAME, atomic_write, copy_checkpoint, save_checkpoint
from primal_dt.errors import PrimalDTError, first_line

QUEUE_DIR = "eval_queue"
RESULTS_NAME = "eval.jsonl"


@dataclass
class EvalOptions:
    """How an evaluator evaluates; None means what the snapshot or the run's config asks for."""

    device: str = "auto"
    workers: int = 0
    episodes: int | None = None
    seed: int | None = None
    targets: list[float] | None = None
    purge_after: int | None = None  # a resumed run: results logged after this step are dropped


def queue_snapshot(run_dir: Path, payload: dict[str, Any], episodes: int, final: bool) -> Path:
    """Hand a policy to the evaluator: an atomic write into the run's queue."""
    path = run_dir / QUEUE_DIR / f"step_{payload['step']:08d}.pt"
    save_checkpoint(path, {**payload, "eval": {"episodes": episodes, "final": final}})
    return path


def queued_snapshots(run_dir: Path) -> list[Path]:
    return sorted((run_dir / QUEUE_DIR).glob("step_*.pt"))


def saved_checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*.pt"))


def step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every record in eval.jsonl; a line cut short by a crash is skipped."""
    path = run_dir / RESULTS_NAME
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def append_result(run_dir: Path, record: dict[str, Any]) -> None:
    """One line, written with a single append so concurrent writers never interleave."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(run_dir / RESULTS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def drop_results_after(run_dir: Path, step: int) -> None:
    """A resumed run trains those steps again, and their evaluations with them."""
    path = run_dir / RESULTS_NAME
    if path.exists():
        kept = "".join(json.dumps(r) + "\n" for r in read_results(run_dir) if r["step"] <= step)
        atomic_write(path, lambda file: file.write(kept.encode()))


class ResultsTail:
    """New records of eval.jsonl since the last call: how the trainer hears of evaluations."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RESULTS_NAME
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


def describe(record: dict[str, Any]) -> str:
    """One line for the progress output."""
    if "error" in record:
        return f"step {record['step']}: evaluation failed: {record['error']}"
    parts = []
    for s in record["results"]:
        score = "" if s["normalized_mean"] is None else f" (normalized {s['normalized_mean']:.1f})"
        parts.append(f"target {s['target']:g}: return {s['return_mean']:.1f}{score}")
    kind = "final evaluation" if record.get("final") else "evaluation"
    return f"step {record['step']}: {kind} over {record['episodes']} episodes, " + ", ".join(parts)


@dataclass
class Evaluator:
    """Evaluates the checkpoints of one run directory and records what it finds."""

    run_dir: Path
    options: EvalOptions = field(default_factory=EvalOptions)
    log: Callable[[str], None] = print
    _writer: Any = None
    _best: float = -math.inf

    def __post_init__(self) -> None:
        scores = [r["score"] for r in read_results(self.run_dir) if "score" in r]
        self._best = max(scores, default=-math.inf)

    def device(self) -> torch.device:
        from primal_dt.train import resolve_device

        return resolve_device(self.options.device)

    def evaluate(self, path: Path, name: str | None = None) -> dict[str, Any]:
        """Evaluate one checkpoint, record the result (or the failure) and return the record,
        in which the checkpoint is called `name` (default: its path)."""
        from primal_dt.evaluate import evaluate_checkpoint

        o = self.options
        try:
            record = evaluate_checkpoint(
                path, self.device(), o.episodes, o.seed, o.targets, o.workers
            )
        except Exception as err:  # a bad snapshot must never stop the service
            record = {
                "step": step_of(path),
                "checkpoint": name or str(path),
                "error": f"{type(err).__name__}: {first_line(err)}",
            }
            append_result(self.run_dir, record)
            self.log(describe(record))
            return record
        record["checkpoint"] = name or str(path)
        if record["score"] > self._best:
            self._best = record["score"]
            copy_checkpoint(path, self.run_dir / BEST_NAME)
            record["best"] = True
        self._log_scalars(record)
        self._log_spectrum(path, record["step"])
        append_result(self.run_dir, record)
        self.log(describe(record))
        return record

    def _log_spectrum(self, path: Path, step: int) -> None:
        """The snapshot's attention spectrum as TensorBoard images (spectrum.py). Optional: when
        it cannot be computed (no matplotlib, dataset not on this machine) only it is missing."""
        from primal_dt.spectrum import log_spectrum

        try:
            log_spectrum(self._writer, self.run_dir, path, step, self.device())
        except Exception as err:
            reason = f"{type(err).__name__}: {first_line(err)}"
            self.log(f"step {step}: attention spectrum not logged: {reason}")
        self._writer.flush()

    def _log_scalars(self, record: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self._writer is None:
            purge = self.options.purge_after
            self._writer = SummaryWriter(
                str(self.run_dir),
                purge_step=None if purge is None else purge + 1,
                filename_suffix=".eval",
            )
        step = record["step"]
        for s in record["results"]:
            tag = f"eval/{s['target']:g}"
            self._writer.add_scalar(f"{tag}/return", s["return_mean"], step)
            self._writer.add_scalar(f"{tag}/episode_length", s["length_mean"], step)
            if s["normalized_mean"] is not None:
                self._writer.add_scalar(f"{tag}/normalized_return", s["normalized_mean"], step)
        if record["final"] and record["reference"] is not None:
            self._writer.add_scalar("eval/final_normalized_return", record["score"], step)
        self._writer.flush()

    def evaluate_queue(self) -> int:
        """Evaluate and remove every queued snapshot; returns how many there were."""
        snapshots = queued_snapshots(self.run_dir)
        for path in snapshots:
            self.evaluate(path, name=str(self.run_dir))  # the snapshot itself is deleted next
            path.unlink(missing_ok=True)
        return len(snapshots)

    def evaluate_new_checkpoints(self) -> int:
        """Evaluate saved checkpoints (checkpoints/step_N.pt) whose step has no result yet."""
        saved = saved_checkpoints(self.run_dir)
        # A trainer queues a snapshot before it saves the checkpoint of the same step, so listing
        # the queue after the checkpoints sees every step that the queue will evaluate anyway.
        skip = {step_of(p) for p in queued_snapshots(self.run_dir)}
        skip |= {r["step"] for r in read_results(self.run_dir)}
        fresh = [p for p in saved if step_of(p) not in skip]
        for path in fresh:
            if path.exists():  # the trainer may have rotated it out meanwhile
                self.evaluate(path)
        return len(fresh)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def serve(
    run_dir: str, options: EvalOptions, finish: Any, parent: int, poll_seconds: float = 0.5
) -> None:
    """The evaluation process beside training: evaluate queued snapshots until the trainer sets
    `finish`, then empty the queue and exit. Ctrl-C is left to the trainer, which stops us; if the
    trainer dies without a word (SIGKILL), we notice that our parent changed and exit too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if options.device == "cpu" or not torch.cuda.is_available():
        torch.set_num_threads(1)  # leave the cores to training
    evaluator = Evaluator(Path(run_dir), options, log=lambda line: None)
    try:
        while os.getppid() == parent:
            finishing = finish.is_set()
            evaluator.evaluate_queue()
            if finishing:
                return
            finish.wait(poll_seconds)
    finally:
        evaluator.close()


def watch(
    run_dir: Path,
    options: EvalOptions,
    poll_seconds: float = 2.0,
    stop: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = print,
) -> None:
    """`primal-dt eval --watch`: evaluate queued snapshots and newly saved checkpoints as they
    appear, until interrupted (or until stop() says so)."""
    if not run_dir.is_dir():
        raise PrimalDTError(f"--watch: run directory {run_dir} does not exist")
    evaluator = Evaluator(run_dir, options, log=log)
    log(f"watching {run_dir} for checkpoints (Ctrl-C stops)")
    try:
        while not stop():
            if not evaluator.evaluate_queue() + evaluator.evaluate_new_checkpoints():
                time.sleep(poll_seconds)
    finally:
        evaluator.close()


class EvalService:
    """The trainer's handle on its evaluation process (started with spawn, so CUDA is safe)."""

    def __init__(self, run_dir: Path, options: EvalOptions) -> None:
        self.run_dir = run_dir
        self.options = options
        self.context = multiprocessing.get_context("spawn")
        self.finish_event = self.context.Event()
        self.process: Any = None
        self.restarts = 0

    def start(self) -> None:
        # Not a daemon: eval.workers > 1 starts environment processes of its own.
        self.process = self.context.Process(
            target=serve,
            args=(str(self.run_dir), self.options, self.finish_event, os.getpid()),
            name="primal-dt-eval",
        )
        self.process.start()

    def check(self, log: Callable[[str], None]) -> None:
        """Restart the process if it died (out of memory, killed...); training goes on."""
        if self.process is not None and not self.process.is_alive():
            code = self.process.exitcode
            self.restarts += 1
            log(f"evaluation process exited with code {code}; restarting it")
            self.start()

    def finish(self) -> None:
        """Wait until every queued snapshot is evaluated."""
        self.finish_event.set()
        self.process.join()
        if self.process.exitcode != 0 and queued_snapshots(self.run_dir):
            # It died with work left: finish the queue here rather than lose the final result.
            print("evaluation process failed; evaluating the rest here", file=sys.stderr)
            evaluator = Evaluator(self.run_dir, self.options, log=lambda line: None)
            try:
                evaluator.evaluate_queue()
            finally:
                evaluator.close()

    def stop(self) -> None:
        """Stop at once (the run was interrupted); queued snapshots stay for the next evaluator."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)
