"""Task names -> environment, Minari dataset ids, target returns and reference scores (from envs/).

A task is `<env>-<quality>`: env is a file in envs/ (halfcheetah, hopper, walker2d, ant, swimmer,
humanoid), quality is simple (all but swimmer), medium, expert, medium-expert (medium and expert
combined, as in D4RL), or any quality made locally with `primal-dt datasets make` (medium-replay,
for one, exists only that way) or bundled with primal-dt (`hopper-bundled`). Any other Minari
dataset can be trained on by its id instead (`--dataset`).

A quality resolves to: the official dataset if it is in the Minari root, else primal-dt's own
`primal-dt/<env>/<quality>-v0` (made locally, then bundled), else the official id, to be downloaded.
"""

from __future__ import annotations

import os
import sys
import tomllib
import warnings
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import gymnasium as gym

from primal_dt.common.errors import TaskError, did_you_mean
from primal_dt.common.resources import resource_dir
from primal_dt.data.sources import find_dataset, is_local_id, local_id, local_qualities

COMBINED_QUALITIES = {"medium-expert": ("medium", "expert")}
# Qualities D4RL has but Minari does not host for v5: valid once made with `primal-dt datasets make`.
LOCAL_ONLY_QUALITIES = ("medium-replay",)


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


def available_qualities(env: EnvInfo) -> list[str]:
    """Official qualities, those made locally or bundled, and the combinations their parts allow."""
    local = [q for q in local_qualities(env.name) if q not in env.datasets]
    have = {*env.datasets, *local}
    combined = [
        q for q, parts in COMBINED_QUALITIES.items() if set(parts) <= have and q not in have
    ]
    return [*env.datasets, *local, *combined]


def task_names() -> list[str]:
    return [f"{env.name}-{q}" for env in load_envs().values() for q in available_qualities(env)]


def _resolve_part(env: EnvInfo, quality: str) -> str:
    official = env.datasets.get(quality)
    if official is not None and find_dataset(official) is not None:
        return official
    own = local_id(env.name, quality)
    return own if official is None or find_dataset(own) is not None else official


def resolve_dataset_ids(env: EnvInfo, quality: str) -> tuple[str, ...]:
    """The dataset ids a quality stands for on this machine (see the module docstring)."""
    parts = COMBINED_QUALITIES.get(quality)
    if parts is None:
        return (_resolve_part(env, quality),)
    ids = tuple(_resolve_part(env, part) for part in parts)
    official_here = all(not is_local_id(i) and find_dataset(i) is not None for i in ids)
    combined = local_id(env.name, quality)
    return (combined,) if find_dataset(combined) is not None and not official_here else ids


def resolve_task(name: str) -> Task:
    """`halfcheetah-medium` -> Task; an unknown name raises TaskError listing the valid ones."""
    envs = load_envs()
    env_name, _, quality = name.partition("-")
    env = envs.get(env_name)
    qualities = available_qualities(env) if env is not None else []
    if env is not None and quality in LOCAL_ONLY_QUALITIES and quality not in qualities:
        raise TaskError(
            f"unknown task {name!r}: Minari hosts no {quality} dataset for {env.gym_id} and none "
            f"was made here; make one with: primal-dt datasets make --env {env.name} "
            f"--recipe {quality}"
        )
    if env is None or quality not in qualities:
        raise TaskError(
            f"unknown task {name!r}{did_you_mean(name, task_names())}: a task is "
            f"<env>-<quality> with env one of "
            f"{', '.join(envs)} and quality one of simple, medium, expert, medium-expert or one "
            f"made locally (primal-dt datasets list shows them; e.g. halfcheetah-medium, "
            f"hopper-bundled), or pass --dataset ID to train on any Minari dataset"
        )
    return Task(name=name, dataset_ids=resolve_dataset_ids(env, quality), env=env)


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


def import_mujoco() -> ModuleType:
    """MuJoCo, imported without an OpenGL back-end, whatever MUJOCO_GL says.

    `import mujoco` loads the back-end MUJOCO_GL names, and fails outright when its library is
    missing (MUJOCO_GL=osmesa without libOSMesa: "'NoneType' object has no attribute
    'glGetError'"), yet the simulation needs no OpenGL. Gymnasium loads the back-end itself when an
    environment draws its first frame (video.py turns a missing one into VideoUnavailable).
    """
    if "mujoco" not in sys.modules:
        chosen = os.environ.get("MUJOCO_GL")
        os.environ["MUJOCO_GL"] = "disable"
        try:
            import mujoco  # noqa: F401
        finally:
            if chosen is None:
                del os.environ["MUJOCO_GL"]
            else:
                os.environ["MUJOCO_GL"] = chosen
    return sys.modules["mujoco"]


def quiet_mujoco_warnings() -> None:
    """Import MuJoCo without a renderer (import_mujoco) and have it say each compiler warning
    once, not at every environment built.

    (MuJoCo 4 warns that Gymnasium's HalfCheetah XML uses the deprecated 'settotalmass'.)
    """
    with suppress(ImportError, AttributeError):  # no MuJoCo, or one without this hook
        import_mujoco().set_mju_user_warning(_mujoco_warning)


def make_env(env_id: str, max_episode_steps: int | None = None, **kwargs: Any) -> gym.Env:
    quiet_mujoco_warnings()
    return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
