"""Whether a study trained long enough: per task and config, the slope of the evaluation score
over the end of training, seed by seed, and an equivalence test of it.

Each run's slope: its last quarter's mean score minus the quarter before's, over the S/4 steps
between the two quarters' middles, in points per 1,000 steps. A curve is flat only where the
two one-sided tests at 5% (the 90% Student's t interval of the mean slope) put it inside
±FLAT_MARGIN points per 1,000 steps: an interval too wide to say so reads "not known to be flat",
never "flat". Where it is not flat and the 95% interval excludes 0, the curve is still rising or
falling. A budget is long enough for a study when its configs' curves are flat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from primal_dt.tools.runs import RunSummary
from primal_dt.tools.statistics import t_interval

FLATNESS_HEADING = "## Are the curves flat?"
FLAT_MARGIN = 2.0  # points per 1,000 steps: a slope inside ±this is flat
FLAT, NOT_KNOWN = "flat", "not known to be flat"  # the verdicts beside rising and falling


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


def quarter_slope(scores: Sequence[tuple[int, float]], steps: int) -> float | None:
    """quarter_change over the S/4 steps between the quarters' middles, per 1,000 steps."""
    change = quarter_change(scores, steps)
    return None if change is None else change / (steps / 4) * 1000


@dataclass
class Flatness:
    """One task's and config's slope over the end of training, seed by seed, with its 95% and
    90% Student's t intervals, and the verdict they give."""

    task: str
    config: str
    slopes: list[float]  # per seed, points per 1,000 steps
    interval: tuple[float, float]  # 95%: rising or falling where it excludes 0
    equivalence: tuple[float, float]  # 90%: flat where it lies inside ±FLAT_MARGIN

    @property
    def mean(self) -> float:
        return float(np.mean(self.slopes))

    @property
    def flat(self) -> bool:
        low, high = self.equivalence
        return low > -FLAT_MARGIN and high < FLAT_MARGIN

    @property
    def verdict(self) -> str:
        low, high = self.interval
        if self.flat:
            return FLAT
        return "still rising" if low > 0 else "still falling" if high < 0 else NOT_KNOWN

    def sentence(self) -> str:
        (low, high), (equal_low, equal_high) = self.interval, self.equivalence
        margin = {
            FLAT: f" (inside ±{FLAT_MARGIN:g} points per 1,000 steps)",
            NOT_KNOWN: f" (the interval reaches beyond ±{FLAT_MARGIN:g})",
        }.get(self.verdict, "")
        return (
            f"{self.config} on {self.task}: a slope of {self.mean:+.1f} [{low:+.1f}, {high:+.1f}] "
            f"points per 1,000 steps over {len(self.slopes)} seeds (90%: [{equal_low:+.1f}, "
            f"{equal_high:+.1f}]): {self.verdict}{margin}."
        )


def flatness(summaries: Sequence[RunSummary]) -> list[Flatness]:
    """Per (task, config) with a slope for at least 2 seeds, in task, config order."""
    groups: dict[tuple[str, str], list[float]] = {}
    for run in sorted(summaries, key=lambda s: (s.task, s.config, s.seed)):
        slope = quarter_slope(run.scores, run.steps)
        if slope is not None:
            groups.setdefault((run.task, run.config), []).append(slope)
    found = []
    for (task, config), slopes in groups.items():
        interval, equivalence = t_interval(slopes), t_interval(slopes, 0.9)
        if interval is not None and equivalence is not None:
            found.append(Flatness(task, config, slopes, interval, equivalence))
    return found


def flatness_section(summaries: Sequence[RunSummary]) -> str:
    """report.md's section: the sentences, or what is missing for them."""
    sentences = [found.sentence() for found in flatness(summaries)]
    lines = [
        FLATNESS_HEADING,
        "",
        "Per task and config, seed by seed: the slope of the evaluation score over the end of "
        "training (the mean of the scores in the last quarter minus the mean of those in the "
        "quarter before, per 1,000 steps between the quarters' middles), with the Student's t "
        "95% interval of its mean over seeds, and the 90% one: a curve is flat only where the "
        f"90% interval lies inside ±{FLAT_MARGIN:g} points per 1,000 steps (two one-sided tests "
        "at 5%); still rising or falling where it is not and the 95% interval excludes 0; "
        "otherwise not known to be flat.",
        "",
    ]
    if not sentences:
        return "\n".join(
            [*lines, "No config has at least 2 seeds evaluated in both quarters: nothing to say."]
        )
    return "\n".join([*lines, *(f"- {s}" for s in sentences)])
