"""The results at a glance: one table and one figure over every dataset whose matched study kept
its runs (results-data/<section>/, the report's copy of them: report.export_runs), made from those
runs alone, for the README and the results page's first screen.

Per dataset: DT (matched-softmax), Primal.+DT (matched-primal) and behaviour cloning (matched-bc),
each config's mean final score with its Student's t 95% interval; the paired difference Primal.+DT
− DT with its interval and its p-value Holm-adjusted over the table's datasets (one family: a
difference is claimed at a family-wise 5%); the difference the study could detect at 80% power;
and CORL's published DT beside them (another budget and other data: not a comparison). A last row:
the mean over the datasets of the paired differences (paired.paired_over_tasks), and the seeds per
dataset that the paper's gap over D4RL (Primal.+DT against DT in its average row) would need.

Where the matched study has been made at the papers' budget (scripts/gpu_study.sh, results-budget-*),
its table leads the page's first screen and the README's summary: the README says the CPU budget's
result in one sentence under it, the page shows both tables (first_screen, readme_summary).

The figure draws the table's differences: each with its 95% interval and its Bonferroni interval
(simultaneous over the table's datasets at 95%: Holm's test is never stricter than Bonferroni's, so
where that interval excludes 0, the Holm-adjusted p is under 5% too, not conversely), the mean over the datasets,
0 and the paper's gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from primal_dt.tools.corl import corl_scores
from primal_dt.tools.paired import (
    POWER,
    Paired,
    PairedOverTasks,
    holm,
    paired_differences,
    paired_over_tasks,
    seeds_for,
)
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.runs import Row, collect, count_once, group
from primal_dt.tools.statistics import CONFIDENCE, t_interval

DT, PRIMAL, BC = "matched-softmax", "matched-primal", "matched-bc"
NONE_KEPT = "No study has kept its runs of the matched comparison (results-data/) yet."


def paper_gap() -> float:
    """The paper's Primal.+DT minus DT in its average over D4RL's nine datasets."""
    average = paper_scores().average
    return average["Primal.+DT"] - average["DT"]


@dataclass(frozen=True)
class Glance:
    """What the table and the figure show, computed once from the kept runs."""

    tasks: list[str]  # the datasets with DT runs, in name order
    rows: dict[tuple[str, str], Row]  # (task, config) -> its row over seeds
    pairs: list[Paired]  # Primal.+DT − DT per task, where both have runs
    adjusted: dict[str, float | None]  # task -> its Holm-adjusted p over `pairs`
    over: PairedOverTasks | None  # the mean over the datasets (None under 2 of them)

    @property
    def tested(self) -> int:
        """The datasets whose difference has a test: Holm's family, and Bonferroni's m."""
        return sum(p.p_value is not None for p in self.pairs)

    def simultaneous(self, paired: Paired) -> tuple[float, float] | None:
        """paired's Bonferroni interval: at 1 − 5%/m each, 95% for all m of the table at once."""
        level = 1 - (1 - CONFIDENCE) / max(1, self.tested)
        return t_interval(paired.differences, level)


def glance(folders: Sequence[Path]) -> Glance | None:
    """The glance over the runs under folders, or None where none holds a matched DT run."""
    summaries = [s for folder in folders for s in collect(folder, spectra=False)]
    rows = {(row.task, row.config): row for row in group(count_once(summaries)[0])}
    tasks = sorted({task for task, config in rows if task != "average" and config == DT})
    if not tasks:
        return None
    found = {p.task: p for p in paired_differences(list(rows.values()), PRIMAL, DT)}
    pairs = [found[task] for task in tasks if task in found]
    adjusted = dict(zip([p.task for p in pairs], holm([p.p_value for p in pairs]), strict=True))
    return Glance(tasks, rows, pairs, adjusted, paired_over_tasks(pairs))


def _score(row: Row | None) -> str:
    if row is None or not row.final:
        return "–"
    interval = t_interval(row.final)
    spread = "" if interval is None else f" [{interval[0]:.1f}, {interval[1]:.1f}]"
    return f"{np.mean(row.final):.1f}{spread}"


def _signed(point: float, interval: tuple[float, float]) -> str:
    """A difference with its interval, signed: "+1.2 [-3.4, +5.7]"."""
    return f"{point:+.1f} [{interval[0]:+.1f}, {interval[1]:+.1f}]"


def _difference(paired: Paired | None, adjusted: float | None) -> str:
    if paired is None or paired.interval is None:
        return "–"
    p = "" if adjusted is None else f", p = {adjusted:.2f}"
    return f"{_signed(paired.mean, paired.interval)}{p}"


def results_table(seen: Glance | None) -> str:
    """The table and at most three sentences under it; one line saying so where nothing is kept."""
    if seen is None:
        return NONE_KEPT
    pairs = {p.task: p for p in seen.pairs}
    corl = corl_scores()
    lines = [
        "| dataset | DT | Primal.+DT | BC | Primal.+DT − DT, p (Holm) | could detect | CORL's DT |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for task in seen.tasks:
        paired = pairs.get(task)
        detect = paired.detectable if paired is not None else None
        theirs = corl.last.get(task)
        lines.append(
            f"| {task} | {_score(seen.rows.get((task, DT)))} "
            f"| {_score(seen.rows.get((task, PRIMAL)))} | {_score(seen.rows.get((task, BC)))} "
            f"| {_difference(paired, seen.adjusted.get(task))} "
            f"| {'–' if detect is None else f'{detect:.1f}'} "
            f"| {'–' if theirs is None else f'{theirs[0]:.1f}'} |"
        )
    claimed = [p.task for p in seen.pairs if (seen.adjusted[p.task] or 1.0) < 0.05]
    said = [
        f"Primal.+DT − DT differs at a family-wise 5% on {len(claimed)} of the {len(seen.pairs)} "
        f"datasets{': ' + ', '.join(claimed) if claimed else ''}."
    ]
    over, gap = seen.over, paper_gap()
    if over is not None:
        lines.append(
            f"| mean over the {len(over.tasks)} | | | | {_signed(over.point, over.interval)}, "
            f"p = {over.p_value:.2f} | {over.detectable:.1f} | |"
        )
        needed = seeds_for(over.std, gap)
        said.append(
            f"Over the {len(over.tasks)} datasets ({over.pairs} seeds paired on each) the study "
            f"could detect {over.detectable:.1f} points at {POWER:.0%} power (up to "
            f"{over.detectable_at_most:.1f} were the spread at the top of its 95% interval); the "
            f"paper's {gap:.1f} points would need "
            f"{needed if needed is not None else 'over 100,000'} seeds per dataset."
        )
    said.append(
        "CORL's DT: its published scores on D4RL's datasets of the same names at 100,000 steps of "
        "the DT paper's size, another budget and other data: not a comparison."
    )
    return "\n".join([*lines, "", " ".join(said)])


def glance_figure(seen: Glance, path: Path) -> Path:
    """The table's paired differences drawn (plots.difference_figure), saved at path."""
    from primal_dt.evaluation.plots import difference_figure, save

    rows: list[tuple[str, float, tuple[float, float], tuple[float, float] | None]] = []
    for paired in seen.pairs:
        interval = paired.interval
        if interval is not None:
            rows.append((paired.task, paired.mean, interval, seen.simultaneous(paired)))
    if seen.over is not None:
        over = seen.over
        rows.append((f"mean over the {len(over.tasks)}", over.point, over.interval, None))
    title = (
        "Primal.+DT − DT, paired over seeds: 95% intervals (thick) and Bonferroni's over the "
        f"{seen.tested} datasets (thin)"
    )
    gap = paper_gap()
    figure = difference_figure(
        title, rows, {"no difference": 0.0, f"the paper's gap, {gap:+.1f}": gap}
    )
    return save(figure, path)


def at_a_glance(seen: Glance | None, link: str) -> str:
    """The table with the figure (glance_figure's, shown through link) between it and its
    sentences where any dataset has paired runs: the README's summary and the page's first screen."""
    table = results_table(seen)
    if seen is None or not seen.pairs:
        return table
    head, _, sentences = table.rpartition("\n\n")
    return f"{head}\n\n![Primal.+DT − DT per dataset]({link})\n\n{sentences}"


# The two budgets the matched comparison is made at, as the first screen names them.
PAPERS_BUDGET, CPU_BUDGET = "At the papers' budget", "At a CPU budget"


def steps_a_run(seen: Glance) -> str:
    """The training steps of the table's DT runs, as a phrase ("9,000 steps a run")."""
    steps = sorted({s for (_, config), row in seen.rows.items() if config == DT for s in row.steps})
    shown = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,} to {steps[-1]:,}"
    return f"{shown} steps a run"


def _titled(title: str, seen: Glance | None, link: str) -> str:
    if seen is None:
        return at_a_glance(seen, link)
    return f"**{title}** ({steps_a_run(seen)}):\n\n{at_a_glance(seen, link)}"


def first_screen(cpu: Glance | None, budget: Glance | None, links: tuple[str, str]) -> str:
    """The results page's first screen: the papers' budget's table and figure first, where it has
    any, then the CPU budget's; links are the two figures' (CPU's, the papers' budget's)."""
    if budget is None:
        return _titled(CPU_BUDGET, cpu, links[0])
    return f"{_titled(PAPERS_BUDGET, budget, links[1])}\n\n{_titled(CPU_BUDGET, cpu, links[0])}"


def in_one_sentence(seen: Glance | None) -> str:
    """The CPU budget's result under the papers' budget's table in the README: the mean over the
    datasets of Primal.+DT − DT (the one dataset's where there is one), and what it could detect."""
    if seen is None or not seen.pairs:
        return f"{CPU_BUDGET}: no study has kept its runs yet."
    if seen.over is not None:
        over = seen.over
        said = f"over the {len(over.tasks)} datasets is {_signed(over.point, over.interval)}"
        detect: float | None = over.detectable
    else:
        only = seen.pairs[0]
        said, detect = f"on {only.task} is {_difference(only, None)}", only.detectable
    could = "" if detect is None else f" (it could detect {detect:.1f})"
    return (
        f"{CPU_BUDGET} ({steps_a_run(seen)}), Primal.+DT − DT {said}{could}; its "
        "table is on the results page."
    )


def readme_summary(cpu: Glance | None, budget: Glance | None, links: tuple[str, str]) -> str:
    """The README's summary: the papers' budget's table and figure where it has any, the CPU
    budget's in one sentence under them; otherwise the CPU budget's table and figure."""
    if budget is None:
        return _titled(CPU_BUDGET, cpu, links[0])
    return f"{_titled(PAPERS_BUDGET, budget, links[1])}\n\n{in_one_sentence(cpu)}"
