"""The results at a glance: one table over every dataset whose study kept its runs
(results-data/<section>/, the report's copy of them: report.export_runs), made from those runs
alone, for the README and the results page's first screen.

Per dataset: DT (matched-softmax), Primal.+DT (matched-primal) and behaviour cloning (matched-bc),
each config's mean final score with its Student's t 95% interval; the paired difference Primal.+DT
− DT with its interval and its p-value Holm-adjusted over the table's datasets (one family: a
difference is claimed at a family-wise 5%); the difference the study could detect at 80% power;
and CORL's published DT beside them (another budget and other data: not a comparison). A last row:
the mean over the datasets of the paired differences (paired.paired_over_tasks), and the seeds per
dataset that the paper's gap over D4RL (Primal.+DT against DT in its average row) would need.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from primal_dt.tools.corl import corl_scores
from primal_dt.tools.paired import (
    POWER,
    Paired,
    holm,
    paired_differences,
    paired_over_tasks,
    seeds_for,
)
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.runs import Row, collect, count_once, group
from primal_dt.tools.statistics import t_interval

DT, PRIMAL, BC = "matched-softmax", "matched-primal", "matched-bc"


def paper_gap() -> float:
    """The paper's Primal.+DT minus DT in its average over D4RL's nine datasets."""
    average = paper_scores().average
    return average["Primal.+DT"] - average["DT"]


def _score(row: Row | None) -> str:
    if row is None or not row.final:
        return "–"
    interval = t_interval(row.final)
    spread = "" if interval is None else f" [{interval[0]:.1f}, {interval[1]:.1f}]"
    return f"{np.mean(row.final):.1f}{spread}"


def _difference(paired: Paired | None, adjusted: float | None) -> str:
    if paired is None or paired.interval is None:
        return "–"
    low, high = paired.interval
    return f"{paired.mean:+.1f} [{low:+.1f}, {high:+.1f}], p = {adjusted:.2f}"


def results_table(folders: Sequence[Path]) -> str:
    """The table and at most three sentences under it; one line saying so where no folder holds
    runs of the matched comparison."""
    summaries = [s for folder in folders for s in collect(folder, spectra=False)]
    rows = {(row.task, row.config): row for row in group(count_once(summaries)[0])}
    tasks = sorted({task for task, config in rows if task != "average" and config == DT})
    if not tasks:
        return "No study has kept its runs of the matched comparison (results-data/) yet."
    pairs = {p.task: p for p in paired_differences(list(rows.values()), PRIMAL, DT)}
    family = [pairs[task] for task in tasks if task in pairs]
    adjusted = dict(zip([p.task for p in family], holm([p.p_value for p in family]), strict=True))
    corl = corl_scores()
    lines = [
        "| dataset | DT | Primal.+DT | BC | Primal.+DT − DT, p (Holm) | could detect | CORL's DT |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for task in tasks:
        paired = pairs.get(task)
        detect = paired.detectable if paired is not None else None
        theirs = corl.last.get(task)
        lines.append(
            f"| {task} | {_score(rows.get((task, DT)))} | {_score(rows.get((task, PRIMAL)))} "
            f"| {_score(rows.get((task, BC)))} | {_difference(paired, adjusted.get(task))} "
            f"| {'–' if detect is None else f'{detect:.1f}'} "
            f"| {'–' if theirs is None else f'{theirs[0]:.1f}'} |"
        )
    over = paired_over_tasks(family)
    gap = paper_gap()
    claimed = [p.task for p in family if (adjusted[p.task] or 1.0) < 0.05]
    said = [
        f"Primal.+DT − DT differs at a family-wise 5% on {len(claimed)} of the {len(family)} "
        f"datasets{': ' + ', '.join(claimed) if claimed else ''}."
    ]
    if over is not None:
        low, high = over.interval
        lines.append(
            f"| mean over the {len(over.tasks)} | | | | {over.point:+.1f} [{low:+.1f}, "
            f"{high:+.1f}], p = {over.p_value:.2f} | {over.detectable:.1f} | |"
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
