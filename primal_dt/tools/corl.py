"""CORL's published Decision Transformer scores (corl_dt.toml), as data, and the side table that
sets a report's DT beside them.

The issue a short study has to answer is what its budget reaches: DT trained for a few thousand
steps of a small model scores below DT trained for 100k steps of CORL's. CORL measured on D4RL v2
datasets in gym v3 environments, so its numbers stand in a table of their own, beside ours, and the
ratio of the two means says how far this budget is from DT's own, not which method is better.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from primal_dt.tools.runs import Row
from primal_dt.tools.statistics import t_interval

CORL_HEADING = "## Against CORL's DT at its own budget"


@dataclass(frozen=True)
class CorlScores:
    """CORL's DT column (corl_dt.toml): task -> (mean, ± as printed), final and best."""

    source: str
    measured_on: str
    last_means: str  # what "last" and "best" are
    steps: int
    batch_size: int
    model: str
    last: dict[str, tuple[float, float]]
    best: dict[str, tuple[float, float]]


@cache
def corl_scores() -> CorlScores:
    """corl_dt.toml, beside this module."""
    data = tomllib.loads(Path(__file__).with_name("corl_dt.toml").read_text())

    def table(rows: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
        return {task: (float(mean), float(spread)) for task, (mean, spread) in rows.items()}

    return CorlScores(
        source=data["source"],
        measured_on=data["measured_on"],
        last_means=data["last_means"],
        steps=int(data["steps"]),
        batch_size=int(data["batch_size"]),
        model=data["model"],
        last=table(data["last"]),
        best=table(data["best"]),
    )


@dataclass
class CorlRow:
    """One task of the side table: the baseline's normalised final scores here, its budget, and
    CORL's DT beside them."""

    task: str
    steps: list[int]
    parameters: list[int]
    mean: float
    interval: tuple[float, float] | None  # Student's t, 95%; None for one seed
    corl_last: tuple[float, float]
    corl_best: tuple[float, float]

    @property
    def fraction(self) -> float:
        """What fraction of CORL's last score this budget reaches (the ratio of the means)."""
        return self.mean / self.corl_last[0]


def corl_rows(rows: Sequence[Row], baseline: str | None, corl: CorlScores) -> list[CorlRow]:
    """Per task that CORL has, where the baseline config has normalised final scores."""
    return [
        CorlRow(
            row.task,
            list(dict.fromkeys(row.steps)),
            list(dict.fromkeys(row.parameters)),
            float(np.mean(row.final)),
            t_interval(row.final),
            corl.last[row.task],
            corl.best[row.task],
        )
        for row in rows
        if row.config == baseline and row.task in corl.last and row.normalized and row.final
    ]


def corl_table(rows: Sequence[Row], baseline: str | None, corl: CorlScores) -> str:
    """The side table: per task that CORL has, the baseline config's normalised final scores here
    (mean and Student's t 95% interval, its steps and parameters) beside CORL's DT, and the ratio
    of the means. "" where the baseline has no normalised final score on such a task."""
    ours = corl_rows(rows, baseline, corl)
    if not ours:
        return ""
    lines = [
        CORL_HEADING,
        "",
        f"Not ours, and not on our data: {corl.source}, measured on {corl.measured_on}; "
        f"{corl.steps:,} training steps of a model of {corl.model}; {corl.last_means}, with the "
        f"± as printed. Beside it, this report's baseline {baseline} at its own budget, on the "
        "datasets named in the per-task table: the last column says what fraction of DT's score "
        "at CORL's budget this budget reaches, not which method is better.",
        "",
        f"| task | {baseline} here: steps, parameters | final mean [95% interval] | CORL DT last "
        "| CORL DT best | here / CORL last |",
        "|---|---|---|---:|---:|---:|",
    ]
    for found in ours:
        spread = (
            "one seed"
            if found.interval is None
            else f"[{found.interval[0]:.1f}, {found.interval[1]:.1f}]"
        )
        budget = (
            f"{', '.join(f'{s:,}' for s in found.steps)} steps, "
            f"{', '.join(f'{p:,}' for p in found.parameters) or 'unknown'} parameters"
        )
        last, best = found.corl_last, found.corl_best
        lines.append(
            f"| {found.task} | {budget} | {found.mean:.1f} {spread} | {last[0]:.1f} ± {last[1]:.1f} "
            f"| {best[0]:.1f} ± {best[1]:.1f} | {found.fraction:.2f} |"
        )
    return "\n".join(lines)
