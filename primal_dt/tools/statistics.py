"""Every statistic the report prints, with the checks of what its intervals are worth.

Per task, over seeds: Student's t intervals, which cover as they say at any number of seeds for
normal scores (a percentile bootstrap of 3 seeds is their range and covers about 75%). Over tasks:
rliable's aggregates (Agarwal et al. 2021, never re-implemented here), computed only at
MIN_SEEDS_FOR_AGGREGATES seeds per task and beside their coverage in a simulation at the report's
own shape. The sentences the report draws from the numbers are decided here too, so that a claim
is made only where the numbers carry it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from primal_dt.tools.runs import ReportError, Row, unique

CONFIDENCE = 0.95  # every interval's nominal level
BOOTSTRAP_REPS = 2000  # bootstrap resamples of every rliable interval
BOOTSTRAP_SEED = 0  # numpy's global generator is seeded with it before every rliable estimate
METRICS = ("IQM", "mean", "optimality gap")
GAMMA = 100.0  # the optimality gap's threshold: an expert's normalised score
# At fewer seeds per task a stratified bootstrap interval covers far less often than its nominal
# level (simulated_coverage: 82% at 3 seeds x 4 tasks, 87% at 5 x 3, 92% at 10 x 4), so the report
# shows no aggregates there.
MIN_SEEDS_FOR_AGGREGATES = 5
MIN_TASKS_FOR_AGGREGATES = 2
# The simulation behind the coverage the report states: repetitions x bootstrap resamples, and
# the normal scores' task means and spreads, drawn anew for every repetition.
SIMULATION_REPS, SIMULATION_BOOTSTRAPS, SIMULATION_SEED = 500, 300, 0
SIMULATED_MEANS, SIMULATED_SPREADS = (20.0, 100.0), (5.0, 15.0)

Interval = tuple[float, float]


# ---- per task, over seeds ---------------------------------------------------------------------


def _student_t(quantile: float, df: int) -> float:
    try:
        from scipy import stats
    except ImportError:
        raise ReportError(
            "the report's intervals need scipy: pip install 'primal-dt[report]'"
        ) from None
    return float(stats.t.ppf(quantile, df))


def t_interval(values: Sequence[float], level: float = CONFIDENCE) -> Interval | None:
    """The Student's t interval of the mean of values (one task's scores over seeds):
    mean ± t(1 - (1 - level)/2, n - 1) · s / √n, s the sample std (ddof 1); None under 2 values."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    half = _student_t(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def sample_std(values: Sequence[float]) -> float | None:
    """The std of values with ddof 1 (None under 2 values)."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _fmt(interval: Interval) -> str:
    return f"[{interval[0]:.1f}, {interval[1]:.1f}]"


def compare_intervals(
    task: str, config: str, interval: Interval | None, baseline: str, base: Interval | None
) -> str:
    """The sentence two configs' 95% intervals on a task allow: above or below where they do not
    overlap, else that no difference was detected."""
    if interval is None or base is None:
        short = [c for c, i in ((config, interval), (baseline, base)) if i is None]
        return (
            f"{config} against {baseline} on {task}: no comparison, {' and '.join(short)} "
            f"{'has' if len(short) == 1 else 'have'} fewer than 2 seeds (no interval)."
        )
    if interval[0] > base[1] or interval[1] < base[0]:
        side = "above" if interval[0] > base[1] else "below"
        return (
            f"{config} scores {side} {baseline} on {task} (95% intervals {_fmt(interval)} and "
            f"{_fmt(base)} do not overlap)."
        )
    return (
        f"No difference between {config} and {baseline} was detected on {task} at this budget "
        f"(intervals {_fmt(interval)} and {_fmt(base)} overlap)."
    )


def compare_ranks(
    where: str,
    primal: tuple[str, float, float | None],
    softmax: tuple[str, float, float | None],
) -> str:
    """The sentence two blocks' rank_90 (mean, std over seeds) allow: which is lower only where
    the difference exceeds the sum of the stds. primal and softmax: (name, mean, std)."""
    (a, mean_a, std_a), (b, mean_b, std_b) = primal, softmax
    numbers = f"{a} {_spread(mean_a, std_a)}, {b} {_spread(mean_b, std_b)}"
    if std_a is None or std_b is None:
        return f"{where}: no difference detected ({numbers}; one seed: no spread to judge by)."
    if abs(mean_a - mean_b) > std_a + std_b:
        lower, higher = (a, b) if mean_a < mean_b else (b, a)
        return (
            f"{where}: {lower} has a lower rank_90 than {higher} ({numbers}: the difference "
            f"{abs(mean_a - mean_b):.1f} exceeds the stds' sum {std_a + std_b:.1f})."
        )
    return (
        f"{where}: no difference detected ({numbers}: the difference {abs(mean_a - mean_b):.1f} "
        f"is within the stds' sum {std_a + std_b:.1f})."
    )


def _spread(mean: float, std: float | None) -> str:
    return f"{mean:.1f}" if std is None else f"{mean:.1f} ± {std:.1f}"


# ---- over tasks: rliable ----------------------------------------------------------------------


def rliable_modules() -> tuple[Any, Any]:
    """(rliable.library, rliable.metrics)."""
    try:
        from rliable import library, metrics
    except ImportError:
        raise ReportError(
            "the report's confidence intervals need rliable: pip install 'primal-dt[report]'"
        ) from None
    return library, metrics


@contextmanager
def seeded(seed: int = BOOTSTRAP_SEED) -> Iterator[None]:
    """rliable draws its bootstrap resamples from numpy's global generator (not from the
    random_state it accepts): seed it, and put the caller's state back after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def estimate(
    scores: Any,
    func: Callable[..., np.ndarray],
    reps: int = BOOTSTRAP_REPS,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """rliable's (point estimates, stratified bootstrap 95% CIs (2, n)) of func on scores: a
    (seeds, tasks) matrix, or a list of them for a function of several (each resampled alone)."""
    library, _ = rliable_modules()
    with seeded(seed):
        points, intervals = library.get_interval_estimates(
            {"x": scores}, func, reps=reps, confidence_interval_size=CONFIDENCE
        )
    return np.asarray(points["x"]), np.asarray(intervals["x"])


def score_matrix(
    rows: list[Row],
    config: str,
    tasks: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> tuple[np.ndarray, list[str], list[str]]:
    """(scores, tasks, notes): config's normalised final scores as rliable takes them, a (seeds,
    tasks) matrix over its tasks with normalised scores (of those in tasks, where given; never
    those in exclude). A matrix holds as many scores per task as the task with fewest has: each
    task's first by seed; notes say which were left out."""
    mine = {
        row.task: row.final
        for row in rows
        if row.config == config and row.task != "average" and row.normalized and row.final
        if (tasks is None or row.task in tasks) and row.task not in exclude
    }
    if not mine:
        return np.zeros((0, 0)), [], []
    n = min(len(finals) for finals in mine.values())
    notes = [
        f"{task} ({config}): {len(finals) - n} of its {len(finals)} final scores left out of the "
        f"aggregates (rliable needs as many seeds on every task: it keeps the first {n} by seed)"
        for task, finals in mine.items()
        if len(finals) > n
    ]
    return np.array([finals[:n] for finals in mine.values()]).T, list(mine), notes


def _counts(rows: list[Row], config: str, tasks: list[str]) -> list[int]:
    counts = {row.task: len(row.final) for row in rows if row.config == config}
    return [counts.get(task, 0) for task in tasks]


def _too_few(rows: list[Row], configs: list[str], tasks: list[str]) -> dict[str, str]:
    """Per config of configs whose normalised final scores on tasks are too few for an aggregate:
    what it has, in words ("3 final scores on hopper-medium, 3 on walker2d-medium")."""
    if len(tasks) < MIN_TASKS_FOR_AGGREGATES:
        has = f"normalised final scores on {len(tasks)} task{'s' * (len(tasks) != 1)}"
        return dict.fromkeys(configs, has)
    found = {}
    for config in configs:
        counts = _counts(rows, config, tasks)
        if min(counts) < MIN_SEEDS_FOR_AGGREGATES:
            words = [f"{n} on {task}" for n, task in zip(counts, tasks, strict=True)]
            plural = "s" * (counts[0] != 1)
            found[config] = f"{counts[0]} final score{plural} on {tasks[0]}" + "".join(
                f", {w}" for w in words[1:]
            )
    return found


def shortfall(rows: list[Row], config: str, exclude: Collection[str] = ()) -> str | None:
    """What config lacks for its aggregates over tasks (see NEEDED), in words, or None."""
    tasks = score_matrix(rows, config, exclude=exclude)[1]
    return _too_few(rows, [config], tasks).get(config)


NEEDED = (
    f"they need at least {MIN_SEEDS_FOR_AGGREGATES} seeds of each config on each of at least "
    f"{MIN_TASKS_FOR_AGGREGATES} tasks (with fewer, a stratified bootstrap interval covers the "
    f"true value much less often than its nominal {CONFIDENCE:.0%})"
)


@dataclass
class Aggregate:
    """A config's IQM, mean and optimality gap (METRICS) over tasks of its normalised final scores."""

    config: str
    tasks: list[str]
    scores: np.ndarray  # (seeds, tasks)
    points: np.ndarray  # one per metric
    intervals: np.ndarray  # (2, metrics): lower and upper bounds

    def interval(self, metric: int) -> Interval:
        return float(self.intervals[0, metric]), float(self.intervals[1, metric])

    @property
    def shape(self) -> tuple[int, int]:
        seeds, tasks = self.scores.shape
        return int(seeds), int(tasks)

    @property
    def runs(self) -> str:
        seeds, tasks = self.shape
        return f"{self.scores.size} runs ({seeds} seed{'s' * (seeds > 1)} × {tasks} tasks)"


@dataclass
class Improvement:
    """P(a `better` run scores above a `baseline` run on the same task), averaged over tasks."""

    better: str
    baseline: str
    tasks: list[str]
    runs: tuple[int, int]  # better's, baseline's
    point: float
    interval: Interval


def _metrics(scores: np.ndarray) -> np.ndarray:
    _, metrics = rliable_modules()
    return np.array(
        [
            metrics.aggregate_iqm(scores),
            metrics.aggregate_mean(scores),
            metrics.aggregate_optimality_gap(scores, GAMMA),
        ]
    )


def aggregates(rows: list[Row], exclude: Collection[str] = ()) -> tuple[list[Aggregate], list[str]]:
    """(aggregates, notes): per config with at least MIN_SEEDS_FOR_AGGREGATES normalised final
    scores on each of at least MIN_TASKS_FOR_AGGREGATES tasks (never those in exclude), METRICS
    with stratified bootstrap 95% CIs (the others: shortfall says why not); notes say which
    scores were left out of those computed, and why."""
    notes = [
        f"{row.task} ({row.config}): no reference scores, so no normalised score: left out of the "
        "aggregates"
        for row in rows
        if row.task != "average" and not row.normalized
    ]
    found = []
    for config in unique([row.config for row in rows if row.task != "average"]):
        if shortfall(rows, config, exclude) is not None:
            continue
        scores, tasks, left_out = score_matrix(rows, config, exclude=exclude)
        notes += left_out
        found.append(Aggregate(config, tasks, scores, *estimate(scores, _metrics)))
    return found, notes


def improvement(
    rows: list[Row], better: str, baseline: str, exclude: Collection[str] = ()
) -> Improvement | str:
    """P(better > baseline) with its stratified bootstrap CI (rliable) over the tasks both ran
    with normalised final scores, or, in a sentence, why there is none."""
    _, both, _ = score_matrix(rows, better, score_matrix(rows, baseline, exclude=exclude)[1])
    missing = _too_few(rows, [better, baseline], both)
    if missing:
        has = "; ".join(f"{config}: {words}" for config, words in missing.items())
        if len(both) < MIN_TASKS_FOR_AGGREGATES:
            has = f"normalised final scores of both on {len(both)} task{'s' * (len(both) != 1)}"
        return (
            f"No probability of improvement P({better} > {baseline}): {NEEDED}, and these runs "
            f"have {has}."
        )
    x, y = score_matrix(rows, better, both)[0], score_matrix(rows, baseline, both)[0]
    _, metrics = rliable_modules()
    points, ci = estimate([x, y], lambda a, b: np.array([metrics.probability_of_improvement(a, b)]))
    interval = (float(ci[0, 0]), float(ci[1, 0]))
    return Improvement(better, baseline, both, (x.size, y.size), float(points[0]), interval)


@cache
def simulated_coverage(
    n_seeds: int,
    n_tasks: int,
    reps: int = SIMULATION_REPS,
    seed: int = SIMULATION_SEED,
    bootstraps: int = SIMULATION_BOOTSTRAPS,
) -> float:
    """How often the report's interval of a mean over tasks (rliable's stratified bootstrap 95%
    CI, as aggregates() computes it, at `bootstraps` resamples) covers the true mean, over `reps`
    simulated experiments of n_seeds normal scores on each of n_tasks tasks; every experiment
    draws its tasks' means (SIMULATED_MEANS) and spreads (SIMULATED_SPREADS) anew. Seeded."""
    _, metrics = rliable_modules()
    rng = np.random.default_rng(seed)

    def mean(scores: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_mean(scores)])

    covered = 0
    for rep in range(reps):
        means = rng.uniform(*SIMULATED_MEANS, size=n_tasks)
        spreads = rng.uniform(*SIMULATED_SPREADS, size=n_tasks)
        scores = rng.normal(means, spreads, size=(n_seeds, n_tasks))
        _, ci = estimate(scores, mean, reps=bootstraps, seed=seed * 1_000_003 + rep)
        covered += bool(ci[0, 0] <= means.mean() <= ci[1, 0])
    return covered / reps
