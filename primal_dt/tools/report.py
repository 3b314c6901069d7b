"""`primal-dt report RUNS_DIR [RUNS_DIR ...]`: report.md, report.csv and the figures of the runs
in one directory of runs, or in several read together (a study made in parts, one task at a time).

This module only renders: which runs count and what their scores are is decided in runs.py, every
number and interval in statistics.py, so a table cannot print what was not computed there.
report.md holds, in order: the scores per task (each seed's, their mean and Student's t interval,
the best evaluation where there were evaluations during training, the dataset's own score); a
sentence per config and task against the baseline config, and over tasks; whether the curves are
flat, and the same comparisons over the last quarter's evaluations; the aggregates over tasks
(only at MIN_SEEDS_FOR_AGGREGATES seeds, with their simulated coverage); the attention spectrum
with its sentences; the Primal-Attention paper's table, apart from ours (it is not comparable); figures
and notes.

Writes report.md, report.csv, curves_<task>.png, spectrum_<task>.png, for runs with a target
sweep return_curve_<task>.png, and with aggregates aggregates.png and performance_profile.png.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from primal_dt.common.errors import check_folder
from primal_dt.evaluation.conditioning import curve_points
from primal_dt.method.registry import attention_label
from primal_dt.store.dashboards import copy_run, remove_root_layout
from primal_dt.store.rundir import safe_name
from primal_dt.tools.corl import corl_scores, corl_table
from primal_dt.tools.flatness import flatness_section, quarter_scores
from primal_dt.tools.paired import (
    POWER,
    TARGET,
    last_quarter_differences,
    over_tasks_sentence,
    paired_differences,
    paired_over_tasks,
)
from primal_dt.tools.paired import sentence as paired_sentence
from primal_dt.tools.paper import PaperScores, paper_scores
from primal_dt.tools.runs import (
    Behaviour,
    Row,
    RunSummary,
    SameData,
    baseline_config,
    behaviour_scores,
    collect,
    count_once,
    group,
    same_data,
    task_datasets,
    unique,
)
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
    compare_ranks,
    improvement,
    rliable_modules,
    sample_std,
    seeded,
    shortfall,
    simulated_coverage,
    t_interval,
)

NO_INTERVAL = "none: 1 seed (an interval needs at least 2)"
NO_TRAINING_EVALUATIONS = "no evaluations during training"


# ---- scores per task --------------------------------------------------------------------------


def _with_best(rows: list[Row]) -> bool:
    """Whether the report has a best column: some run was evaluated during training."""
    return any(row.evaluated_during_training for row in rows)


def _mean_cell(values: list[float], expected: int, average: bool) -> str:
    if not values:
        return "n/a"
    text = f"{np.mean(values):.1f}"
    unit = "tasks" if average else "seeds"
    return text if len(values) == expected else f"{text} ({len(values)} of {expected} {unit})"


def _per_seed_cell(row: Row) -> str:
    return ", ".join("n/a" if score is None else f"{score:.1f}" for score in row.per_seed)


def _interval_cell(row: Row) -> str:
    if row.task == "average":
        return "none (a mean over tasks)"
    interval = t_interval(row.final)
    if interval is None:
        return NO_INTERVAL if len(row.final) == 1 else "none: no final score"
    return f"[{interval[0]:.1f}, {interval[1]:.1f}]"


def _best_cell(row: Row) -> str:
    if not row.evaluated_during_training:
        return NO_TRAINING_EVALUATIONS
    return _mean_cell(row.best, row.average_of or len(row.seeds), row.task == "average")


def _behaviour_of(row: Row, behaviour: dict[str, Behaviour]) -> Behaviour:
    """A task's behaviour score; for an average row, the mean over the tasks it averages (where
    every one of them has its own)."""
    if row.task != "average":
        return behaviour.get(row.task, Behaviour(None, False, why="n/a"))
    found = [behaviour.get(task) for task in row.averaged]
    values = [b.value for b in found if b is not None and b.value is not None and b.normalized]
    if not values or len(values) != row.average_of:
        return Behaviour(None, False, why="n/a")
    return Behaviour(float(np.mean(values)), True)


def _behaviour_cell(found: Behaviour) -> str:
    if found.value is None:
        return found.why
    return f"{found.value:.1f}" + ("" if found.normalized else " (return)")


def markdown_table(rows: list[Row], behaviour: dict[str, Behaviour] | None = None) -> str:
    """The per-task table, with each distinct reference-score source as a numbered note below
    it; behaviour: the datasets' own scores (behaviour_scores), "n/a" without."""
    behaviour = behaviour or {}
    best = _with_best(rows)
    header = ["task", "config", "seeds", "final, per seed", "final mean"]
    header += [f"final {CONFIDENCE:.0%} interval (Student's t)"]
    header += ["best (max over evaluations)"] * best
    header += ["dataset (behaviour)", "target", "steps", "parameters", "reference scores"]
    header += ["dataset"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources: list[str] = []
    for row in rows:
        average = row.task == "average"
        expected = row.average_of if average else len(row.seeds)
        final = _mean_cell(row.final, expected, average)
        if not row.normalized:
            final = f"{final} (return)"
        sources += [source for source in row.references if source not in sources]
        notes = " ".join(f"[{sources.index(source) + 1}]" for source in row.references)
        cells = [
            f"**{row.task}**" if average else row.task,
            row.config,
            ",".join(map(str, row.seeds)),
            _per_seed_cell(row),
            final,
            _interval_cell(row),
            *([_best_cell(row)] if best else []),
            _behaviour_cell(_behaviour_of(row, behaviour)),
            ", ".join(f"{target:g}" for target in row.targets),
            ",".join(map(str, row.steps)),
            ", ".join(f"{count:,}" for count in row.parameters),
            notes or ("" if average else "none"),
            "; ".join(row.datasets),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] {source}  " for i, source in enumerate(sources, 1)]
    return "\n".join(lines).rstrip()


def _scores_text(rows: list[Row]) -> str:
    best = (
        "**best**: the mean over seeds of each run's best evaluation, the final one included (a "
        "max over evaluations, so optimistic); a group none of whose runs was evaluated during "
        f"training says {NO_TRAINING_EVALUATIONS}. "
        if _with_best(rows)
        else "No best column: no run was evaluated during training (train.eval_every = 0), only "
        "at its end. "
    )
    return (
        "## Scores per task\n\n"
        "A run's score is its final evaluation's normalised return at its first target return, "
        "100 (R - R_random) / (R_expert - R_random): the first of its eval.targets, else of its "
        "environment's eval_targets (envs/<env>.toml: the Decision Transformer paper's target "
        "for the task), so that the target is chosen before any score is seen; **target** names "
        "it. Where no reference scores are known, the return itself, marked (return). "
        "**final, per seed**: each seed's score, in the order of **seeds**; **final mean**: "
        f"their mean; **final {CONFIDENCE:.0%} interval**: Student's t interval of the mean over "
        "seeds, mean ± t(0.975, n − 1) · s / √n with s the std over seeds (ddof 1), none with "
        "one seed. It covers the variation over seeds (training again with another seed on these "
        f"datasets, at this budget), not over other datasets or environments. {best}"
        "**dataset (behaviour)**: the mean normalised return of the dataset's own episodes, with "
        "the reference scores of the task's scores: what the behaviour policy scored, the "
        "baseline that says whether sequence modelling added anything. **average**: the mean "
        "over tasks of each task's mean (the paper's average row), without the tasks whose data "
        "an earlier task has (see Notes)."
    )


def write_csv(rows: list[Row], path: Path, behaviour: dict[str, Behaviour] | None = None) -> Path:
    """The table as CSV; for average rows n_final (and n_best) count tasks, not seeds.
    final_scores: each seed's score in the order of seeds ("nan" for a run without one);
    final_std_ddof1: their std (ddof 1); final_t95_*: the Student's t 95% interval of their mean
    (empty under 2 seeds and for average rows); best_* only where some run was evaluated during
    training; dataset_behaviour: the dataset's own mean normalised return (empty where unknown)."""
    behaviour = behaviour or {}
    best = _with_best(rows)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            [
                "task",
                "config",
                "seeds",
                "n_final",
                "final_scores",
                "final_mean",
                "final_std_ddof1",
                "final_t95_low",
                "final_t95_high",
                *(["n_best", "best_mean"] if best else []),
                "dataset_behaviour",
                "target",
                "normalized",
                "steps",
                "parameters",
                "reference_source",
                "dataset_ids",
            ]
        )
        for row in rows:
            average = row.task == "average"
            ci = None if average else t_interval(row.final)
            std = None if average else sample_std(row.final)
            found = _behaviour_of(row, behaviour)
            writer.writerow(
                [
                    row.task,
                    row.config,
                    " ".join(map(str, row.seeds)),
                    len(row.final),
                    " ".join("nan" if s is None else f"{s:.4f}" for s in row.per_seed),
                    f"{np.mean(row.final):.4f}" if row.final else "",
                    "" if std is None else f"{std:.4f}",
                    *(["", ""] if ci is None else [f"{ci[0]:.4f}", f"{ci[1]:.4f}"]),
                    *(
                        [len(row.best), f"{np.mean(row.best):.4f}" if row.best else ""]
                        if best
                        else []
                    ),
                    "" if found.value is None else f"{found.value:.4f}",
                    " ".join(f"{t:g}" for t in row.targets),
                    row.normalized,
                    " ".join(map(str, row.steps)),
                    " ".join(map(str, row.parameters)),
                    "; ".join(row.references),
                    "; ".join(row.datasets),
                ]
            )
    return path


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
        f"95% interval; a difference is claimed only where that interval excludes 0. Beside it, "
        f"the smallest true difference the study detects with {POWER:.0%} probability (a "
        "two-sided paired t-test at 5%, taking the measured spread of the differences as the "
        f"true one), and the seeds a difference of {TARGET:g} points would need. Where no seeds "
        "pair, the two configs' own intervals: overlapping ones say no difference was detected.",
        "",
    ]
    by_key = {(row.task, row.config): row for row in rows if row.task != "average"}
    over = []
    for config in configs:
        if config == baseline:
            continue
        pairs = {p.task: p for p in paired_differences(rows, config, baseline)}
        for task in unique([row.task for row in rows if row.task != "average"]):
            base, row = by_key.get((task, baseline)), by_key.get((task, config))
            if row is None:
                continue
            if base is None:
                lines.append(f"- {config} on {task}: no {baseline} runs there to compare with.")
            elif task in pairs and len(pairs[task].seeds) > 1:
                lines.append(f"- {paired_sentence(pairs[task])}")
            else:
                interval, base_interval = t_interval(row.final), t_interval(base.final)
                lines.append(
                    f"- {compare_intervals(task, config, interval, baseline, base_interval)}"
                )
        summary = paired_over_tasks(list(pairs.values()))
        if summary is not None:
            over.append(f"- {over_tasks_sentence(summary)}")
    if over:
        lines += [
            "",
            OVER_TASKS_HEADING,
            "",
            "Each task weighed alike (the mean of its mean differences):",
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
            *(f"- {paired_sentence(p)}" for p in pairs),
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
    lines = [
        "## Aggregates over tasks",
        "",
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
        "each).",
        "",
    ]
    lines += [
        f"{s.task} is left out of the aggregates and the average rows: its data is "
        f"{s.same_as}'s ({s.how}), counted once, as {s.same_as}."
        for s in same
    ]
    lines += [""] * bool(same)
    if found:
        header = ["config", "tasks", "runs", *METRICS, "coverage of the intervals"]
        lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for agg in found:
            cells = [agg.config, ", ".join(agg.tasks), agg.runs]
            cells += [_interval(agg.points[i], agg.interval(i)) for i in range(len(METRICS))]
            cells.append(_coverage(agg.shape))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
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


# ---- attention spectrum -----------------------------------------------------------------------


def _ranks(summaries: list[RunSummary]) -> dict[tuple[str, str, int], tuple[str, list[int], int]]:
    """(task, config, block) -> (its attention kind, rank_90 per seed, singular values)."""
    from primal_dt.evaluation.spectrum import rank_at

    found: dict[tuple[str, str, int], tuple[str, list[int], int]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        for block, curve in enumerate(summary.spectra or []):
            key = (summary.task, summary.config, block)
            kind = summary.block_kinds[block]
            found.setdefault(key, (kind, [], len(curve)))[1].append(rank_at(curve))
    return found


def spectrum_table(summaries: list[RunSummary]) -> str:
    """Per task, config and block: how many singular values hold 90% of their sum (rank_90)."""
    lines = [
        "| task | config | block | attention | rank_90: singular values for 90% (mean ± std, "
        "ddof 1) | of |",
        "|---|---|---|---|---|---|",
    ]
    for (task, config, block), (kind, ranks, size) in _ranks(summaries).items():
        std = sample_std(ranks)
        spread = (
            f"{np.mean(ranks):.1f} (1 seed)" if std is None else f"{np.mean(ranks):.1f} ± {std:.1f}"
        )
        lines.append(
            f"| {task} | {config} | {block} | {attention_label(kind)} | {spread} | {size} |"
        )
    return "\n".join(lines)


def spectrum_sentences(summaries: list[RunSummary]) -> list[str]:
    """The sentences the rank_90 table allows (compare_ranks), for every attention kind a study
    holds against softmax: first the matched ones, a block of another kind against the same
    block of a config of the same task where it is softmax (the study's one change); then,
    within a config, each block of another kind against each of its softmax blocks."""
    ranks = _ranks(summaries)
    sentences = []
    for (task, config, block), (kind, kind_ranks, _) in ranks.items():
        for (t, other, b), (other_kind, softmax_ranks, _) in ranks.items():
            if kind != "softmax" and other_kind == "softmax" and (t, b) == (task, block):
                sentences.append(
                    compare_ranks(
                        f"{task}, block {block}",
                        _block(f"{config} ({attention_label(kind)})", kind_ranks),
                        _block(f"{other} (softmax)", softmax_ranks),
                    )
                )
    for task, config in unique([(task, config) for task, config, _ in ranks]):
        blocks = {b: v for (t, c, b), v in ranks.items() if (t, c) == (task, config)}
        others = [b for b, (kind, _, _) in blocks.items() if kind != "softmax"]
        softmax = [b for b, (kind, _, _) in blocks.items() if kind == "softmax"]
        sentences += [
            compare_ranks(
                f"{task} ({config})",
                _block(f"{attention_label(blocks[o][0])} block {o}", blocks[o][1]),
                _block(f"softmax block {s}", blocks[s][1]),
            )
            for o in others
            for s in softmax
        ]
    return sentences


def _block(name: str, ranks: list[int]) -> tuple[str, float, float | None]:
    return name, float(np.mean(ranks)), sample_std(ranks)


# ---- the paper's table ------------------------------------------------------------------------

PAPER_HEADING = "## The paper's table"


def paper_table(paper: PaperScores, ours: Sequence[str] = ()) -> str:
    """The paper's table as it printed it, in a section of its own; then, for the tasks of ours
    (task names) that it has, its row in words, so a reader finds the counterpart."""
    columns = list(paper.columns.values())
    lines = [
        PAPER_HEADING,
        "",
        "Not ours, and not directly comparable with ours: the Primal-Attention paper's D4RL "
        f"table ({paper.source}), with the ± as printed. Measured on D4RL v2 datasets of a "
        "million steps each, in gym v3 environments, normalised with D4RL's reference scores; "
        "ours are trained on the Minari datasets named in the per-task table, evaluated in "
        f"gymnasium v5 environments and normalised with the reference scores named there. "
        f"{paper.dt_column} Its columns are these configs: "
        + ", ".join(f"{column} = {config}" for config, column in paper.columns.items())
        + ".",
        "",
        "| task (D4RL v2) | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for task in paper.tasks():
        cells = [f"{paper.scores[task][c]:.1f} ± {paper.spread[task][c]:.1f}" for c in columns]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    cells = [f"{paper.average[c]:.1f} ± {paper.average_spread[c]:.1f}" for c in columns]
    lines.append("| **average** | " + " | ".join(cells) + " |")
    here = [task for task in unique(list(ours)) if task in paper.scores]
    if here:
        lines += ["", "Its rows for the tasks of this report (the names match; the data do not):"]
        lines += [f"- {task}: {paper.cell(task, '')}" for task in here]
    return "\n".join(lines)


# ---- figures ----------------------------------------------------------------------------------


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
    for task in unique(sorted(r.task for r in summaries)):
        mine = sorted((r for r in summaries if r.task == task), key=lambda r: (r.config, r.seed))
        configs = unique([r.config for r in mine])
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
            panels = {
                c: [curve_points(curve) for name, curve in with_curves if name == c]
                for c in configs
                if any(name == c for name, _ in with_curves)
            }
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
                here = [
                    (r, spectra)
                    for r, spectra in with_spectra
                    if r.config == config and block < len(spectra)
                ]
                if here:
                    kind = attention_label(here[0][0].block_kinds[block])
                    curves[f"{config} ({kind})"] = [spectra[block] for _, spectra in here]
            blocks.append((f"block {block}", curves))
        written.append(save(spectra_figure(task, blocks), out / f"spectrum_{safe_name(task)}.png"))
    return written


# ---- the report -------------------------------------------------------------------------------


def _notes(counted: list[RunSummary], rows: list[Row], same: Sequence[SameData]) -> list[str]:
    notes = [f"- {r.name} ({r.path}): {note}" for r in counted for note in r.notes]
    notes += [
        f"- {s.task} and {s.same_as}: their datasets are the same data ({s.how}); the aggregates "
        f"and average rows count it once, as {s.same_as}"
        for s in same
    ]
    notes += [
        f"- {row.task} ({row.config}): its runs' first targets differ ("
        + ", ".join(f"{t:g}" for t in row.targets)
        + "): their scores are at different targets"
        for row in rows
        if len(row.targets) > 1
    ]
    return notes


def write_report(
    runs_dirs: Path | Sequence[Path], out: Path | None = None, baseline: str | None = None
) -> tuple[str, list[Path]]:
    """Write the report's files into out (default: the first RUNS_DIR/report), from the runs of
    every directory together, every config compared with baseline (default:
    runs.baseline_config's choice); returns the per-task table's text and the paths written.
    Also refreshes each RUNS_DIR's TensorBoard dashboards (dashboards.py)."""
    dirs = [runs_dirs] if isinstance(runs_dirs, Path) else list(runs_dirs)
    out = out or dirs[0] / "report"
    check_folder(out, "--out")
    found = [summary for runs_dir in dirs for summary in collect(runs_dir, skip=out)]
    counted_once, left_out = count_once(found)
    baseline = baseline_config(counted_once, baseline)  # a wrong --baseline: before any write
    out.mkdir(parents=True, exist_ok=True)
    same = same_data(task_datasets(counted_once))
    rows = group(counted_once, {s.task for s in same})
    behaviour = behaviour_scores(counted_once)
    written = [write_csv(rows, out / "report.csv", behaviour), *figures(counted_once, out)]
    images = [f"![{p.stem}]({p.name})" for p in written if p.suffix == ".png"]
    section, summed = aggregates_section(rows, baseline, same)
    captioned = aggregate_figures(summed, out)
    written += [path for path, _ in captioned]
    section += "".join(f"\n\n![{p.stem}]({p.name})\n\n*{p.name}*: {text}" for p, text in captioned)
    if not captioned:
        section += "\n\nNo aggregate figures: there are no aggregates to draw."
    counted = f"{len(counted_once)} runs"
    if left_out:
        counted += f" ({len(left_out)} duplicate{'s' * (len(left_out) > 1)} left out, see Notes)"
    table = markdown_table(rows, behaviour)
    spectrum = spectrum_sentences(counted_once)
    parts = [
        f"# primal-dt report: {', '.join(map(str, dirs))}",
        f"{counted}, grouped by the task, config name and seed each run recorded.",
        _scores_text(rows),
        table,
        comparisons_section(rows, baseline),
        flatness_section(counted_once),
        last_quarter_section(counted_once, baseline),
        section,
        "## Attention spectrum\n\nNormalised cumulative singular values of each block's "
        "attention output on fixed windows of the task's dataset (the same windows for every "
        "run of a task; see primal_dt/evaluation/spectrum.py), from each run's last "
        "checkpoint: rank_90, the fewer singular values hold 90% of the sum, the lower the "
        "rank. A block is said to have the lower rank_90 only where the difference of the "
        "means exceeds the sum of the stds over seeds. The sentences compare every other "
        "attention with softmax: first the same block of two configs of a task (where one "
        "has softmax there), then a block of another kind with the softmax blocks of its own "
        "model.",
        spectrum_table(counted_once),
        "\n".join(f"- {s}" for s in spectrum)
        or "No study here has a softmax block beside a block of another kind.",
        paper_table(paper_scores(), [row.task for row in rows if row.task != "average"]),
        corl_table(rows, baseline, corl_scores()),
        "## Figures\n\n" + "\n".join(images),
        "## Notes\n\n" + ("\n".join(_notes(counted_once, rows, same)) or "none"),
    ]
    text = "\n\n".join(part for part in parts if part)  # a section with nothing to say: none
    (out / "report.md").write_text(text + "\n")
    written.insert(0, out / "report.md")
    for runs_dir in dirs:
        remove_root_layout(runs_dir)
    for summary in found:
        copy_run(summary.path, summary.task)
    return table, written
