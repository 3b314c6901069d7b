"""`primal-dt datasets list`, `info` and `download`: the datasets here and Minari's official ones,
what each is and where it came from, and fetching one (recipes.py makes datasets here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import DatasetError, TaskError
from primal_dt.data.episodes import download_dataset, open_dataset, reference_scores
from primal_dt.data.recipes import RECIPES
from primal_dt.data.sources import (
    BUNDLED_ROOT,
    find_dataset,
    is_local_id,
    minari_root,
    minari_root_at,
    origin,
)
from primal_dt.data.tasks import (
    available_qualities,
    env_for_gym_id,
    load_envs,
    resolve_dataset_ids,
    resolve_task,
)


@dataclass(frozen=True)
class Listed:
    """One row of `primal-dt datasets list`."""

    dataset_id: str
    state: str  # present, downloadable, made locally, bundled
    episodes: int | None
    steps: int | None
    tasks: tuple[str, ...]


def _datasets_in(root: Path) -> dict[str, dict[str, Any]]:
    import minari

    if not root.is_dir():
        return {}
    with minari_root_at(root):
        return minari.list_local_datasets()


def _task_names_by_id() -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for env in load_envs().values():
        for quality in available_qualities(env):
            for dataset_id in resolve_dataset_ids(env, quality):
                names.setdefault(dataset_id, []).append(f"{env.name}-{quality}")
    return names


def list_datasets() -> list[Listed]:
    """The datasets here (Minari root, bundled) and the official ids, each with its state."""
    tasks = _task_names_by_id()
    rows: dict[str, Listed] = {}

    def add(dataset_id: str, state: str, metadata: dict[str, Any] | None) -> None:
        rows[dataset_id] = Listed(
            dataset_id,
            state,
            metadata.get("total_episodes") if metadata else None,
            metadata.get("total_steps") if metadata else None,
            tuple(tasks.get(dataset_id, ())),
        )

    for dataset_id, metadata in _datasets_in(BUNDLED_ROOT).items():
        add(dataset_id, "bundled", metadata)
    for env in load_envs().values():
        for dataset_id in env.datasets.values():
            add(dataset_id, "downloadable", None)
    for dataset_id, metadata in _datasets_in(Path(minari_root())).items():
        add(dataset_id, "made locally" if is_local_id(dataset_id) else "present", metadata)
    return sorted(rows.values(), key=lambda row: row.dataset_id)


def format_list(rows: list[Listed]) -> str:
    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    width = max(len(row.dataset_id) for row in rows)
    lines = [f"{'dataset':<{width}}  {'state':<12}  {'episodes':>8}  {'steps':>8}  task"]
    for row in rows:
        lines.append(
            f"{row.dataset_id:<{width}}  {row.state:<12}  {count(row.episodes):>8}  "
            f"{count(row.steps):>8}  {', '.join(row.tasks) or '-'}"
        )
    lines += [
        f"Minari root: {minari_root()} (set MINARI_DATASETS_PATH to change it)",
        "downloadable: primal-dt datasets download ID (needs the network and minari[hf])",
        "make more: primal-dt datasets make --env ENV --recipe " + "|".join(RECIPES),
    ]
    return "\n".join(lines)


def _ids_for(name: str) -> tuple[str, ...]:
    """A dataset id as it is, or a task name (hopper-medium) as the ids it resolves to."""
    if "/" in name:
        return (name,)
    try:
        return resolve_task(name).dataset_ids
    except TaskError:
        raise DatasetError(
            f"{name!r} is neither a dataset id (namespace/env/name-vN) nor a task name; "
            f"primal-dt datasets list shows both"
        ) from None


def dataset_info(name: str) -> str:
    """Episodes, steps, returns, reference scores and provenance of a dataset (or a task's)."""
    import json

    blocks = []
    for dataset_id in _ids_for(name):
        if find_dataset(dataset_id) is None:
            raise DatasetError(
                f"dataset {dataset_id} is not on this machine (looked in {minari_root()} and the "
                f"bundled datasets); get it with primal-dt datasets download or make"
            )
        dataset = open_dataset(dataset_id, download=False)
        metadata = dataset.storage.metadata
        returns = np.array([float(np.sum(ep.rewards)) for ep in dataset.iterate_episodes()])
        env_id = dataset.env_spec.id if dataset.env_spec else "unknown"
        reference = reference_scores(dataset, env_for_gym_id(env_id), dataset_id)
        lines = [
            f"dataset      {dataset_id} ({origin(dataset_id)})",
            f"environment  {env_id}",
            f"episodes     {metadata['total_episodes']}",
            f"steps        {metadata['total_steps']}",
            f"return       min {returns.min():.1f}  mean {returns.mean():.1f}  "
            f"max {returns.max():.1f}",
            "reference    "
            + (
                f"random {reference.random:.2f}, expert {reference.expert:.2f} ({reference.source})"
                if reference
                else "none (scores cannot be normalised)"
            ),
            f"algorithm    {metadata.get('algorithm_name', 'unknown')}",
            f"description  {metadata.get('description', '')}",
        ]
        provenance = metadata.get("provenance")
        lines.append(
            "provenance   "
            + (
                json.dumps(provenance, indent=2)
                if provenance
                else "none recorded (not made by primal-dt)"
            )
        )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def download(dataset_id: str) -> str:
    """Fetch an official dataset into the Minari root; returns where it is."""
    if is_local_id(dataset_id):
        raise DatasetError(
            f"{dataset_id} is made locally, not downloaded: make it with primal-dt datasets make"
        )
    found = find_dataset(dataset_id)
    if found is None:
        download_dataset(dataset_id)
        found = find_dataset(dataset_id)
    return str(found)
