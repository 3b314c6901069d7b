"""What the training loop hands its policies to: one small interface, chosen once per run.

    evaluator.submit(snapshot)   a policy snapshot with its EvalRequest, to be evaluated
    evaluator.collect(say)       say a line per result recorded since the last call, and the
                                 evaluator's own notes (a spectrum or video it could not log)
    evaluator.finish(say)        wait for what was submitted; the final evaluation's record

Every evaluator records into the run directory (eval.jsonl, TensorBoard, best.pt: service.py's
CheckpointEvaluator), and collect reads eval.jsonl back, so what is printed is what was recorded. `shown`
counts the records printed, which checkpoints keep: a resumed run prints those its predecessor
never did. make_evaluator picks the implementation from eval.service:

- "inline": evaluates each snapshot when it is submitted, in the training process (the simple
  path, as in CORL's single-file algorithms; training waits for it);
- "process" (the default): a process beside training takes the snapshots from the run's file
  queue, at the lowest CPU priority (cpu.yield_cpu), and dies with the trainer;
- "external": only queues the snapshots, for `primal-dt eval --watch RUN_DIR` elsewhere.

The runs of a pack (training/pack.py) get PackMembers instead (pack_evaluators): one evaluation
for them all, inline or in one process, that rolls each step's snapshots out as one (packed.py).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Any

import torch

from primal_dt.common.config import Config
from primal_dt.common.cpu import evaluation_threads
from primal_dt.common.device import resolve_device
from primal_dt.evaluation.packed import evaluate_queues, evaluate_together, serve_pack
from primal_dt.evaluation.rollout import EvalOptions
from primal_dt.evaluation.service import CheckpointEvaluator, queue_snapshot, serve
from primal_dt.store.locks import RunLock
from primal_dt.store.results import EvalResult, ResultsTail, describe, final_missing
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import Snapshot

Say = Callable[[str], None]


class RunEvaluator:
    """The interface, and the evaluator of a run that evaluates nothing (eval_every and
    final_episodes both 0). A context manager: leaving it on an error stops what is running.
    Snapshots go to the run's file queue unless an evaluator evaluates them itself."""

    def __init__(self, run: RunDir, options: EvalOptions, device: torch.device) -> None:
        self.run, self.options, self.device = run, options, device
        self.locks: list[RunLock] = []  # the run directory's writer locks it needs (trainer takes)
        self._shown_before: int | None = None
        self._tail: ResultsTail | None = None
        self._arrived: list[EvalResult] = []
        self._final: Snapshot | None = None

    def resume(self, shown: int | None) -> None:
        """For a resumed run: the first `shown` records of eval.jsonl were said before (None: all
        it holds when the evaluator starts); the first collect says the rest."""
        self._shown_before = shown

    @property
    def shown(self) -> int | None:
        """How many records of eval.jsonl have been said (None before the evaluator started)."""
        return None if self._tail is None else self._tail.shown

    def __enter__(self) -> RunEvaluator:
        # Read eval.jsonl only now: a resume rewrites it (drop_results_after) before training.
        self._tail = ResultsTail(self.run, self._shown_before)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    def needs_final(self, step: int, episodes: int) -> bool:
        """Whether the checkpoint at `step` lacks the final evaluation the run asks for, with none
        on its way (a run resumed at its last step gets only that)."""
        return final_missing(self.run, step, episodes) and not self.run.queued(step).exists()

    def submit(self, snapshot: Snapshot) -> None:
        if snapshot.request is not None and snapshot.request.final:
            self._final = snapshot
        self._hand_over(snapshot)

    def _hand_over(self, snapshot: Snapshot) -> None:
        queue_snapshot(self.run, snapshot)

    def collect(self, say: Say) -> None:
        for line in self._notes():
            say(line)
        assert self._tail is not None, "collect inside `with evaluator:`"
        for record in self._tail.new():
            self._arrived.append(record)
            say(describe(record))

    def _notes(self) -> list[str]:
        return []

    def finish(self, say: Say, step: int) -> EvalResult | None:
        """Wait for what was submitted or is queued, say what arrived; the result of the final
        evaluation of the checkpoint at `step` (or of its failure), None where there is none."""
        self._wait(say, step)
        self.collect(say)
        found = [r for r in self._arrived if r.step == step and (r.final or r.error is not None)]
        return found[-1] if found else None

    def _wait(self, say: Say, step: int) -> None:
        pass


@contextmanager
def isolated_from_training(device: torch.device) -> Iterator[None]:
    """Evaluation inside the training process as if it were a process of its own: building a
    policy's model draws from torch's random generators, and training's must go on as if nothing
    had been evaluated; on a CPU it runs with one thread, as every evaluation does there, and
    training's thread count is restored after it."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        evaluation_threads(device.type)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


class InlineEvaluator(RunEvaluator):
    """Evaluates at submit, in this process; snapshots left queued by an earlier evaluator of the
    run are evaluated when it starts."""

    def __init__(self, run: RunDir, options: EvalOptions, device: torch.device) -> None:
        super().__init__(run, options, device)
        self.locks = [RunLock(run, "eval")]
        self._evaluator: CheckpointEvaluator | None = None
        self._pending_notes: list[str] = []

    def __enter__(self) -> InlineEvaluator:
        super().__enter__()
        self._evaluator = CheckpointEvaluator(
            self.run, self.options, self.device, self._pending_notes.append
        )
        with isolated_from_training(self.device):
            self._evaluator.evaluate_queue()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._evaluator is not None:
            self._evaluator.close()

    def _hand_over(self, snapshot: Snapshot) -> None:
        assert self._evaluator is not None, "submit inside `with evaluator:`"
        with isolated_from_training(self.device):
            self._evaluator.evaluate_snapshot(snapshot, name=str(self.run))

    def _notes(self) -> list[str]:
        notes, self._pending_notes[:] = list(self._pending_notes), []
        return notes


class BackgroundEvaluator(RunEvaluator):
    """A process beside training (spawned, so CUDA is safe) evaluates the run's file queue; its
    notes come back through a queue. Restarted when it dies; if it fails with work left at the
    end, the rest is evaluated here rather than lost."""

    def __init__(self, run: RunDir, options: EvalOptions, device: torch.device) -> None:
        super().__init__(run, options, device)
        self.locks = [RunLock(run, "eval")]
        self._context = multiprocessing.get_context("spawn")
        self._finish = self._context.Event()
        self._process: Any = None
        self._notes_queue: Any = None

    def __enter__(self) -> BackgroundEvaluator:
        super().__enter__()
        self._start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        if kind is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=10)

    def _start(self) -> None:
        # A fresh queue each time: a process killed in the middle of a put may leave it locked.
        self._notes_queue = self._context.Queue()
        # Not a daemon: eval.workers > 1 starts environment processes of its own.
        self._process = self._context.Process(
            target=serve,
            args=(str(self.run), self.options, self._finish, os.getpid(), self._notes_queue),
            name="primal-dt-eval",
        )
        self._process.start()

    def _drained(self) -> list[str]:
        notes = []
        while True:
            try:
                notes.append(self._notes_queue.get_nowait())
            except queue.Empty:
                return notes

    def _notes(self) -> list[str]:
        notes = self._drained()
        if not self._process.is_alive() and not self._finish.is_set():
            notes.append(
                f"evaluation process exited with code {self._process.exitcode}; restarting it"
            )
            self._start()
        return notes

    def _wait(self, say: Say, step: int) -> None:
        if self.run.queued(step).exists():
            episodes = self._final.request.episodes if self._final and self._final.request else None
            per_target = f" ({episodes} episodes per target)" if episodes else ""
            say(f"training done; waiting for the final evaluation{per_target}")
        self._finish.set()
        while self._process.is_alive():  # reading its notes, so that it never blocks on a full pipe
            for note in self._drained():
                say(note)
            self._process.join(timeout=0.2)
        for note in self._drained():
            say(note)
        if self._process.exitcode != 0 and self.run.queued_snapshots():
            say("evaluation process failed; evaluating the rest here")
            with CheckpointEvaluator(self.run, self.options, self.device, say) as evaluator:
                evaluator.evaluate_queue()


class ExternalEvaluator(RunEvaluator):
    """Only queues the snapshots, for `primal-dt eval --watch RUN_DIR` on another machine."""

    def finish(self, say: Say, step: int) -> EvalResult | None:
        self.collect(say)
        if self.run.queued_snapshots():
            say(
                f"training done; its evaluation snapshots wait in {self.run.queue} for: "
                f"primal-dt eval --watch {self.run}"
            )
        return None


class PackEvaluation:
    """The one evaluation of a pack's runs, shared by their PackMembers: in this process, at the
    last run's submit of a step (inline), or in one process beside training that takes every
    run's file queue (process); either way each step's snapshots are rolled out as one
    (packed.py). It starts once every member has entered (each reading its eval.jsonl first),
    and ends at the first member's finish, or when a member leaves on an error."""

    def __init__(
        self, runs: list[RunDir], options: EvalOptions, device: torch.device, inline: bool
    ) -> None:
        self.runs, self.options, self.device, self.inline = runs, options, device, inline
        self.notes: list[list[str]] = [[] for _ in runs]  # each run's, until its member says them
        self.entered = 0
        self.finished = False
        self.evaluators: list[CheckpointEvaluator] = []  # inline's, one per run
        self.pending: dict[int, Snapshot] = {}  # inline: this step's snapshots, by run
        self._context = multiprocessing.get_context("spawn")
        self._finish = self._context.Event()
        self._process: Any = None
        self._queue: Any = None

    def enter(self) -> None:
        self.entered += 1
        if self.entered < len(self.runs):
            return
        if self.inline:
            self.evaluators = [
                CheckpointEvaluator(run, self.options, self.device, self.notes[r].append)
                for r, run in enumerate(self.runs)
            ]
            with isolated_from_training(self.device):  # what an earlier evaluator left queued
                evaluate_queues(self.evaluators, finishing=True)
        else:
            self._start()

    def leave(self, failed: bool) -> None:
        self.entered -= 1
        if failed and self._process is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=10)
        for run, snapshot in self.pending.items():  # a step not all runs reached: for the next
            queue_snapshot(self.runs[run], snapshot)
        self.pending = {}
        if self.entered == 0:
            for evaluator in self.evaluators:
                evaluator.close()

    def hand_over(self, run: int, snapshot: Snapshot) -> None:
        if not self.inline:
            queue_snapshot(self.runs[run], snapshot)
            return
        self.pending[run] = snapshot
        if len(self.pending) == len(self.runs):
            self._evaluate_pending()

    def _evaluate_pending(self) -> None:
        runs, self.pending = sorted(self.pending.items()), {}
        with isolated_from_training(self.device):
            evaluate_together(
                [self.evaluators[r] for r, _ in runs],
                [snapshot for _, snapshot in runs],
                [str(self.runs[r]) for r, _ in runs],
            )

    def _start(self) -> None:
        self._queue = self._context.Queue()  # a fresh one: a killed process may leave it locked
        self._process = self._context.Process(
            target=serve_pack,
            args=(
                [str(run) for run in self.runs],
                self.options,
                self._finish,
                os.getpid(),
                self._queue,
            ),
            name="primal-dt-eval-pack",
        )
        self._process.start()

    def _drain(self) -> None:
        while self._queue is not None:
            try:
                run, line = self._queue.get_nowait()
            except queue.Empty:
                return
            self.notes[run].append(line)

    def notes_of(self, run: int) -> list[str]:
        """Run `run`'s notes since the last call; the process restarted where it died."""
        if not self.inline and self._process is not None:  # (started once all have entered)
            self._drain()
            if not self._process.is_alive() and not self._finish.is_set():
                self.notes[run].append(
                    f"the pack's evaluation process exited with code {self._process.exitcode}; "
                    "restarting it"
                )
                self._start()
        notes, self.notes[run] = self.notes[run], []
        return notes

    def finish(self, say: Say) -> None:
        """Evaluate what is left (the first member's finish; the others find it done)."""
        if self.finished:
            return
        self.finished = True
        if self.inline:
            if self.pending:
                self._evaluate_pending()
            return
        self._finish.set()
        while self._process.is_alive():  # reading its notes, so it never blocks on a full pipe
            self._drain()
            self._process.join(timeout=0.2)
        self._drain()
        if self._process.exitcode != 0 and any(run.queued_snapshots() for run in self.runs):
            say("the pack's evaluation process failed; evaluating the rest here")
            with ExitStack() as stack:
                evaluators = [
                    stack.enter_context(
                        CheckpointEvaluator(run, self.options, self.device, self.notes[r].append)
                    )
                    for r, run in enumerate(self.runs)
                ]
                evaluate_queues(evaluators, finishing=True)


class PackMember(RunEvaluator):
    """A run's evaluator in a pack: what it submits joins the pack's evaluation (PackEvaluation);
    what it says and returns is its own run's."""

    def __init__(self, shared: PackEvaluation, run: int, alone: RunEvaluator) -> None:
        super().__init__(shared.runs[run], shared.options, shared.device)
        self.shared, self.index = shared, run
        # The run's own evaluator's: its locks (the trainer holds them already) and what it
        # was told a resumed run had printed.
        self.locks, self._shown_before = alone.locks, alone._shown_before

    def __enter__(self) -> PackMember:
        super().__enter__()
        self.shared.enter()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        self.shared.leave(kind is not None)

    def _hand_over(self, snapshot: Snapshot) -> None:
        self.shared.hand_over(self.index, snapshot)

    def _notes(self) -> list[str]:
        return self.shared.notes_of(self.index)

    def _wait(self, say: Say, step: int) -> None:
        if not self.shared.finished and (self.run.queued(step).exists() or self.shared.pending):
            say("training done; waiting for the pack's final evaluation")
        self.shared.finish(say)


EVALUATORS: dict[str, type[RunEvaluator]] = {
    "inline": InlineEvaluator,
    "process": BackgroundEvaluator,
    "external": ExternalEvaluator,
}


def make_evaluator(config: Config, run: RunDir) -> RunEvaluator:
    """The run's evaluator, by eval.service; the plain RunEvaluator where nothing is evaluated.
    eval.device "auto" is the training device (cuda:1 where training is on cuda:1), so that the
    policy acts where, and in the precision, it trained; it is checked now, not at the first
    evaluation."""
    if not (config.train.eval_every or config.eval.final_episodes):
        return RunEvaluator(run, EvalOptions(), torch.device("cpu"))
    auto = config.eval.device == "auto"
    name = config.train.device if auto else config.eval.device
    options = EvalOptions(device=name, workers=config.eval.workers)
    external = config.eval.service == "external"  # evaluated elsewhere: nothing to check here
    device = torch.device("cpu") if external else resolve_device(name, "eval.device")
    return EVALUATORS[config.eval.service](run, options, device)


def pack_evaluators(alone: list[RunEvaluator]) -> list[RunEvaluator]:
    """The evaluators of a pack's runs, from each run's own (make_evaluator's, before it has
    entered): with eval.service inline or process, members of one PackEvaluation (each step's
    snapshots rolled out as one); else the runs' own."""
    first = alone[0]
    if len(alone) < 2 or type(first) not in (InlineEvaluator, BackgroundEvaluator):
        return alone
    runs = [evaluator.run for evaluator in alone]
    shared = PackEvaluation(runs, first.options, first.device, isinstance(first, InlineEvaluator))
    return [PackMember(shared, r, evaluator) for r, evaluator in enumerate(alone)]
