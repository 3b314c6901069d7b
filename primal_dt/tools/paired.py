"""Paired differences between a config and its baseline, and what a study of that size can detect.

Two runs of a task with the same seed share their data order, their evaluation episodes' seeds and
(for configs of the same size) their initial weights outside the block that differs, so the report
compares them seed by seed: per task, d_i = config's final score - baseline's, over the seeds both
have, and a Student's t 95% interval of mean(d). That interval is narrower than the overlap of the
two configs' own intervals wherever the seeds' scores move together. The same comparison on each
run's mean score over the last quarter of its training (last_quarter_differences) says whether a
difference in final score holds over the evaluations before it, or rests on the last one alone.

Power, per task: the smallest true difference a two-sided paired t-test at the 5% level detects
with 80% probability at this many pairs, taking the measured std of the differences as the true
one (the noncentral t distribution, solved for the difference), and the pairs that a difference of
TARGET points (the Primal paper's gap, 77.5 against 72.2) would need. Over tasks: the mean over
tasks of the per-task mean differences, with rliable's stratified bootstrap interval (statistics.py)
and its simulated coverage; its power from the normal approximation,
(z(0.975) + z(0.8)) sqrt(sum_t s_t^2 / n_t) / T.

Where a task's differences reject normality (Shapiro-Wilk, p < 0.05, at 3 pairs or more), the
report says that the t interval's assumption is doubtful there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from primal_dt.tools.flatness import quarter_mean
from primal_dt.tools.runs import ReportError, Row, RunSummary
from primal_dt.tools.statistics import (
    CONFIDENCE,
    Interval,
    estimate,
    simulated_coverage,
    t_interval,
)

POWER = 0.8  # the probability of detecting a true difference that "detectable" means
ALPHA = 1 - CONFIDENCE  # the two-sided test's level
TARGET = 5.0  # normalised points: the difference a study should be able to detect
NORMALITY_ALPHA = 0.05  # Shapiro-Wilk's level
MAX_SEEDS = 100_000  # seeds_for gives up (None) beyond this


def _scipy() -> tuple[Any, Any]:
    """(scipy.stats, scipy.optimize)."""
    try:
        from scipy import optimize, stats
    except ImportError:
        raise ReportError(
            "the report's power needs scipy: pip install 'primal-dt[report]'"
        ) from None
    return stats, optimize


def t_test_power(difference: float, std: float, pairs: int) -> float:
    """The probability that a two-sided paired t-test at level ALPHA rejects "no difference" when
    the true mean difference is `difference` and the differences' std `std`, at `pairs` pairs."""
    stats, _ = _scipy()
    df = pairs - 1
    critical = stats.t.ppf(1 - ALPHA / 2, df)
    shift = difference * math.sqrt(pairs) / std
    power = float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))
    if not math.isfinite(power):  # scipy's noncentral t gives NaN far out in the tail
        return 1.0 if abs(shift) > critical else ALPHA
    return power


def detectable(std: float, pairs: int) -> float | None:
    """The smallest true difference detected with probability POWER at `pairs` pairs (None under
    2 pairs, 0 where the differences do not vary)."""
    if pairs < 2:
        return None
    if std == 0:
        return 0.0
    _, optimize = _scipy()
    high = std
    while t_test_power(high, std, pairs) < POWER:
        high *= 2
    return float(optimize.brentq(lambda d: t_test_power(d, std, pairs) - POWER, 0.0, high))


def seeds_for(std: float, difference: float = TARGET) -> int | None:
    """The fewest pairs at which a true `difference` is detected with probability POWER, given
    the differences' std (None beyond MAX_SEEDS)."""
    if std == 0:
        return 2
    low, high = 1, 2  # power(low) < POWER (one pair tests nothing); doubled until power(high) >= it
    while t_test_power(difference, std, high) < POWER:
        low, high = high, high * 2
        if high > MAX_SEEDS:
            return None
    while high - low > 1:  # the fewest pairs that reach the power
        middle = (low + high) // 2
        low, high = (
            (middle, high) if t_test_power(difference, std, middle) < POWER else (low, middle)
        )
    return high


@dataclass
class Paired:
    """One task's paired differences, config minus baseline, seed by seed."""

    task: str
    config: str
    baseline: str
    seeds: list[int]
    differences: list[float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences))

    @property
    def std(self) -> float | None:
        return float(np.std(self.differences, ddof=1)) if len(self.differences) > 1 else None

    @property
    def interval(self) -> Interval | None:
        return t_interval(self.differences)

    @property
    def detectable(self) -> float | None:
        return None if self.std is None else detectable(self.std, len(self.differences))

    @property
    def seeds_for_target(self) -> int | None:
        return None if self.std is None else seeds_for(self.std)

    @property
    def normality_p(self) -> float | None:
        """Shapiro-Wilk's p-value of the differences (None under 3 pairs or without spread)."""
        if len(self.differences) < 3 or not self.std:
            return None
        return float(_scipy()[0].shapiro(self.differences).pvalue)


def _pair(
    task: str,
    config: str,
    baseline: str,
    mine: dict[int, float | None],
    theirs: dict[int, float | None],
) -> Paired | None:
    """The differences of the seeds both have a score for, in seed order (None where none)."""
    seeds = sorted(s for s, v in mine.items() if v is not None and theirs.get(s) is not None)
    differences = [float(mine[s]) - float(theirs[s]) for s in seeds]  # type: ignore[arg-type]
    return Paired(task, config, baseline, seeds, differences) if seeds else None


def paired_differences(rows: Sequence[Row], config: str, baseline: str) -> list[Paired]:
    """Per task both configs ran with normalised scores, the differences of the seeds both have
    a final score for, in seed order."""
    found = []
    by_key = {(row.task, row.config): row for row in rows if row.task != "average"}
    for (task, name), row in by_key.items():
        base = by_key.get((task, baseline))
        if name != config or base is None or not (row.normalized and base.normalized):
            continue
        mine = dict(zip(row.seeds, row.per_seed, strict=True))
        theirs = dict(zip(base.seeds, base.per_seed, strict=True))
        if paired := _pair(task, config, baseline, mine, theirs):
            found.append(paired)
    return found


def last_quarter_differences(
    summaries: Sequence[RunSummary], config: str, baseline: str
) -> list[Paired]:
    """As paired_differences, on each run's mean score over the last quarter of its training
    (flatness.quarter_mean) instead of its final evaluation: the final score is one evaluation,
    and where the curves wander it rests on where each happens to stand at the end. Tasks in
    name order."""
    means: dict[tuple[str, str], dict[int, float | None]] = {}
    for run in summaries:
        if run.normalized:
            mean = quarter_mean(run.scores, run.steps)
            means.setdefault((run.task, run.config), {})[run.seed] = mean
    found = []
    for (task, name), mine in sorted(means.items()):
        theirs = means.get((task, baseline))
        if name == config and theirs and (paired := _pair(task, config, baseline, mine, theirs)):
            found.append(paired)
    return found


@dataclass
class PairedOverTasks:
    """The mean over tasks of the per-task mean differences, its interval and its power."""

    config: str
    baseline: str
    tasks: list[str]
    pairs: int  # per task (the fewest any task has: each task's first, by seed)
    point: float
    interval: Interval
    coverage: float  # the interval's coverage in simulation at this shape
    detectable: float
    seeds_for_target: int


def paired_over_tasks(pairs: list[Paired]) -> PairedOverTasks | None:
    """Over the tasks of `pairs` (at least 2, each with at least 2 pairs), or None."""
    if len(pairs) < 2 or min(len(p.differences) for p in pairs) < 2:
        return None
    n = min(len(p.differences) for p in pairs)
    matrix = np.array([p.differences[:n] for p in pairs]).T  # (seeds, tasks)
    points, intervals = estimate(matrix, lambda scores: np.array([scores.mean(axis=0).mean()]))
    stats, _ = _scipy()
    z = stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)
    variances = matrix.var(axis=0, ddof=1)
    tasks = len(pairs)
    smallest = z * math.sqrt(float(variances.sum()) / n) / tasks
    needed = max(2, math.ceil((z / (tasks * TARGET)) ** 2 * float(variances.sum())))
    return PairedOverTasks(
        pairs[0].config,
        pairs[0].baseline,
        [p.task for p in pairs],
        n,
        float(points[0]),
        (float(intervals[0, 0]), float(intervals[1, 0])),
        simulated_coverage(n, tasks),
        smallest,
        needed,
    )


def sentence(paired: Paired) -> str:
    """What one task's paired differences allow, with the study's power there."""
    head = f"{paired.config} − {paired.baseline} on {paired.task}"
    if paired.interval is None:
        return f"{head}: {paired.mean:+.1f} from one pair of seeds: no interval, no test."
    low, high = paired.interval
    found = (
        f"{paired.config} scores {'above' if low > 0 else 'below'} {paired.baseline}"
        if low > 0 or high < 0
        else "no difference detected"
    )
    power = f"the study could detect {paired.detectable:.1f} points at {POWER:.0%} power"
    needed = paired.seeds_for_target
    power += (
        f"; {TARGET:g} points would need {needed} seeds"
        if needed is not None
        else f"; {TARGET:g} points would need over {MAX_SEEDS} seeds"
    )
    text = (
        f"{head}: {paired.mean:+.1f} [{low:+.1f}, {high:+.1f}] over {len(paired.seeds)} paired "
        f"seeds: {found}; {power}"
    )
    p = paired.normality_p
    if p is not None and p < NORMALITY_ALPHA:
        text += (
            f" (the differences reject normality, Shapiro-Wilk p = {p:.3f}: the t interval's "
            f"assumption is doubtful here)"
        )
    return text + "."


def over_tasks_sentence(over: PairedOverTasks) -> str:
    low, high = over.interval
    found = (
        f"{over.config} scores {'above' if low > 0 else 'below'} {over.baseline}"
        if low > 0 or high < 0
        else "no difference detected"
    )
    return (
        f"{over.config} − {over.baseline} over {len(over.tasks)} tasks ({over.pairs} paired seeds "
        f"each): {over.point:+.1f} [{low:+.1f}, {high:+.1f}] (stratified bootstrap, nominal "
        f"{CONFIDENCE:.0%}, {over.coverage:.0%} in simulation at this shape): {found}; the study "
        f"could detect {over.detectable:.1f} points over the tasks at {POWER:.0%} power, and "
        f"{TARGET:g} points would need {over.seeds_for_target} seeds per task."
    )
