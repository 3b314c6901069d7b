"""`primal-dt report RUNS_DIR`: the paper's table and pictures from a directory of runs.

Every run directory under RUNS_DIR (a folder with config.json) is read: config.json for the task,
the config's name and its settings, eval.jsonl for scores, TensorBoard events for the KSVD loss,
ckpt.pt for the dataset, reference scores and the attention spectrum. Runs are grouped by the
(task, config name) their config.json records, never by folder names, and a group's seeds are the
train.seed each run's config.json records; a second run of the same (task, config, seed) is counted
once (the one trained furthest) and named in the notes. Per group, over seeds:

- final: the score of the final evaluation (eval.final_episodes episodes per target);
- best: the best score of any evaluation during training (a max over evaluations: optimistic).

A score is the best target's normalised score, 100 (R - R_random) / (R_expert - R_random), or its
return where no reference scores are known (marked). Missing pieces are marked, never fatal.

Intervals come from rliable (Agarwal et al. 2021), never re-implemented here: a 95% percentile
bootstrap CI of each group's final score over seeds; per config, the IQM, mean and optimality gap
of the normalised final scores over tasks with stratified bootstrap CIs; the probability that
primal-dt beats dt; performance profiles. BOOTSTRAP_REPS resamples, numpy's global generator seeded
with BOOTSTRAP_SEED before each estimate: the same runs give the same numbers. Where a task has a
counterpart in the Primal-Attention paper's D4RL table (paper_scores.toml), its numbers stand
beside ours.

Writes report.md, report.csv, curves_<task>.png, spectrum_<task>.png, for runs with a target
sweep return_curve_<task>.png, and with normalised scores on at least 2 tasks aggregates.png and
performance_profile.png.
"""

from __future__ import annotations

import csv
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import PrimalDTError
from primal_dt.data.episodes import ReferenceScores
from primal_dt.evaluation.conditioning import curve_points, read_curve
from primal_dt.method.registry import attention_label
from primal_dt.store.dashboards import copy_run, read_scalars, write_layout
from primal_dt.store.results import EvalRecord, read_results
from primal_dt.store.rundir import (
    RunDir,
    find_runs,
    read_run_config,
    read_snapshot,
    run_dir_name,
    safe_name,
)


class ReportError(PrimalDTError):
    """Nothing to report on, or rliable missing."""


BOOTSTRAP_REPS = 2000  # bootstrap resamples of every interval
BOOTSTRAP_SEED = 0  # numpy's global generator is seeded with it before every estimate
METRICS = ("IQM", "mean", "optimality gap")
GAMMA = 100.0  # the optimality gap's threshold: an expert's normalised score
BETTER, BASELINE = "primal-dt", "dt"  # the probability of improvement is P(BETTER > BASELINE)
NO_INTERVAL = "a confidence interval needs at least 2 seeds"


@dataclass
class RunSummary:
    """What the report needs from one run directory."""

    path: Path
    task: str
    config: str
    seed: int
    steps: int  # configured train.steps
    block_kinds: list[str]  # each block's attention (method/registry.py)
    step: int | None = None  # its checkpoint's
    final: float | None = None
    best: float | None = None
    normalized: bool = True  # scores are normalised (reference scores known)
    reference: str | None = None
    dataset_ids: list[str] = field(default_factory=list)
    scores: list[tuple[int, float]] = field(default_factory=list)  # (step, score) per evaluation
    ksvd: list[tuple[int, float]] = field(default_factory=list)
    spectra: list[np.ndarray] | None = None
    curve: EvalRecord | None = None  # the latest return-conditioning curve (conditioning.py)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(run_dir_name(self.task, self.config, self.seed))


def read_run(path: Path, spectra: bool = True) -> RunSummary:
    """The summary of one run directory; whatever is missing or broken becomes a note."""
    run_dir = RunDir(path)
    started = read_run_config(run_dir)
    summary = RunSummary(
        path=path,
        task=started.task,
        config=started.config_name,
        seed=started.config.train.seed,
        steps=started.config.train.steps,
        block_kinds=started.config.model.block_kinds(),
    )
    records = read_results(run_dir)
    good = [r for r in records if r.error is None]
    for record in records:
        if record.error is not None:
            summary.notes.append(f"evaluation at step {record.step} failed: {record.error}")
    summary.scores = [(r.step, r.score) for r in good if r.score is not None]
    finals = [r for r in good if r.final]
    if finals:
        summary.final = finals[-1].score
    else:
        summary.notes.append("no final evaluation")
    summary.best = max((score for _, score in summary.scores), default=None)
    if good:
        _describe_task(summary, good[-1].reference, good[-1].dataset_ids)
    ksvd = read_scalars(path).get("train/ksvd_loss", [])
    summary.ksvd = [(step, value) for step, value, _ in ksvd]
    summary.curve = read_curve(run_dir)
    if not run_dir.checkpoint.exists():
        summary.notes.append("no checkpoint")
        return summary
    try:
        snapshot = read_snapshot(run_dir.checkpoint)
    except PrimalDTError as err:
        summary.notes.append(str(err))
        return summary
    summary.step = snapshot.step
    if finals and finals[-1].step != summary.step:
        summary.notes.append(
            f"final evaluation at step {finals[-1].step}, checkpoint at {summary.step}"
        )
    _describe_task(summary, snapshot.task.reference, list(snapshot.task.dataset_ids))
    if spectra:
        from primal_dt.evaluation.spectrum import checkpoint_spectra

        try:
            summary.spectra = checkpoint_spectra(run_dir, snapshot)
        except (PrimalDTError, OSError, RuntimeError, KeyError) as err:
            summary.notes.append(f"no attention spectrum: {type(err).__name__}: {err}")
    return summary


def _describe_task(summary: RunSummary, reference: ReferenceScores | None, ids: list[str]) -> None:
    summary.normalized = reference is not None
    summary.reference = reference.source if reference else None
    summary.dataset_ids = list(ids)


def collect(runs_dir: Path, skip: Path | None = None, spectra: bool = True) -> list[RunSummary]:
    """Every run under runs_dir (folders holding config.json), except those under skip."""
    if not runs_dir.is_dir():
        raise ReportError(
            f"{runs_dir} is not a directory; give the folder a sweep wrote its runs to"
        )
    folders = [
        path
        for path in find_runs(runs_dir)
        if skip is None or skip.resolve() not in [path.resolve(), *path.resolve().parents]
    ]
    if not folders:
        raise ReportError(
            f"no runs under {runs_dir} (no run directory with a "
            f"{RunDir(runs_dir).config_file.name}); train some with "
            f"primal-dt sweep --runs-dir {runs_dir} first"
        )
    summaries = []
    for folder in folders:
        try:
            summaries.append(read_run(folder, spectra))
        except PrimalDTError as err:  # not a primal-dt run after all
            print(f"skipping {folder}: {err}", file=sys.stderr)
    return summaries


def distinct(summaries: list[RunSummary]) -> tuple[list[RunSummary], list[RunSummary]]:
    """(the runs to count, the duplicates left out): of the runs of one (task, config, seed), the
    one trained furthest (its checkpoint's step, then a final evaluation) is counted, the first by
    path among equals; it gets a note naming the folders of the others."""
    same: dict[tuple[str, str, int], list[RunSummary]] = {}
    for summary in sorted(summaries, key=lambda r: r.path):
        same.setdefault((summary.task, summary.config, summary.seed), []).append(summary)
    kept, left_out = [], []
    for members in same.values():
        best = max(members, key=lambda r: (r.step or 0, r.final is not None))
        others = [r for r in members if r is not best]
        if others:
            folders = ", ".join(str(r.path) for r in others)
            best.notes.append(f"same task, config and seed as {folders}: counted once, as this run")
        kept.append(best)
        left_out += others
    return kept, left_out


@dataclass
class Row:
    """One line of the table: a (task, config) group, or a config's average over tasks."""

    task: str
    config: str
    seeds: list[int]
    final: list[float]
    best: list[float]
    steps: list[int]
    normalized: bool
    references: list[str]
    datasets: list[str]
    average_of: int = 0  # tasks averaged (average rows only)


def _unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def group(summaries: list[RunSummary]) -> list[Row]:
    """A row per (task, config) in task then config order, then an average row per config: the mean
    over tasks of each task's mean over seeds (the paper's "average")."""
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        groups.setdefault((summary.task, summary.config), []).append(summary)
    rows = []
    for (task, config), members in groups.items():
        rows.append(
            Row(
                task=task,
                config=config,
                seeds=[r.seed for r in members],
                final=[r.final for r in members if r.final is not None],
                best=[r.best for r in members if r.best is not None],
                steps=_unique([r.step if r.step is not None else r.steps for r in members]),
                normalized=all(r.normalized for r in members),
                references=_unique([r.reference for r in members if r.reference]),
                datasets=_unique([" + ".join(r.dataset_ids) for r in members if r.dataset_ids]),
            )
        )
    for config in _unique([row.config for row in rows]):
        mine = [row for row in rows if row.config == config and row.normalized]
        rows.append(
            Row(
                task="average",
                config=config,
                seeds=[],
                final=[float(np.mean(row.final)) for row in mine if row.final],
                best=[float(np.mean(row.best)) for row in mine if row.best],
                steps=[],
                normalized=True,
                references=[],
                datasets=[],
                average_of=len(mine),
            )
        )
    return rows


def _rliable() -> tuple[Any, Any]:
    """(rliable.library, rliable.metrics)."""
    try:
        from rliable import library, metrics
    except ImportError:
        raise ReportError(
            "the report's confidence intervals need rliable: pip install 'primal-dt[report]'"
        ) from None
    return library, metrics


@contextmanager
def _seeded() -> Iterator[None]:
    """rliable draws its bootstrap resamples from numpy's global generator (not from the
    random_state it accepts): seed it with BOOTSTRAP_SEED, and put the caller's state back after."""
    state = np.random.get_state()
    np.random.seed(BOOTSTRAP_SEED)
    try:
        yield
    finally:
        np.random.set_state(state)


def _estimate(scores: Any, func: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """rliable's (point estimates, 95% CIs (2, n)) of func on scores: a (seeds, tasks) matrix, or
    a list of them for a function of several (each resampled on its own)."""
    library, _ = _rliable()
    with _seeded():
        points, intervals = library.get_interval_estimates(
            {"x": scores}, func, reps=BOOTSTRAP_REPS, confidence_interval_size=0.95
        )
    return np.asarray(points["x"]), np.asarray(intervals["x"])


def seed_interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% bootstrap CI of the mean of values (one task's scores over seeds); None under 2."""
    if len(values) < 2:
        return None
    _, metrics = _rliable()
    _, ci = _estimate(np.array(values)[:, None], lambda s: np.array([metrics.aggregate_mean(s)]))
    return float(ci[0, 0]), float(ci[1, 0])


def score_matrix(
    rows: list[Row], config: str, tasks: list[str] | None = None
) -> tuple[np.ndarray, list[str], list[str]]:
    """(scores, tasks, notes): config's normalised final scores as rliable takes them, a (seeds,
    tasks) matrix over its tasks with normalised scores (of those in tasks, where given). A matrix
    holds as many scores per task as the task with fewest has: each task's first by seed; notes
    say which were left out."""
    mine = {
        row.task: row.final
        for row in rows
        if row.config == config and row.task != "average" and row.normalized and row.final
        if tasks is None or row.task in tasks
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


@dataclass
class Aggregate:
    """A config's IQM, mean and optimality gap (METRICS) over tasks of its normalised final scores."""

    config: str
    tasks: list[str]
    scores: np.ndarray  # (seeds, tasks)
    points: np.ndarray  # one per metric
    intervals: np.ndarray | None  # (2, metrics): lower and upper bounds; None with one seed

    def interval(self, metric: int) -> tuple[float, float] | None:
        if self.intervals is None:
            return None
        return float(self.intervals[0, metric]), float(self.intervals[1, metric])

    @property
    def runs(self) -> str:
        seeds, tasks = self.scores.shape
        return f"{self.scores.size} runs ({seeds} seed{'s' * (seeds > 1)} × {tasks} tasks)"


@dataclass
class Improvement:
    """P(a BETTER run scores above a BASELINE run on the same task), averaged over tasks."""

    tasks: list[str]
    runs: tuple[int, int]  # BETTER's, BASELINE's
    point: float
    interval: tuple[float, float] | None  # None under 2 seeds of either config


def aggregates(rows: list[Row]) -> tuple[list[Aggregate], list[str]]:
    """(aggregates, notes): per config with normalised final scores on at least 2 tasks, METRICS
    with stratified bootstrap 95% CIs (with at least 2 seeds per task); notes say what was left
    out and why."""
    _, metrics = _rliable()

    def func(scores: np.ndarray) -> np.ndarray:
        return np.array([
            metrics.aggregate_iqm(scores), metrics.aggregate_mean(scores),
            metrics.aggregate_optimality_gap(scores, GAMMA),
        ])  # fmt: skip

    notes = [
        f"{row.task} ({row.config}): no reference scores, so no normalised score: left out of the "
        "aggregates"
        for row in rows
        if row.task != "average" and not row.normalized
    ]
    found = []
    for config in _unique([row.config for row in rows if row.task != "average"]):
        scores, tasks, left_out = score_matrix(rows, config)
        notes += left_out
        if len(tasks) < 2:
            notes.append(
                f"{config}: no aggregates: they need normalised final scores on at least 2 "
                f"tasks, and it has them on {len(tasks)}"
            )
        elif len(scores) < 2:
            found.append(Aggregate(config, tasks, scores, func(scores), None))
            notes.append(f"{config}: point estimates only: {NO_INTERVAL} per task, and it has 1")
        else:
            found.append(Aggregate(config, tasks, scores, *_estimate(scores, func)))
    return found, notes


def improvement(rows: list[Row]) -> Improvement | str:
    """P(BETTER > BASELINE) with its CI (rliable) over the tasks both ran with normalised final
    scores, or why there is none."""
    configs = {row.config for row in rows}
    if not {BETTER, BASELINE} <= configs:
        return f"no probability of improvement: it needs runs of both {BETTER} and {BASELINE}"
    _, both, _ = score_matrix(rows, BETTER, score_matrix(rows, BASELINE)[1])
    if not both:
        return (
            f"no probability of improvement: {BETTER} and {BASELINE} have normalised final scores "
            "on no task in common"
        )
    x, y = score_matrix(rows, BETTER, both)[0], score_matrix(rows, BASELINE, both)[0]
    _, metrics = _rliable()
    if len(x) < 2 or len(y) < 2:
        point = float(metrics.probability_of_improvement(x, y))
        return Improvement(both, (x.size, y.size), point, None)
    points, ci = _estimate(
        [x, y], lambda a, b: np.array([metrics.probability_of_improvement(a, b)])
    )
    return Improvement(both, (x.size, y.size), float(points[0]), (ci[0, 0], ci[1, 0]))


def _interval(point: float, interval: tuple[float, float] | None, digits: int = 1) -> str:
    if interval is None:
        return f"{point:.{digits}f}"
    low, high = interval
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def aggregates_section(rows: list[Row]) -> tuple[str, list[Aggregate]]:
    """report.md's aggregates: a table of METRICS per config, the probability of improvement and
    what could not be computed, in words."""
    found, notes = aggregates(rows)
    lines = [
        "## Aggregates over tasks",
        "",
        "Normalised final scores only (tasks without reference scores are left out). Per config "
        "over its tasks: the interquartile mean (IQM, the mean of the middle 50% of all its "
        f"runs' scores), the mean and the optimality gap ({GAMMA:g} minus the mean of the scores "
        f"clipped at {GAMMA:g}: lower is better), each with its 95% stratified bootstrap "
        f"confidence interval [low, high] (rliable; {BOOTSTRAP_REPS} resamples, numpy's generator "
        f"seeded with {BOOTSTRAP_SEED}).",
        "",
    ]
    if found:
        lines += ["| config | tasks | runs | " + " | ".join(METRICS) + " |", "|---" * 6 + "|"]
        for agg in found:
            cells = [agg.config, ", ".join(agg.tasks), agg.runs]
            cells += [_interval(agg.points[i], agg.interval(i)) for i in range(len(METRICS))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    better = improvement(rows)
    if isinstance(better, str):
        lines.append(better[0].upper() + better[1:] + ".")
    else:
        tasks = len(better.tasks)
        lines.append(
            f"**Probability of improvement** P({BETTER} > {BASELINE}), the chance that a "
            f"{BETTER} run scores above a {BASELINE} run on the same task, averaged over the "
            f"{tasks} task{'s' * (tasks > 1)} both ran ({', '.join(better.tasks)}; "
            f"{better.runs[0]} {BETTER} and {better.runs[1]} {BASELINE} runs): "
            + _interval(better.point, better.interval, 2)
            + ("." if better.interval else f"; {NO_INTERVAL} of each config per task.")
        )
    if notes:
        lines += ["", *[f"- {note}" for note in _unique(notes)]]
    return "\n".join(lines), found


def aggregate_figures(found: list[Aggregate], out: Path) -> list[tuple[Path, str]]:
    """aggregates.png and performance_profile.png with their captions, where found has any."""
    if not found:
        return []
    from primal_dt.evaluation.plots import interval_figure, profile_figure, save

    library, _ = _rliable()
    runs = sum(agg.scores.size for agg in found)
    counts = "; ".join(f"{agg.config}: {agg.runs}" for agg in found)
    bootstrap = f"{BOOTSTRAP_REPS} resamples, seed {BOOTSTRAP_SEED}"
    # Each config's points as a list (of the same numpy floats): interval_figure reads a Sequence.
    points: dict[str, Sequence[float]] = {agg.config: list(agg.points) for agg in found}
    intervals = {agg.config: agg.intervals for agg in found}
    some = any(agg.intervals is not None for agg in found)
    title = "normalised final score over tasks: point estimates" + " and 95% CIs" * some
    figure = interval_figure(title, list(METRICS), points, intervals, "normalised score")
    written = [(
        save(figure, out / "aggregates.png"),
        f"IQM, mean and optimality gap of the normalised final scores per config (bar: the 95% "
        f"stratified bootstrap CI, {bootstrap}; black line: the point estimate; no bar with one "
        f"seed per task), from {runs} runs ({counts}).",
    )]  # fmt: skip
    every = np.concatenate([agg.scores.ravel() for agg in found])
    taus = np.linspace(min(0.0, every.min()), max(GAMMA, every.max()), 101)
    profiles, bands = {}, {}
    for agg in found:
        with _seeded():
            profile, band = library.create_performance_profile(
                {"x": agg.scores}, taus, reps=BOOTSTRAP_REPS
            )
        label = f"{agg.config} ({agg.scores.size} runs)"
        profiles[label] = profile["x"]
        bands[label] = band["x"] if len(agg.scores) > 1 else None
    figure = profile_figure("performance profile: normalised final score", taus, profiles, bands)
    written.append((
        save(figure, out / "performance_profile.png"),
        f"Performance profiles: the fraction of a config's runs whose normalised final score is "
        f"above each score τ (band: its 95% stratified bootstrap CI, {bootstrap}; none with one "
        f"seed per task), from {runs} runs ({counts}).",
    ))  # fmt: skip
    return written


@dataclass(frozen=True)
class PaperScores:
    """The Primal-Attention paper's D4RL table (paper_scores.toml): not ours, for comparison."""

    source: str
    measured_on: str
    seeds: int
    dt_column: str  # what its DT column is
    columns: dict[str, str]  # our config name -> its column
    scores: dict[str, dict[str, float]]  # task -> column -> normalised score
    spread: dict[str, dict[str, float]]  # task -> column -> the ± printed beside it
    average: dict[str, float]  # column -> its average over the tasks of scores
    average_spread: dict[str, float]

    def cell(self, task: str, config: str) -> str:
        """The paper's score(s) for our row, with their ±: config's column, or every column for
        other configs."""
        if task == "average":
            scores, spread = self.average, self.average_spread
        else:
            scores, spread = self.scores.get(task, {}), self.spread.get(task, {})
        columns = [self.columns[config]] if config in self.columns else list(scores)
        return " / ".join(
            f"{column} {scores[column]:.1f} ± {spread[column]:.1f}"
            for column in columns
            if column in scores
        )

    def note(self) -> str:
        return (
            f"{self.source}. Measured on {self.measured_on}; ours on the Minari v5 dataset named "
            f"in the row, evaluated in gymnasium v5 environments. {self.dt_column}"
        )


@cache
def paper_scores() -> PaperScores:
    """paper_scores.toml, beside this module."""
    data = tomllib.loads(Path(__file__).with_name("paper_scores.toml").read_text())
    return PaperScores(
        source=data["source"],
        measured_on=data["measured_on"],
        seeds=int(data["seeds"]),
        dt_column=data["dt_column"],
        columns=dict(data["columns"]),
        scores=_table(data["scores"]),
        spread=_table(data["spread"]),
        average={column: float(v) for column, v in data["average"].items()},
        average_spread={column: float(v) for column, v in data["average_spread"].items()},
    )


def _table(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {task: {k: float(v) for k, v in row.items()} for task, row in rows.items()}


def _paper_cell(row: Row, rows: list[Row]) -> str:
    """The paper's numbers for row; for an average row, only where ours averages the paper's
    tasks, every one of them."""
    paper = paper_scores()
    if row.task == "average":
        tasks = {r.task for r in rows if r.config == row.config and r.normalized and r.final}
        if tasks - {"average"} != set(paper.scores) or len(row.final) != len(paper.scores):
            return ""
    return paper.cell(row.task, row.config)


def _cell(values: list[float], expected: int, average: bool) -> str:
    if not values:
        return "n/a"
    if average:
        text = f"{np.mean(values):.1f}"
        return text if len(values) == expected else f"{text} ({len(values)} of {expected} tasks)"
    text = f"{np.mean(values):.1f} ± {np.std(values):.1f}"
    return text if len(values) == expected else f"{text} ({len(values)} of {expected} seeds)"


def _ci_cell(row: Row) -> str:
    if row.task == "average":
        return "see Aggregates"
    interval = seed_interval(row.final)
    if interval is None:
        return NO_INTERVAL
    return f"[{interval[0]:.1f}, {interval[1]:.1f}]"


def markdown_table(rows: list[Row]) -> str:
    """The table, with each distinct reference-score source as a numbered note below it, and the
    Primal-Attention paper's numbers (note [P]) where a row's task has a counterpart there."""
    paper = [_paper_cell(row, rows) for row in rows]
    header = ["task", "config", "seeds", "final", "final 95% CI", "best"]
    header += ["paper (D4RL v2, gym v3) [P]"] if any(paper) else []
    header += ["steps", "reference scores", "dataset"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources: list[str] = []
    for row, theirs in zip(rows, paper, strict=True):
        average = row.task == "average"
        expected = row.average_of if average else len(row.seeds)
        final, best = _cell(row.final, expected, average), _cell(row.best, expected, average)
        if not row.normalized:
            final, best = f"{final} (return)", f"{best} (return)"
        sources += [source for source in row.references if source not in sources]
        notes = " ".join(f"[{sources.index(source) + 1}]" for source in row.references)
        cells = [
            f"**{row.task}**" if average else row.task,
            row.config,
            ",".join(map(str, row.seeds)),
            final,
            _ci_cell(row),
            best,
            *([theirs] if any(paper) else []),
            ",".join(map(str, row.steps)),
            notes or ("" if average else "none"),
            "; ".join(row.datasets),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] {source}  " for i, source in enumerate(sources, 1)]
    if any(paper):
        lines.append(f"[P] {paper_scores().note()}  ")
    return "\n".join(lines).rstrip()


def _stats(values: list[float], average: bool) -> list[Any]:
    """n, mean and std for the CSV; an average row's std is left empty (it is not over seeds)."""
    if not values:
        return [0, "", ""]
    return [len(values), f"{np.mean(values):.4f}", "" if average else f"{np.std(values):.4f}"]


def write_csv(rows: list[Row], path: Path) -> Path:
    """The table as CSV; for average rows n_final and n_best count tasks, not seeds. final_ci_*:
    the final score's 95% bootstrap CI over seeds (empty under 2 seeds and for average rows);
    paper: the Primal-Attention paper's numbers, as in report.md."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([
            "task", "config", "seeds", "n_final", "final_mean", "final_std", "final_ci_low",
            "final_ci_high", "n_best", "best_mean", "best_std", "normalized", "paper", "steps",
            "reference_source", "dataset_ids",
        ])  # fmt: skip
        for row in rows:
            average = row.task == "average"
            ci = None if average else seed_interval(row.final)
            writer.writerow([
                row.task, row.config, " ".join(map(str, row.seeds)), *_stats(row.final, average),
                *(["", ""] if ci is None else [f"{ci[0]:.4f}", f"{ci[1]:.4f}"]),
                *_stats(row.best, average), row.normalized, _paper_cell(row, rows),
                " ".join(map(str, row.steps)), "; ".join(row.references), "; ".join(row.datasets),
            ])  # fmt: skip
    return path


def spectrum_table(summaries: list[RunSummary]) -> str:
    """Per task, config and block: how many singular values hold 90% of their sum."""
    from primal_dt.evaluation.spectrum import rank_at

    groups: dict[tuple[str, str, int], list[int]] = {}
    kinds: dict[tuple[str, str, int], str] = {}
    sizes: dict[tuple[str, str, int], int] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        for block, curve in enumerate(summary.spectra or []):
            key = (summary.task, summary.config, block)
            groups.setdefault(key, []).append(rank_at(curve))
            kinds[key] = attention_label(summary.block_kinds[block])
            sizes[key] = len(curve)
    lines = [
        "| task | config | block | attention | singular values for 90% (mean ± std) | of |",
        "|---|---|---|---|---|---|",
    ]
    for key, ranks in groups.items():
        task, config, block = key
        lines.append(
            f"| {task} | {config} | {block} | {kinds[key]} | {np.mean(ranks):.1f} ± "
            f"{np.std(ranks):.1f} | {sizes[key]} |"
        )
    return "\n".join(lines)


def figures(summaries: list[RunSummary], out: Path) -> list[Path]:
    """curves_<task>.png, return_curve_<task>.png (where runs have a target sweep) and
    spectrum_<task>.png for every task."""
    from primal_dt.evaluation.plots import (
        Series,
        conditioning_figure,
        curves_figure,
        save,
        spectra_figure,
    )

    written = []
    for task in _unique(sorted(r.task for r in summaries)):
        mine = sorted((r for r in summaries if r.task == task), key=lambda r: (r.config, r.seed))
        configs = _unique([r.config for r in mine])
        scores: dict[str, list[Series]] = {
            c: [r.scores for r in mine if r.config == c] for c in configs
        }
        ksvd: dict[str, list[Series]] = {
            c: [r.ksvd for r in mine if r.config == c and "primal" in r.block_kinds]
            for c in configs
        }
        label = "normalised score" if all(r.normalized for r in mine) else "score (return)"
        figure = curves_figure(task, scores, ksvd, label)
        written.append(save(figure, out / f"curves_{safe_name(task)}.png"))
        # (config, curve) pairs, so that the curves are known not to be None
        with_curves = [(r.config, r.curve) for r in mine if r.curve is not None]
        if with_curves:
            panels = {c: [curve_points(curve) for name, curve in with_curves if name == c]
                      for c in configs if any(name == c for name, _ in with_curves)}  # fmt: skip
            reference = with_curves[0][1].reference
            title = f"{task}: achieved against target return"
            figure = conditioning_figure(panels, title, reference)
            written.append(save(figure, out / f"return_curve_{safe_name(task)}.png"))
        # (run, spectra) pairs, so that the spectra are known not to be None
        with_spectra = [(r, r.spectra) for r in mine if r.spectra]
        if not with_spectra:
            continue
        blocks = []
        for block in range(max(len(spectra) for _, spectra in with_spectra)):
            curves = {}
            for config in configs:
                here = [(r, spectra) for r, spectra in with_spectra
                        if r.config == config and block < len(spectra)]  # fmt: skip
                if here:
                    kind = attention_label(here[0][0].block_kinds[block])
                    curves[f"{config} ({kind})"] = [spectra[block] for _, spectra in here]
            blocks.append((f"block {block}", curves))
        written.append(save(spectra_figure(task, blocks), out / f"spectrum_{safe_name(task)}.png"))
    return written


def write_report(runs_dir: Path, out: Path | None = None) -> tuple[str, list[Path]]:
    """Write the report's files into out (default RUNS_DIR/report); returns report.md's text and
    the paths written. Also refreshes RUNS_DIR's TensorBoard dashboards (dashboards.py)."""
    out = out or runs_dir / "report"
    found = collect(runs_dir, skip=out)
    counted_once, left_out = distinct(found)
    out.mkdir(parents=True, exist_ok=True)
    rows = group(counted_once)
    written = [write_csv(rows, out / "report.csv"), *figures(counted_once, out)]
    images = [f"![{p.stem}]({p.name})" for p in written if p.suffix == ".png"]
    section, summed = aggregates_section(rows)
    captioned = aggregate_figures(summed, out)
    written += [path for path, _ in captioned]
    section += "".join(f"\n\n![{p.stem}]({p.name})\n\n*{p.name}*: {text}" for p, text in captioned)
    if not captioned:
        section += (
            "\n\nNo aggregate figures: they need normalised final scores on at least 2 tasks."
        )
    notes = [f"- {r.name} ({r.path}): {note}" for r in counted_once for note in r.notes]
    counted = f"{len(counted_once)} runs"
    if left_out:
        counted += f" ({len(left_out)} duplicate{'s' * (len(left_out) > 1)} left out, see Notes)"
    text = "\n\n".join(
        [
            f"# primal-dt report: {runs_dir}",
            f"{counted}. Score: the normalised score of the best evaluation target, "
            f"100 (R - R_random) / (R_expert - R_random); mean ± std over seeds (numpy, ddof 0). "
            f"**final**: the final evaluation; **final 95% CI**: the percentile bootstrap "
            f"confidence interval of its mean over seeds (rliable; {BOOTSTRAP_REPS} resamples, "
            f"numpy's generator seeded with {BOOTSTRAP_SEED}, so the same runs give the same "
            f"numbers); **best**: the best evaluation during training (a max over evaluations, so "
            f"optimistic). **average**: the mean over tasks of each task's mean. **paper**, where "
            f"a task has a counterpart in the Primal-Attention paper's D4RL table: its score for "
            f"the row's config (dt: its DT column, primal-dt: its Primal.+DT column), see [P].",
            markdown_table(rows),
            section,
            "## Attention spectrum\n\nNormalised cumulative singular values of each block's "
            "attention output on fixed windows of the task's dataset (the same windows for every "
            "run of a task; see primal_dt/evaluation/spectrum.py), from each run's last checkpoint: the "
            "fewer singular values hold 90% of the sum, the lower the rank.",
            spectrum_table(counted_once),
            "## Figures\n\n" + "\n".join(images),
            "## Notes\n\n" + ("\n".join(notes) or "none"),
        ]
    )
    (out / "report.md").write_text(text + "\n")
    written.insert(0, out / "report.md")
    write_layout(runs_dir, [summary.task for summary in found])
    for summary in found:
        copy_run(summary.path, summary.task)
    return markdown_table(rows), written
