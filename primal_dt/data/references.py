"""One pair of reference scores per environment, measured once with enough episodes, for every
dataset of that environment: normalised scores are 100 (R - random) / (expert - random), so a
reference that moves by a few percent between two datasets of one environment moves their scores
apart by as much, for nothing.

`primal-dt datasets reference` measures them: uniform-random actions and the expert policy
(stochastic actions), episodes added ten at a time until the standard error of each mean is under
`tolerance` (0.5%) of the expert's mean, and writes them into a JSON file of references by
environment (the repository's: tests/policies/references.json, beside the expert policies).
`primal-dt datasets make --reference FILE` then writes the file's pair into the dataset's
metadata instead of measuring ten episodes of its own; the file's expert must be the
--expert-policy given (the same sha256).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import DatasetError, check_folder
from primal_dt.data.recording import (
    action_space,
    episode_returns,
    policy_record,
    random_policy,
    sb3_policy,
    sha256,
)
from primal_dt.data.tasks import load_envs

TOLERANCE = 0.005  # each mean's standard error, as a fraction of the expert's mean
BATCH = 10  # episodes added at a time
MAX_EPISODES = 2000  # given up beyond this (a policy too erratic to reference)
RANDOM_SEED, EXPERT_SEED = 100_000, 200_000  # the episodes' first seeds, as datasets make's


@dataclass
class Reference:
    """An environment's reference scores, measured (measure_reference)."""

    env_id: str
    random: float  # mean return of uniform-random actions
    expert: float  # mean return of the expert policy, stochastic actions
    random_se: float  # standard errors of the two means
    expert_se: float
    random_episodes: int
    expert_episodes: int
    expert_policy: dict[str, Any]  # policy_record: file, sha256, algorithm

    @property
    def how(self) -> str:
        return (
            f"measured on {self.env_id}: mean return over {self.random_episodes} episodes of "
            f"uniform-random actions ({self.random:.2f} ± {self.random_se:.2f} s.e.) and "
            f"{self.expert_episodes} of {'/'.join(Path(self.expert_policy['file']).parts[-2:])} "
            f"(stochastic actions, {self.expert:.2f} ± {self.expert_se:.2f} s.e.)"
        )

    def provenance(self) -> dict[str, Any]:
        """The dataset metadata's "reference" entry (recipes.make_dataset)."""
        return {
            "random": self.random,
            "expert": self.expert,
            "episodes": self.expert_episodes,
            "expert_policy": self.expert_policy,
            "how": self.how,
        }


def _standard_error(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) / math.sqrt(len(values))


def measure_reference(
    env_id: str,
    expert_path: str | Path,
    tolerance: float | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> Reference:
    """The expert's episodes first (their mean sets the tolerance in points), then the random
    ones', each BATCH at a time until its standard error is under tolerance (TOLERANCE) x the
    expert's mean."""
    tolerance = TOLERANCE if tolerance is None else tolerance
    expert_policy = sb3_policy(expert_path, False, EXPERT_SEED, env_id)
    expert: list[float] = []
    while len(expert) < 2 * BATCH or _standard_error(expert) > tolerance * abs(np.mean(expert)):
        if len(expert) >= MAX_EPISODES:
            raise DatasetError(
                f"{expert_path}: its returns on {env_id} vary too much to reach a standard error "
                f"of {tolerance:.1%} in {MAX_EPISODES} episodes"
            )
        expert += episode_returns(env_id, expert_policy, BATCH, EXPERT_SEED + len(expert))
        log(
            f"{env_id} expert: {len(expert)} episodes, {np.mean(expert):.1f} ± "
            f"{_standard_error(expert):.1f}"
        )
    points = tolerance * abs(float(np.mean(expert)))
    space = action_space(env_id)
    random: list[float] = []
    while len(random) < 2 * BATCH or _standard_error(random) > points:
        act = random_policy(space, RANDOM_SEED + len(random))
        random += episode_returns(env_id, act, BATCH, RANDOM_SEED + len(random))
    return Reference(
        env_id,
        float(np.mean(random)),
        float(np.mean(expert)),
        _standard_error(random),
        _standard_error(expert),
        len(random),
        len(expert),
        policy_record(expert_path, deterministic=False),
    )


def read_references(path: Path) -> dict[str, Reference]:
    """A references file (write_references) by environment id; {} where there is none."""
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {env_id: Reference(**item) for env_id, item in raw.items()}
    except (ValueError, TypeError) as err:
        raise DatasetError(
            f"{path} is not a references file ({err}); measure them again with "
            f"primal-dt datasets reference"
        ) from err


def write_references(path: Path, references: dict[str, Reference]) -> None:
    data = {env_id: asdict(found) for env_id, found in sorted(references.items())}
    path.write_text(json.dumps(data, indent=1) + "\n")


def reference_for(path: Path, env_id: str, expert_path: str | Path) -> Reference:
    """The file's reference of env_id, checked to be of this expert policy (its sha256)."""
    found = read_references(path).get(env_id)
    if found is None:
        raise DatasetError(
            f"{path} has no reference scores for {env_id}; measure them with primal-dt datasets "
            f"reference --env ... --expert-policy {expert_path} --out {path}"
        )
    if found.expert_policy["sha256"] != sha256(expert_path):
        raise DatasetError(
            f"{path}: the reference scores of {env_id} were measured with another expert policy "
            f"({found.expert_policy['file']}) than --expert-policy {expert_path}; give that "
            f"policy, or measure them again with primal-dt datasets reference"
        )
    return found


def measure_into(
    path: Path, env: str, expert_path: str | Path, log: Callable[[str], None] = lambda m: None
) -> Reference:
    """Measure env's reference scores (an environment's name, e.g. hopper) and write them into the
    references file, beside the other environments' it holds."""
    found_env = load_envs().get(env)
    if found_env is None:
        raise DatasetError(f"unknown environment {env!r}; one of {', '.join(sorted(load_envs()))}")
    if not Path(expert_path).is_file():
        raise DatasetError(f"--expert-policy {expert_path}: no such file")
    check_folder(path.parent, "--out")
    references = read_references(path)  # a broken file is refused before the hours of episodes
    found = measure_reference(found_env.gym_id, expert_path, log=log)
    write_references(path, {**references, found.env_id: found})
    return found
