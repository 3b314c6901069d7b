"""Paired differences between a config and its baseline, and what a study of that size can detect.

Two runs of a task with the same seed share their data order, their evaluation episodes' seeds and
(for configs of the same size) their initial weights outside the block that differs, so the report
compares them seed by seed: per task, d_i = config's final score - baseline's, over the seeds both
have, and a Student's t 95% interval of mean(d). That interval is narrower than the overlap of the
two configs' own intervals wherever the seeds' scores move together. The same comparison on each
run's mean score over the last quarter of its training (last_quarter_differences) says whether a
difference in final score holds over the evaluations before it, or rests on the last one alone.

Claims at a family-wise level: the per-task tests of one comparison section (every config and
task against the baseline) are one family; a difference is claimed only where Holm's step-down
correction of their paired t-tests' p-values keeps it under 5% (holm()), and each sentence shows
the uncorrected interval and p beside the adjusted p.

Power, per task: the smallest true difference a two-sided paired t-test at the 5% level detects
with 80% probability at this many pairs, taking the measured std of the differences as the true
one (the noncentral t distribution, solved for the difference), and the pairs that a difference of
TARGET points (the Primal paper's gap, 77.5 against 72.2) would need. The measured std of a few
differences is itself uncertain (at 5 pairs its 95% interval spans 0.6 to 2.9 times it): the
sentence adds the difference detected were the true std at the top of that interval.

Over tasks: each seed's mean over the tasks of its differences, D_i = (1/T) sum_t d_ti, and the
Student's t test and interval of mean(D) (exact for normal differences, whatever the tasks'
spreads: the D_i are independent and identically distributed), with the same power as per task.

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
from primal_dt.tools.statistics import CONFIDENCE, Interval, t_interval

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


def std_upper(std: float, pairs: int) -> float:
    """The upper end of the std's 95% interval from `pairs` normal values (chi-square, n − 1 df)."""
    stats, _ = _scipy()
    return std * math.sqrt((pairs - 1) / float(stats.chi2.ppf(ALPHA / 2, pairs - 1)))


def t_test_p(values: Sequence[float]) -> float | None:
    """The two-sided one-sample t-test's p-value of mean 0 (None under 2 values)."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    std = float(x.std(ddof=1))
    if std == 0:
        return 1.0 if x.mean() == 0 else 0.0
    stats, _ = _scipy()
    statistic = float(x.mean()) * math.sqrt(len(x)) / std
    return float(2 * stats.t.sf(abs(statistic), len(x) - 1))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values of one family of tests (None stays None and is not
    counted): the k-th smallest of m times (m − k + 1), made non-decreasing, at most 1."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - k) * p))
        adjusted[i] = running
    return adjusted


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
    def detectable_at_most(self) -> float | None:
        """The difference detected were the true std at the top of its 95% interval."""
        return (
            None
            if self.std is None
            else detectable(std_upper(self.std, len(self.differences)), len(self.differences))
        )

    @property
    def seeds_for_target(self) -> int | None:
        return None if self.std is None else seeds_for(self.std)

    @property
    def p_value(self) -> float | None:
        """The two-sided paired t-test's p-value (None under 2 pairs; 1 or 0 without spread)."""
        return t_test_p(self.differences)

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
    """The mean over tasks of the paired differences, from each seed's mean over the tasks."""

    config: str
    baseline: str
    tasks: list[str]
    pairs: int  # the seeds paired on every task
    point: float
    interval: Interval  # Student's t, 95%, of mean(D)
    p_value: float
    detectable: float
    detectable_at_most: float  # were the std of D at the top of its 95% interval
    seeds_for_target: int | None  # seeds per task for TARGET points (None beyond MAX_SEEDS)
    std: float  # of each seed's mean over the tasks, D_i


def paired_over_tasks(pairs: list[Paired]) -> PairedOverTasks | None:
    """Over the tasks of `pairs` (at least 2) and the seeds paired on all of them (at least 2),
    or None."""
    common = sorted(set.intersection(*(set(p.seeds) for p in pairs))) if pairs else []
    if len(pairs) < 2 or len(common) < 2:
        return None
    n = len(common)
    by_seed = [dict(zip(p.seeds, p.differences, strict=True)) for p in pairs]
    seed_means = np.array([[found[s] for s in common] for found in by_seed]).mean(axis=0)  # D_i
    interval, p_value = t_interval(seed_means), t_test_p(seed_means)
    assert interval is not None and p_value is not None, "at least 2 seeds"
    std = float(seed_means.std(ddof=1))
    found, at_most = detectable(std, n), detectable(std_upper(std, n), n) if std else 0.0
    assert found is not None and at_most is not None, "at least 2 seeds"
    return PairedOverTasks(
        pairs[0].config,
        pairs[0].baseline,
        [p.task for p in pairs],
        n,
        float(seed_means.mean()),
        interval,
        p_value,
        found,
        at_most,
        seeds_for(std),
        std,
    )


def _found(config: str, baseline: str, interval: Interval, adjusted: float | None) -> str:
    """The verdict: a difference claimed only where the (Holm-adjusted, where given) test rejects
    at ALPHA; an interval that excludes 0 whose adjusted test does not is said so."""
    low, high = interval
    excluded = low > 0 or high < 0
    if excluded and (adjusted is None or adjusted < ALPHA):
        return f"{config} scores {'above' if low > 0 else 'below'} {baseline}"
    if excluded:
        return (
            f"no difference detected at a family-wise {ALPHA:.0%} (the interval alone excludes 0)"
        )
    return "no difference detected"


def _power(detectable: float | None, at_most: float | None, needed: int | None, unit: str) -> str:
    power = f"the study could detect {detectable:.1f} points{unit} at {POWER:.0%} power"
    if at_most is not None:
        power += f" (up to {at_most:.1f} were the spread at the top of its 95% interval)"
    return power + (
        f"; {TARGET:g} points would need {needed} seeds{' per task' if unit else ''}"
        if needed is not None
        else f"; {TARGET:g} points would need over {MAX_SEEDS} seeds"
    )


def sentence(paired: Paired, adjusted: float | None = None, family: int = 1) -> str:
    """What one task's paired differences allow, with the study's power there; adjusted: its
    Holm-adjusted p-value in a family of `family` tests (holm())."""
    head = f"{paired.config} − {paired.baseline} on {paired.task}"
    if paired.interval is None:
        return f"{head}: {paired.mean:+.1f} from one pair of seeds: no interval, no test."
    low, high = paired.interval
    tests = f"p = {paired.p_value:.3f}"
    if adjusted is not None and family > 1:
        tests += f", Holm-adjusted over the {family} per-task tests {adjusted:.3f}"
    found = _found(paired.config, paired.baseline, paired.interval, adjusted)
    power = _power(paired.detectable, paired.detectable_at_most, paired.seeds_for_target, "")
    text = (
        f"{head}: {paired.mean:+.1f} [{low:+.1f}, {high:+.1f}] over {len(paired.seeds)} paired "
        f"seeds ({tests}): {found}; {power}"
    )
    p = paired.normality_p
    if p is not None and p < NORMALITY_ALPHA:
        text += (
            f" (the differences reject normality, Shapiro-Wilk p = {p:.3f}: the t interval's "
            f"assumption is doubtful here)"
        )
    return text + "."


def holm_sentences(pairs: Sequence[Paired]) -> list[str]:
    """The sentences of one family of per-task tests, each with its Holm-adjusted p-value."""
    adjusted = holm([p.p_value for p in pairs])
    family = sum(1 for p in adjusted if p is not None)
    return [sentence(p, a, family) for p, a in zip(pairs, adjusted, strict=True)]


def over_tasks_sentence(over: PairedOverTasks) -> str:
    low, high = over.interval
    found = _found(over.config, over.baseline, over.interval, None)
    power = _power(
        over.detectable, over.detectable_at_most, over.seeds_for_target, " over the tasks"
    )
    return (
        f"{over.config} − {over.baseline} over {len(over.tasks)} tasks ({over.pairs} paired seeds "
        f"each): {over.point:+.1f} [{low:+.1f}, {high:+.1f}] (Student's t on each seed's mean "
        f"over the tasks, p = {over.p_value:.3f}): {found}; {power}."
    )
