"""Task names -> environment, Minari dataset ids, target returns and reference scores (from envs/).

A task is `<env>-<quality>`: env is a file in envs/ (halfcheetah, hopper, walker2d, ant), quality is
simple, medium, expert, or medium-expert (medium and expert combined, as in D4RL). Any other Minari
dataset can be trained on by its id instead (`--dataset`).
"""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

import gymnasium as gym

from primal_dt.errors import TaskError
from primal_dt.resources import resource_dir

COMBINED_QUALITIES = {"medium-expert": ("medium", "expert")}


@dataclass(frozen=True)
class EnvInfo:
    """One locomotion environment, as described by its envs/<name>.toml."""

    name: str
    gym_id: str
    max_episode_steps: int
    eval_targets: tuple[float, ...]
    datasets: dict[str, str]
    ref_random: float
    ref_expert: float
    ref_source: str

    @property
    def qualities(self) -> list[str]:
        combined = [
            q for q, parts in COMBINED_QUALITIES.items() if set(parts) <= set(self.datasets)
        ]
        return [*self.datasets, *combined]


@dataclass(frozen=True)
class Task:
    """What to train on: a name for logs, the Minari dataset ids, and the env when it is known."""

    name: str
    dataset_ids: tuple[str, ...]
    env: EnvInfo | None


@cache
def load_envs() -> dict[str, EnvInfo]:
    """Every envs/*.toml, by name."""
    envs = {}
    for path in sorted(resource_dir("envs").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        reference = data["reference"]
        envs[data["name"]] = EnvInfo(
            name=data["name"],
            gym_id=data["gym_id"],
            max_episode_steps=int(data["max_episode_steps"]),
            eval_targets=tuple(float(t) for t in data["eval_targets"]),
            datasets=dict(data["datasets"]),
            ref_random=float(reference["random"]),
            ref_expert=float(reference["expert"]),
            ref_source=str(reference["source"]),
        )
    return envs


def task_names() -> list[str]:
    return [f"{env.name}-{q}" for env in load_envs().values() for q in env.qualities]


def resolve_task(name: str) -> Task:
    """`halfcheetah-medium` -> Task; an unknown name raises TaskError listing the valid ones."""
    envs = load_envs()
    env_name, _, quality = name.partition("-")
    env = envs.get(env_name)
    if env is None or quality not in env.qualities:
        raise TaskError(
            f"unknown task {name!r}: a task is <env>-<quality> with env one of "
            f"{', '.join(envs)} and quality one of simple, medium, expert, medium-expert "
            f"(e.g. halfcheetah-medium), or pass --dataset ID to train on any Minari dataset"
        )
    parts = COMBINED_QUALITIES.get(quality, (quality,))
    return Task(name=name, dataset_ids=tuple(env.datasets[p] for p in parts), env=env)


def dataset_task(dataset_id: str) -> Task:
    """A task for any Minari dataset id; its environment is found once the dataset is loaded."""
    return Task(name=dataset_id, dataset_ids=(dataset_id,), env=None)


def env_for_gym_id(gym_id: str) -> EnvInfo | None:
    """The envs/ entry for a Gymnasium id such as HalfCheetah-v5 (any version), if there is one."""
    base = gym_id.split("-v")[0].lower()
    for env in load_envs().values():
        if env.gym_id.split("-v")[0].lower() == base:
            return env
    return None


_MUJOCO_WARNINGS_SEEN: set[str] = set()


def _mujoco_warning(message: str) -> None:
    if message not in _MUJOCO_WARNINGS_SEEN:
        _MUJOCO_WARNINGS_SEEN.add(message)
        warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


def quiet_mujoco_warnings() -> None:
    """Say each MuJoCo compiler warning once, not at every environment built.

    (MuJoCo 4 warns that Gymnasium's HalfCheetah XML uses the deprecated 'settotalmass'.)
    """
    try:
        import mujoco

        mujoco.set_mju_user_warning(_mujoco_warning)
    except (ImportError, AttributeError):
        pass


def make_env(env_id: str, max_episode_steps: int | None = None, **kwargs: Any) -> gym.Env:
    quiet_mujoco_warnings()
    return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
