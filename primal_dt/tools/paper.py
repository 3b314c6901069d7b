"""The Primal-Attention paper's D4RL table (paper_scores.toml), as data.

Its numbers were measured another way than ours (D4RL v2 datasets, gym v3, D4RL's reference
scores), so the report prints them in a table of their own and never in a row beside ours.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ENVS = ("halfcheetah", "hopper", "walker2d")
QUALITIES = ("medium", "medium-replay", "medium-expert")


@dataclass(frozen=True)
class PaperScores:
    """The Primal-Attention paper's D4RL table (paper_scores.toml): not ours."""

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
        """The paper's score(s) of a task (or "average") with their ±: config's column, or every
        column for configs that are none of its columns."""
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

    def tasks(self) -> list[str]:
        """Its tasks, environment by environment: medium, medium-replay, medium-expert."""
        ordered = [f"{env}-{quality}" for env in ENVS for quality in QUALITIES]
        return [t for t in ordered if t in self.scores] + [
            t for t in self.scores if t not in ordered
        ]


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
