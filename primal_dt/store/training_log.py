"""The training log: one LogPoint per log point of a run (every train.log_every steps, and the
last), a line of RUN_DIR/training.jsonl each.

Each point holds the means since the last log of what TensorBoard shows under train/ (the action
loss, the kind's auxiliary loss by its name, the weighted loss, the learning rate, steps per
second) and when: the start of its session (one `train` command: the first, or a --resume) and its
own time; each session first logs its start, a point without scalars (begin_session). The report
reads the auxiliary-loss curve and the time a study trained from here, never from TensorBoard's
files. Lines are only appended: a resumed session (or one rolled back to a kept checkpoint) logs
its steps again after the lines of the session it continues, which stay as time that was spent;
the curve drops every line a later session's start supersedes (current()).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from primal_dt.store.atomic import append_line
from primal_dt.store.results import EvalResult
from primal_dt.store.rundir import RunDir

Span = tuple[float, float]  # (start, end), seconds since the epoch


@dataclass
class LogPoint:
    """One log point: the step, the train/ scalars by name, its session's start and its time."""

    step: int
    session: float  # when the session that logged it began (seconds since the epoch)
    first: int  # the step that session began at (0, or the checkpoint it resumed)
    time: float  # when it was logged
    scalars: dict[str, float]


@dataclass(frozen=True)
class Session:
    """A session (one `train` command) as the log knows it: when it began and at which step."""

    start: float
    first: int


def begin_session(run: RunDir, step: int) -> Session:
    """A session starting at step, logged as a point without scalars: it counts from here, whether
    it logs anything or not (a --resume at the last step only evaluates)."""
    session = Session(round(time.time(), 3), step)
    log_point(run, session, step, {})
    return session


def log_point(run: RunDir, session: Session, step: int, scalars: dict[str, float]) -> None:
    """One log point of a session, at this time."""
    append_point(run, LogPoint(step, session.start, session.first, round(time.time(), 3), scalars))


def append_point(run: RunDir, point: LogPoint) -> None:
    """One line of training.jsonl (atomic.append_line: never cut short)."""
    append_line(run.training_log, json.dumps(asdict(point)) + "\n")


def read_points(path: Path) -> list[LogPoint]:
    """Every point of a training.jsonl file (RunDir.training_log), in the order logged; a line cut
    short by a crash is skipped; none where the file is missing (a run made before primal-dt
    wrote it)."""
    if not path.exists():
        return []
    points = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            raw = json.loads(line)
            scalars = {str(name): float(value) for name, value in raw["scalars"].items()}
            step, session, first = int(raw["step"]), float(raw["session"]), int(raw["first"])
            points.append(LogPoint(step, session, first, float(raw["time"]), scalars))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return points


def current(points: list[LogPoint]) -> list[LogPoint]:
    """The points of the run as it now stands: a point is superseded where a later session began
    at an earlier step (it trained that step again, or will), in step order."""
    began = {point.session: point.first for point in points}
    return sorted(
        (
            point
            for point in points
            if not any(
                start > point.session and first < point.step for start, first in began.items()
            )
        ),
        key=lambda point: point.step,
    )


def curve(points: list[LogPoint], name: str) -> list[tuple[int, float]]:
    """The scalar `name` by step, from the current points (current()), in step order."""
    return [(point.step, point.scalars[name]) for point in current(points) if name in point.scalars]


def training_sessions(points: list[LogPoint], results: list[EvalResult]) -> list[Span]:
    """Each session as (start, end): from its start to its last point, or to the last evaluation
    that finished before the next session began (the final evaluation ends a session), so that
    the idle time between an interrupted session and its --resume is not counted."""
    starts = sorted({point.session for point in points})
    spans = []
    for index, start in enumerate(starts):
        until = starts[index + 1] if index + 1 < len(starts) else float("inf")
        ends = [point.time for point in points if point.session == start]
        ends += [
            r.finished_at
            for r in results
            if r.finished_at is not None and start <= r.finished_at < until
        ]
        spans.append((start, max(ends)))
    return spans


def union_minutes(spans: list[Span]) -> float:
    """Minutes covered by at least one span: runs trained side by side count once."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total / 60
