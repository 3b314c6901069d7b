"""report.md's comparisons: every config against the baseline per task and over tasks, on the
final scores and on the last quarter's means (paired.py), and the aggregates over tasks with their
figures (statistics.py). Sentences only: the numbers are computed in those modules."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from primal_dt.tools.flatness import quarter_scores
from primal_dt.tools.paired import (
    POWER,
    TARGET,
    holm_sentences,
    last_quarter_differences,
    over_tasks_sentence,
    paired_differences,
    paired_over_tasks,
)
from primal_dt.tools.runs import (
    Row,
    RunSummary,
    unique,
)
from primal_dt.tools.same_data import SameData
from primal_dt.tools.statistics import (
    BOOTSTRAP_REPS,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    GAMMA,
    METRICS,
    MIN_SEEDS_FOR_AGGREGATES,
    NEEDED,
    SIMULATED_MEANS,
    SIMULATED_SPREADS,
    SIMULATION_BOOTSTRAPS,
    SIMULATION_REPS,
    Aggregate,
    Improvement,
    aggregates,
    compare_intervals,
    improvement,
    rliable_modules,
    seeded,
    shortfall,
    simulated_coverage,
    t_interval,
)

OVER_TASKS_HEADING = "## Paired differences over tasks"


def comparisons_section(rows: list[Row], baseline: str | None) -> str:
    """Per task, a sentence for every config against the baseline config (runs.baseline_config): from
    the paired differences of the seeds both ran (paired.py), with the study's power there; from
    the overlap of the two configs' own intervals where no two seeds pair. Then, per config, the
    mean paired difference over tasks, under a heading of its own."""
    configs = unique([row.config for row in rows if row.task != "average"])
    lines = ["## Comparisons per task", ""]
    if baseline is None or len(configs) < 2:
        return "\n".join([*lines, "One config only: nothing to compare."])
    lines += [
        f"Every config against {baseline} (the baseline: `primal-dt report --baseline`, by default "
        "the Decision Transformer, softmax in every block and conditioned on returns) on each task "
        "both ran. Runs of the same seed share "
        "their data order and evaluation episodes, so the comparison is seed by seed: the mean "
        "of the paired differences (config − baseline, normalised points) with its Student's t "
        "95% interval and its paired t-test's p-value. The per-task tests of this section are one "
        "family: a difference is claimed only where Holm's correction keeps its p-value under "
        "5% (the adjusted p beside the uncorrected one). Beside it, the smallest true difference "
        f"the study detects with {POWER:.0%} probability (a two-sided paired t-test at 5%, taking "
        "the measured spread of the differences as the true one, and again at the top of that "
        f"spread's 95% interval), and the seeds a difference of {TARGET:g} points would need. "
        "Where no seeds pair, the two configs' own intervals: overlapping ones say no difference "
        "was detected.",
        "",
    ]
    by_key = {(row.task, row.config): row for row in rows if row.task != "average"}
    others = [config for config in configs if config != baseline]
    pairs = {c: {p.task: p for p in paired_differences(rows, c, baseline)} for c in others}
    family = [p for found in pairs.values() for p in found.values() if len(p.seeds) > 1]
    said = {(p.config, p.task): s for p, s in zip(family, holm_sentences(family), strict=True)}
    over = []
    for config in others:
        for task in unique([row.task for row in rows if row.task != "average"]):
            base, row = by_key.get((task, baseline)), by_key.get((task, config))
            if row is None:
                continue
            if base is None:
                lines.append(f"- {config} on {task}: no {baseline} runs there to compare with.")
            elif (config, task) in said:
                lines.append(f"- {said[config, task]}")
            else:
                interval, base_interval = t_interval(row.final), t_interval(base.final)
                lines.append(
                    f"- {compare_intervals(task, config, interval, baseline, base_interval)}"
                )
        summary = paired_over_tasks(list(pairs[config].values()))
        if summary is not None:
            over.append(f"- {over_tasks_sentence(summary)}")
    if over:
        lines += [
            "",
            OVER_TASKS_HEADING,
            "",
            "Each task weighed alike: each seed's mean over the tasks of its differences, and "
            "the Student's t test and interval of their mean:",
            "",
            *over,
        ]
    return "\n".join(lines)


LAST_QUARTER_HEADING = "## Paired differences over the last quarter"


def last_quarter_section(summaries: list[RunSummary], baseline: str | None) -> str:
    """Every config against the baseline per task, as comparisons_section does, on each run's mean
    score over the last quarter of its training (paired.last_quarter_differences); "" where no
    two seeds pair there (one config, or no evaluations in the last quarter)."""
    if baseline is None:
        return ""
    configs = unique(sorted(s.config for s in summaries if s.config != baseline))
    pairs = [
        p
        for c in configs
        for p in last_quarter_differences(summaries, c, baseline)
        if len(p.seeds) > 1
    ]
    if not pairs:
        return ""
    paired = {(p.task, c, seed) for p in pairs for c in (p.config, p.baseline) for seed in p.seeds}
    counts = sorted(
        {
            len(quarter_scores(s.scores, s.steps))
            for s in summaries
            if (s.task, s.config, s.seed) in paired
        }
    )
    evaluations = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return "\n".join(
        [
            LAST_QUARTER_HEADING,
            "",
            "The final score is one evaluation, and where the curves wander it rests on where each "
            "stands at the end. Here each run's score is the mean of its evaluations in the last "
            f"quarter of its training (3/4 S < step <= S, the final one included: {evaluations} per "
            "run here), compared seed by seed with the baseline as above.",
            "",
            *(f"- {s}" for s in holm_sentences(pairs)),
            *_last_quarter_over_tasks(summaries, configs, baseline),
        ]
    )


LAST_QUARTER_OVER_TASKS_HEADING = "## Paired differences over tasks, over the last quarter"


def _last_quarter_over_tasks(
    summaries: list[RunSummary], configs: list[str], baseline: str
) -> list[str]:
    """Per config, the mean over tasks of its last-quarter paired differences (as the final
    scores' in comparisons_section), under a heading of its own; none where no config pairs on
    two tasks."""
    over = [
        f"- {over_tasks_sentence(summary)}"
        for config in configs
        if (summary := paired_over_tasks(last_quarter_differences(summaries, config, baseline)))
    ]
    if not over:
        return []
    return ["", LAST_QUARTER_OVER_TASKS_HEADING, "", "Each task weighed alike:", "", *over]


# ---- over tasks -------------------------------------------------------------------------------


def _interval(point: float, interval: tuple[float, float] | None, digits: int = 1) -> str:
    if interval is None:
        return f"{point:.{digits}f}"
    low, high = interval
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _coverage(shape: tuple[int, int]) -> str:
    seeds, tasks = shape
    covered = simulated_coverage(seeds, tasks)
    return (
        f"nominal {CONFIDENCE:.0%}; {covered:.0%} in a simulation of normal scores at {seeds} "
        f"seeds × {tasks} tasks"
    )


def aggregates_section(
    rows: list[Row], baseline: str | None, same: Sequence[SameData] = ()
) -> tuple[str, list[Aggregate]]:
    """report.md's aggregates: a table of METRICS per config with the simulated coverage of its
    intervals, the probabilities of improvement over the baseline config, and what could not be
    computed, a sentence each."""
    exclude = {s.task for s in same}
    found, notes = aggregates(rows, exclude)
    lines = ["## Aggregates over tasks", "", _AGGREGATES_INTRO, ""]
    lines += [
        f"{s.task} is left out of the aggregates and the average rows: its data is "
        f"{s.same_as}'s ({s.how}), counted once, as {s.same_as}."
        for s in same
    ]
    lines += [""] * bool(same)
    if found:
        lines += [*_aggregates_table(found), ""]
    configs = unique([row.config for row in rows if row.task != "average"])
    missing = {c: has for c in configs if (has := shortfall(rows, c, exclude)) is not None}
    others = [c for c in configs if c != baseline]
    betters = [improvement(rows, c, baseline, exclude) for c in others if baseline is not None]
    if not found and all(isinstance(b, str) for b in betters):
        what = "No aggregates over tasks" + " and no probability of improvement" * bool(others)
        has = "; ".join(f"{config}: {words}" for config, words in missing.items())
        lines.append(f"{what}: {NEEDED}, and these runs have {has}.")
    else:
        lines += [
            f"- {c}: no aggregates over tasks: {NEEDED}, and it has {has}."
            for c, has in missing.items()
        ]
        lines += [""] * bool(missing)
        for better in betters:  # a paragraph each
            lines += [better if isinstance(better, str) else _improvement_text(better), ""]
        lines.pop()
    if notes:
        lines += ["", *[f"- {note}." for note in unique(notes)]]
    return "\n".join(lines), found


_AGGREGATES_INTRO = (
    "Normalised final scores only (tasks without reference scores are left out). Per config "
    "over its tasks: the interquartile mean (IQM, the mean of the middle 50% of all its "
    f"runs' scores), the mean and the optimality gap ({GAMMA:g} minus the mean of the scores "
    f"clipped at {GAMMA:g}: lower is better), each with its {CONFIDENCE:.0%} stratified "
    f"bootstrap confidence interval [low, high] (rliable; {BOOTSTRAP_REPS} resamples, numpy's "
    f"generator seeded with {BOOTSTRAP_SEED}). Shown only where every task has at least "
    f"{MIN_SEEDS_FOR_AGGREGATES} seeds of the config and there are at least 2 tasks. The "
    "intervals cover the variation over seeds on these datasets (the same tasks trained "
    "again with other seeds), not other datasets, tasks or environments; **coverage** says "
    "how often such an interval covered the truth in a simulation at the same shape ("
    f"{SIMULATION_REPS} simulated experiments of {SIMULATION_BOOTSTRAPS} resamples each, "
    f"normal scores with task means from {SIMULATED_MEANS[0]:g} to {SIMULATED_MEANS[1]:g} "
    f"and spreads from {SIMULATED_SPREADS[0]:g} to {SIMULATED_SPREADS[1]:g} drawn anew in "
    "each)."
)


def _aggregates_table(found: list[Aggregate]) -> list[str]:
    """Per config: its tasks, runs, each metric with its interval, and their coverage."""
    header = ["config", "tasks", "runs", *METRICS, "coverage of the intervals"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for agg in found:
        cells = [agg.config, ", ".join(agg.tasks), agg.runs]
        cells += [_interval(agg.points[i], agg.interval(i)) for i in range(len(METRICS))]
        cells.append(_coverage(agg.shape))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _improvement_text(better: Improvement) -> str:
    tasks = len(better.tasks)
    return (
        f"**Probability of improvement** P({better.better} > {better.baseline}), the chance that "
        f"a {better.better} run scores above a {better.baseline} run on the same task, averaged "
        f"over the {tasks} task{'s' * (tasks > 1)} both ran ({', '.join(better.tasks)}; "
        f"{better.runs[0]} {better.better} and {better.runs[1]} {better.baseline} runs): "
        + _interval(better.point, better.interval, 2)
        + "."
    )


def aggregate_figures(found: list[Aggregate], out: Path) -> list[tuple[Path, str]]:
    """aggregates.png and performance_profile.png with their captions, where found has any."""
    if not found:
        return []
    from primal_dt.evaluation.plots import interval_figure, profile_figure, save

    library, _ = rliable_modules()
    runs = sum(agg.scores.size for agg in found)
    counts = "; ".join(f"{agg.config}: {agg.runs}" for agg in found)
    bootstrap = f"{BOOTSTRAP_REPS} resamples, seed {BOOTSTRAP_SEED}"
    # Each config's points as a list (of the same numpy floats): interval_figure reads a Sequence.
    points: dict[str, Sequence[float]] = {agg.config: list(agg.points) for agg in found}
    intervals: dict[str, np.ndarray | None] = {agg.config: agg.intervals for agg in found}
    title = "normalised final score over tasks: point estimates and 95% CIs"
    figure = interval_figure(title, list(METRICS), points, intervals, "normalised score")
    written = [
        (
            save(figure, out / "aggregates.png"),
            f"IQM, mean and optimality gap of the normalised final scores per config (bar: the 95% "
            f"stratified bootstrap CI, {bootstrap}; black line: the point estimate), from {runs} runs "
            f"({counts}).",
        )
    ]
    every = np.concatenate([agg.scores.ravel() for agg in found])
    taus = np.linspace(min(0.0, every.min()), max(GAMMA, every.max()), 101)
    profiles, bands = {}, {}
    for agg in found:
        with seeded():
            profile, band = library.create_performance_profile(
                {"x": agg.scores}, taus, reps=BOOTSTRAP_REPS
            )
        label = f"{agg.config} ({agg.scores.size} runs)"
        profiles[label] = profile["x"]
        bands[label] = band["x"]
    figure = profile_figure("performance profile: normalised final score", taus, profiles, bands)
    written.append(
        (
            save(figure, out / "performance_profile.png"),
            f"Performance profiles: the fraction of a config's runs whose normalised final score is "
            f"above each score τ (band: its 95% stratified bootstrap CI, {bootstrap}), from {runs} "
            f"runs ({counts}).",
        )
    )
    return written


def aggregates_with_figures(
    rows: list[Row], baseline: str | None, same: Sequence[SameData], out: Path
) -> tuple[str, list[Aggregate], list[Path]]:
    """The aggregates section (aggregates_section) with its figures drawn into out and shown
    under it, each with its caption; returns the section, the aggregates and the figures."""
    section, summed = aggregates_section(rows, baseline, same)
    captioned = aggregate_figures(summed, out)
    section += "".join(f"\n\n![{p.stem}]({p.name})\n\n*{p.name}*: {text}" for p, text in captioned)
    if not captioned:
        section += "\n\nNo aggregate figures: there are no aggregates to draw."
    return section, summed, [path for path, _ in captioned]
