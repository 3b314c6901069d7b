"""Which tasks of a report are the same data: two datasets made by `primal-dt datasets make` with
the same recipe, environment, policy file and seed hold the same episodes whatever their ids, so
the aggregates and the average rows count such a task once (report.py says which, and why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from primal_dt.common.errors import PrimalDTError
from primal_dt.data.episodes import open_dataset
from primal_dt.data.sources import find_dataset


def dataset_provenance(dataset_id: str) -> dict[str, Any] | None:
    """The "provenance" a dataset made by primal-dt datasets make records (data/recipes.py), or
    None: not made by primal-dt, or not on this machine."""
    if find_dataset(dataset_id) is None:
        return None
    try:
        provenance = open_dataset(dataset_id, download=False).storage.metadata.get("provenance")
    except PrimalDTError:
        return None
    return provenance if isinstance(provenance, dict) else None


Provenance = Callable[[str], dict[str, Any] | None]


def data_identity(dataset_id: str, provenance: Provenance = dataset_provenance) -> frozenset[tuple]:
    """What makes a dataset's data what it is: for one primal-dt recorded, its recipe, environment,
    the sha256 of its policy file and its seed (so a copy under another id is the same data); for
    a combined one (medium-expert), its parts'; for any other, its id."""
    return _identity(dataset_id, provenance(dataset_id))


def _identity(dataset_id: str, made: dict[str, Any] | None) -> frozenset[tuple]:
    if not made or "recipe" not in made:
        return frozenset({("id", dataset_id)})
    sources = made.get("sources")
    if isinstance(sources, list) and sources:
        parts: frozenset[tuple] = frozenset()
        for source in sources:
            parts |= _identity(str(source["id"]), source.get("provenance"))
        return parts
    policy = made.get("policy")
    if isinstance(policy, dict):
        policy = policy.get("sha256")
    training = made.get("training")
    if policy is None and isinstance(training, dict):  # medium-replay: the policy it reached
        policy = (training.get("medium_policy") or {}).get("sha256")
    return frozenset({("made", made["recipe"], made.get("env_id"), policy, made.get("seed"))})


@dataclass(frozen=True)
class SameData:
    """A task whose datasets are the same data as an earlier task's (in sorted task order)."""

    task: str
    same_as: str
    how: str


def same_data(
    datasets: dict[str, list[str]], provenance: Provenance = dataset_provenance
) -> list[SameData]:
    """The tasks (in sorted order) whose data an earlier task already has: the same provenance
    for every dataset of theirs (a combined task: the same set of parts)."""
    first: dict[frozenset[tuple], str] = {}
    found = []
    for task in sorted(datasets):
        identity: frozenset[tuple] = frozenset()
        for dataset_id in datasets[task]:
            identity |= data_identity(dataset_id, provenance)
        if not identity:
            continue
        if identity in first:
            found.append(SameData(task, first[identity], _how(identity)))
        else:
            first[identity] = task
    return found


def _how(identity: frozenset[tuple]) -> str:
    parts = []
    for part in sorted(identity, key=repr):
        if part[0] == "id":
            parts.append(f"dataset {part[1]}")
        else:
            _, recipe, env_id, policy, seed = part
            policy = (
                f"policy sha256 {policy[:12]}"
                if policy and policy != "uniform-random"
                else (policy or "no policy file")
            )
            parts.append(f"recipe {recipe} on {env_id}, {policy}, seed {seed}")
    return "; ".join(parts)
