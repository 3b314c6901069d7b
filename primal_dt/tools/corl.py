"""CORL's published Decision Transformer scores (corl_dt.toml), as data, and the side table that
sets a report's DT beside them.

The issue a short study has to answer is what its budget reaches: DT trained for a few thousand
steps of a small model scores below DT trained for 100k steps of CORL's. CORL measured on D4RL v2
datasets in gym v3 environments, so its numbers stand in a table of their own, beside ours, and the
ratio of the two means says how far this budget is from DT's own, not which method is better.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from primal_dt.data.episodes import ReferenceScores
from primal_dt.data.tasks import load_envs
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


def on_d4rl_scale(score: float, ours: ReferenceScores, task: str) -> float | None:
    """A score normalised with our reference scores, normalised again with D4RL's for the task's
    environment (envs/<env>.toml [reference], the scale CORL's scores are on): the same return on
    CORL's scale; None where the environment has no D4RL reference."""
    env = load_envs().get(task.partition("-")[0])
    if env is None or not env.ref_source.startswith("D4RL"):
        return None
    returns = ours.random + score / 100 * (ours.expert - ours.random)
    return 100 * (returns - env.ref_random) / (env.ref_expert - env.ref_random)


@dataclass
class CorlRow:
    """One task of the side table: the baseline's normalised final scores here, its budget, and
    CORL's DT beside them, with our mean on D4RL's scale where it can be put there."""

    task: str
    steps: list[int]
    parameters: list[int]
    mean: float  # on this report's reference scores
    interval: tuple[float, float] | None  # Student's t, 95%; None for one seed
    corl_last: tuple[float, float]
    corl_best: tuple[float, float]
    mean_d4rl: float | None  # the same mean on D4RL's reference scores (on_d4rl_scale)

    @property
    def fraction(self) -> float:
        """What fraction of CORL's last score this budget reaches, both on D4RL's scale (on ours
        where the task has no D4RL reference)."""
        ours = self.mean if self.mean_d4rl is None else self.mean_d4rl
        return ours / self.corl_last[0]


def corl_rows(
    rows: Sequence[Row],
    baseline: str | None,
    corl: CorlScores,
    references: Mapping[str, ReferenceScores] | None = None,
) -> list[CorlRow]:
    """Per task that CORL has, where the baseline config has normalised final scores; references:
    each task's reference scores (those its scores are normalised with), for D4RL's scale."""
    found = []
    for row in rows:
        if not (row.config == baseline and row.task in corl.last and row.normalized and row.final):
            continue
        mean = float(np.mean(row.final))
        ours = (references or {}).get(row.task)
        found.append(
            CorlRow(
                row.task,
                list(dict.fromkeys(row.steps)),
                list(dict.fromkeys(row.parameters)),
                mean,
                t_interval(row.final),
                corl.last[row.task],
                corl.best[row.task],
                None if ours is None else on_d4rl_scale(mean, ours, row.task),
            )
        )
    return found


def corl_table(
    rows: Sequence[Row],
    baseline: str | None,
    corl: CorlScores,
    references: Mapping[str, ReferenceScores] | None = None,
) -> str:
    """The side table: per task that CORL has, the baseline config's normalised final scores here
    (mean and Student's t 95% interval, its steps and parameters), the mean on D4RL's scale,
    beside CORL's DT, and the ratio of the means on that one scale. "" where the baseline has no
    normalised final score on such a task."""
    ours = corl_rows(rows, baseline, corl, references)
    if not ours:
        return ""
    lines = [
        CORL_HEADING,
        "",
        f"Not ours, and not on our data: {corl.source}, measured on {corl.measured_on}; "
        f"{corl.steps:,} training steps of a model of {corl.model}; {corl.last_means}, with the "
        f"± as printed. Beside it, this report's baseline {baseline} at its own budget, on the "
        "datasets named in the per-task table: its mean on this report's reference scores, and "
        "the same returns on D4RL's reference scores (envs/<env>.toml), the scale CORL's are on; "
        "the last column, on that one scale, says what fraction of DT's score at CORL's budget "
        "this budget reaches, not which method is better.",
        "",
        f"| task | {baseline} here: steps, parameters | final mean [95% interval] | on D4RL's "
        "scale | CORL DT last | CORL DT best | here / CORL last (D4RL's scale) |",
        "|---|---|---|---:|---:|---:|---:|",
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
        d4rl = "n/a" if found.mean_d4rl is None else f"{found.mean_d4rl:.1f}"
        last, best = found.corl_last, found.corl_best
        lines.append(
            f"| {found.task} | {budget} | {found.mean:.1f} {spread} | {d4rl} | {last[0]:.1f} ± "
            f"{last[1]:.1f} | {best[0]:.1f} ± {best[1]:.1f} | {found.fraction:.2f} |"
        )
    return "\n".join(lines)
