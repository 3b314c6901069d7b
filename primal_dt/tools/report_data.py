"""report.json: the figures the report's text shows, as data, by name, beside report.md, for
whoever reads a study's results without parsing prose (scripts/results.py, people with their own
plots). One dataclass (ReportData), one writer and one reader.

It holds, from the same functions the text is written from: what the runs were (tasks, configs,
seeds, machines, precision, batch sizes, the steps they trained and the minutes it took, from
config.json, the checkpoints and training.jsonl); each task's and config's final scores per seed;
the paired differences of every config against the baseline, per task and over tasks, on the
final scores and on the last quarter's means (paired.py: mean, t interval, the difference the
study detects at POWER, the seeds TARGET points would need); whether each curve is flat
(flatness.py); the baseline beside CORL's DT (corl.py); each config's aggregates over tasks
(statistics.py: IQM, mean and optimality gap with their intervals); and report.md's sections,
each by its heading with the figures it shows, for pages that show some of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primal_dt.store.training_log import union_minutes
from primal_dt.tools.corl import CorlRow, corl_rows, corl_scores
from primal_dt.tools.flatness import Flatness, flatness
from primal_dt.tools.paired import (
    POWER,
    TARGET,
    Paired,
    PairedOverTasks,
    holm,
    last_quarter_differences,
    paired_differences,
    paired_over_tasks,
)
from primal_dt.tools.runs import ReportError, Row, RunSummary, task_references, unique
from primal_dt.tools.statistics import METRICS, Aggregate

VERSION = 4


@dataclass
class StudyFacts:
    """What the runs were, and what they cost."""

    tasks: list[str]
    configs: list[str]
    seeds: list[int]
    machines: list[str]  # as config.json records them: another CPU gives other bits
    precisions: list[str]  # train.precision as resolved
    batch_sizes: list[int]
    steps: int  # the steps every run trained, summed (each checkpoint's)
    # minutes during which some run trained: the union of every session of every run (each
    # from its start to its last log or evaluation), so the same when the report is made again
    # and no idle time counted where a study ran in parts; None where no run logged its sessions
    minutes: float | None


@dataclass
class FlatnessResult:
    """One curve's change between the last two quarters (flatness.Flatness)."""

    task: str
    config: str
    slopes: list[float]  # per seed, points per 1,000 steps
    mean: float
    interval: tuple[float, float]  # 95%
    equivalence: tuple[float, float]  # 90%: flat where inside ±flatness.FLAT_MARGIN
    flat: bool
    verdict: str


@dataclass
class CorlResult:
    """One task of the side table against CORL's DT (corl.CorlRow)."""

    task: str
    steps: list[int]
    parameters: list[int]
    mean: float
    interval: tuple[float, float] | None
    corl_last: tuple[float, float]
    corl_best: tuple[float, float]
    mean_d4rl: float | None  # the mean on D4RL's reference scores, CORL's scale
    fraction: float  # on D4RL's scale (on ours where there is none)


@dataclass
class ReportSection:
    """One section of report.md: its heading (without the ##), its Markdown, and the figures
    (file names beside report.md) it shows."""

    heading: str
    body: str
    figures: list[str] = field(default_factory=list)


@dataclass
class TaskScores:
    """One config's final scores on one task, seed by seed."""

    task: str
    config: str
    seeds: list[int]
    scores: list[float | None]  # per seed, None where a run has no final score
    normalized: bool


@dataclass
class PairedResult:
    """One task's paired differences, config − baseline (paired.Paired), and what they allow."""

    task: str
    config: str
    baseline: str
    seeds: list[int]
    differences: list[float]
    mean: float
    interval: tuple[float, float] | None  # Student's t, 95%
    p_value: float | None  # the paired t-test's, two-sided
    holm_p: float | None  # Holm-adjusted over its family (every config and task of its section)
    detectable: float | None  # the smallest true difference detected with POWER
    detectable_at_most: float | None  # the same, were the std at the top of its 95% interval
    seeds_for_target: int | None  # the seeds TARGET points would need


@dataclass
class OverTasks:
    """A config's mean paired difference over tasks (paired.PairedOverTasks)."""

    config: str
    baseline: str
    tasks: list[str]
    pairs: int
    point: float
    interval: tuple[float, float]  # Student's t, 95%, on each seed's mean over the tasks
    p_value: float
    detectable: float
    detectable_at_most: float
    seeds_for_target: int | None
    std: float  # of each seed's mean over the tasks


@dataclass
class AggregateResult:
    """A config's aggregates over tasks (statistics.Aggregate): each metric's point and interval."""

    config: str
    tasks: list[str]
    seeds: int
    points: dict[str, float]
    intervals: dict[str, tuple[float, float]]


@dataclass
class ReportData:
    """Everything report.json holds (the module docstring)."""

    dirs: list[str]
    runs: int
    baseline: str | None
    study: StudyFacts | None = None
    lead: str = ""  # the line under report.md's title: the runs counted
    power: float = POWER
    target: float = TARGET
    scores: list[TaskScores] = field(default_factory=list)
    paired: list[PairedResult] = field(default_factory=list)
    over_tasks: list[OverTasks] = field(default_factory=list)
    last_quarter: list[PairedResult] = field(default_factory=list)
    last_quarter_over_tasks: list[OverTasks] = field(default_factory=list)
    aggregates: list[AggregateResult] = field(default_factory=list)
    flatness: list[FlatnessResult] = field(default_factory=list)
    corl: list[CorlResult] = field(default_factory=list)
    sections: list[ReportSection] = field(default_factory=list)
    version: int = VERSION

    def section(self, heading: str) -> ReportSection | None:
        """The section of that heading, or None where report.md has none."""
        return next((s for s in self.sections if s.heading == heading), None)


def _paired(pairs: list[Paired]) -> list[PairedResult]:
    """One family of per-task tests, each with its Holm-adjusted p-value."""
    return [
        PairedResult(
            found.task,
            found.config,
            found.baseline,
            list(found.seeds),
            [float(d) for d in found.differences],
            found.mean,
            found.interval,
            found.p_value,
            adjusted,
            found.detectable,
            found.detectable_at_most,
            found.seeds_for_target,
        )
        for found, adjusted in zip(pairs, holm([p.p_value for p in pairs]), strict=True)
    ]


def _over(found: PairedOverTasks) -> OverTasks:
    return OverTasks(**dataclasses.asdict(found))


def _aggregate(found: Aggregate) -> AggregateResult:
    return AggregateResult(
        found.config,
        list(found.tasks),
        found.shape[0],
        {name: float(found.points[i]) for i, name in enumerate(METRICS)},
        {name: found.interval(i) for i, name in enumerate(METRICS)},
    )


def _flatness(found: Flatness) -> FlatnessResult:
    fields = dataclasses.asdict(found)
    return FlatnessResult(**fields, mean=found.mean, flat=found.flat, verdict=found.verdict)


def _corl(found: CorlRow) -> CorlResult:
    return CorlResult(**dataclasses.asdict(found), fraction=found.fraction)


def study_facts(summaries: list[RunSummary]) -> StudyFacts:
    """StudyFacts of the runs counted."""
    sessions = [span for run in summaries for span in run.sessions]
    return StudyFacts(
        tasks=unique(sorted(run.task for run in summaries)),
        configs=unique(sorted(run.config for run in summaries)),
        seeds=sorted({run.seed for run in summaries}),
        machines=sorted({machine for run in summaries for machine in run.machines}),
        precisions=sorted({run.precision for run in summaries if run.precision}),
        batch_sizes=sorted({run.batch_size for run in summaries if run.batch_size}),
        steps=sum(run.step or 0 for run in summaries),
        minutes=union_minutes(sessions) if sessions else None,
    )


def report_data(
    dirs: list[Path],
    rows: list[Row],
    summaries: list[RunSummary],
    baseline: str | None,
    aggregates: list[Aggregate],
) -> ReportData:
    """The report's figures, from what its sections are written from."""
    data = ReportData([str(d) for d in dirs], len(summaries), baseline, study_facts(summaries))
    tasks = [row for row in rows if row.task != "average"]
    data.scores = [
        TaskScores(row.task, row.config, list(row.seeds), list(row.per_seed), row.normalized)
        for row in tasks
    ]
    configs = [c for c in unique([row.config for row in tasks]) if c != baseline]
    finals: list[Paired] = []
    lates: list[Paired] = []
    for config in configs if baseline is not None else []:
        assert baseline is not None
        pairs = paired_differences(rows, config, baseline)
        late = last_quarter_differences(summaries, config, baseline)
        finals, lates = finals + pairs, lates + late
        data.over_tasks += [_over(o) for o in [paired_over_tasks(pairs)] if o is not None]
        data.last_quarter_over_tasks += [
            _over(o) for o in [paired_over_tasks(late)] if o is not None
        ]
    data.paired, data.last_quarter = _paired(finals), _paired(lates)
    data.aggregates = [_aggregate(found) for found in aggregates]
    data.flatness = [_flatness(found) for found in flatness(summaries)]
    references = task_references(summaries)
    data.corl = [_corl(f) for f in corl_rows(rows, baseline, corl_scores(), references)]
    return data


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def write_report_data(data: ReportData, path: Path) -> Path:
    path.write_text(json.dumps(_plain(dataclasses.asdict(data)), indent=1) + "\n")
    return path


def _pair(values: Any) -> tuple[float, float] | None:
    return None if values is None else (float(values[0]), float(values[1]))


def read_report_data(path: Path) -> ReportData:
    """report.json as written by write_report_data."""
    raw = json.loads(path.read_text())

    def paired(item: dict[str, Any]) -> PairedResult:
        return PairedResult(**{**item, "interval": _pair(item["interval"])})

    def over(item: dict[str, Any]) -> OverTasks:
        return OverTasks(**{**item, "interval": _pair(item["interval"])})

    def aggregate(item: dict[str, Any]) -> AggregateResult:
        intervals = {name: _pair(bounds) for name, bounds in item["intervals"].items()}
        return AggregateResult(**{**item, "intervals": intervals})

    def corl(item: dict[str, Any]) -> CorlResult:
        last, best = _pair(item["corl_last"]), _pair(item["corl_best"])
        assert last is not None and best is not None
        return CorlResult(
            **{**item, "interval": _pair(item["interval"]), "corl_last": last, "corl_best": best}
        )

    def flat(item: dict[str, Any]) -> FlatnessResult:
        interval, equivalence = _pair(item["interval"]), _pair(item["equivalence"])
        assert interval is not None and equivalence is not None
        return FlatnessResult(**{**item, "interval": interval, "equivalence": equivalence})

    if raw.get("version") != VERSION:
        raise ReportError(
            f"{path} was written by another version of primal-dt (report.json version "
            f"{raw.get('version')}, this one reads {VERSION}): make it again with primal-dt report"
        )
    study = raw["study"]
    return ReportData(
        dirs=raw["dirs"],
        runs=raw["runs"],
        baseline=raw["baseline"],
        study=StudyFacts(**study) if study is not None else None,
        lead=raw["lead"],
        power=raw["power"],
        target=raw["target"],
        scores=[TaskScores(**item) for item in raw["scores"]],
        paired=[paired(item) for item in raw["paired"]],
        over_tasks=[over(item) for item in raw["over_tasks"]],
        last_quarter=[paired(item) for item in raw["last_quarter"]],
        last_quarter_over_tasks=[over(item) for item in raw["last_quarter_over_tasks"]],
        aggregates=[aggregate(item) for item in raw["aggregates"]],
        flatness=[flat(item) for item in raw["flatness"]],
        corl=[corl(item) for item in raw["corl"]],
        sections=[ReportSection(**item) for item in raw["sections"]],
        version=raw["version"],
    )
