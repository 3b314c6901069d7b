"""Whether a study trained long enough: per task and config, the change of the evaluation score
between the last two quarters of training, seed by seed, with its Student's t interval.

A curve counts as flat where that interval holds 0: over the last quarter the score moved by no
more than the seeds' spread lets the study see. The interval's width says how large a late rise
could still hide in it; a budget is long enough for a study when its configs' curves are flat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from primal_dt.tools.runs import RunSummary
from primal_dt.tools.statistics import t_interval

FLATNESS_HEADING = "## Are the curves flat?"
FLAT = "flat: no change detected beyond the seeds' spread"


def quarter_scores(
    scores: Sequence[tuple[int, float]], steps: int, last: bool = True
) -> list[float]:
    """The scores of a run's evaluations in the last quarter of its steps (3/4 S < s <= S, the
    final evaluation included), or with last=False in the quarter before (S/2 < s <= 3/4 S)."""
    low, high = (0.75, 1.0) if last else (0.5, 0.75)
    return [score for step, score in scores if low * steps < step <= high * steps]


def quarter_mean(
    scores: Sequence[tuple[int, float]], steps: int, last: bool = True
) -> float | None:
    """The mean of quarter_scores; None where that quarter has no evaluation."""
    found = quarter_scores(scores, steps, last)
    return float(np.mean(found)) if found else None


def quarter_change(scores: Sequence[tuple[int, float]], steps: int) -> float | None:
    """The last quarter's mean score minus the quarter before's (quarter_mean); None where either
    quarter has no evaluation."""
    late, before = quarter_mean(scores, steps), quarter_mean(scores, steps, last=False)
    return None if late is None or before is None else late - before


@dataclass
class Flatness:
    """One task's and config's change between the last two quarters (quarter_change), seed by
    seed, with its Student's t interval, and the verdict it gives."""

    task: str
    config: str
    changes: list[float]
    interval: tuple[float, float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.changes))

    @property
    def verdict(self) -> str:
        low, high = self.interval
        return FLAT if low <= 0 <= high else "still rising" if low > 0 else "still falling"

    def sentence(self) -> str:
        low, high = self.interval
        return (
            f"{self.config} on {self.task}: the last quarter's mean score minus the quarter "
            f"before's {self.mean:+.1f} [{low:+.1f}, {high:+.1f}] over {len(self.changes)} "
            f"seeds: {self.verdict}."
        )


def flatness(summaries: Sequence[RunSummary]) -> list[Flatness]:
    """Per (task, config) with a change for at least 2 seeds, in task, config order."""
    groups: dict[tuple[str, str], list[float]] = {}
    for run in sorted(summaries, key=lambda s: (s.task, s.config, s.seed)):
        change = quarter_change(run.scores, run.steps)
        if change is not None:
            groups.setdefault((run.task, run.config), []).append(change)
    found = []
    for (task, config), changes in groups.items():
        interval = t_interval(changes)
        if interval is not None:
            found.append(Flatness(task, config, changes, interval))
    return found


def flatness_section(summaries: Sequence[RunSummary]) -> str:
    """report.md's section: the sentences, or what is missing for them."""
    sentences = [found.sentence() for found in flatness(summaries)]
    lines = [
        FLATNESS_HEADING,
        "",
        "Per task and config, seed by seed: the mean of the evaluation scores in the last "
        "quarter of training minus the mean of those in the quarter before, with the Student's "
        "t 95% interval of that change over seeds. A curve is flat where the interval holds 0.",
        "",
    ]
    if not sentences:
        return "\n".join(
            [*lines, "No config has at least 2 seeds evaluated in both quarters: nothing to say."]
        )
    return "\n".join([*lines, *(f"- {s}" for s in sentences)])
