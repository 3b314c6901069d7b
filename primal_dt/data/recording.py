"""Record episodes of a policy in a Gymnasium environment as a Minari dataset.

Uses minari.create_dataset_from_buffers, so the result is an ordinary Minari dataset that
minari.load_dataset opens; no extra dependencies (DataCollector would pull in jax). Behaviour
policies are either uniform-random or Stable-Baselines3 models (SAC, or TQC from sb3-contrib).
What was recorded, and how, goes into the dataset's metadata under "provenance" (Minari keeps any
extra metadata key), so a dataset always says where it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import platform
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from primal_dt.common.errors import DatasetError
from primal_dt.common.progress import progress_bar
from primal_dt.data.tasks import make_env

if TYPE_CHECKING:  # Stable-Baselines3 is optional ([record]); imported where a policy loads
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

PolicyFn = Callable[[np.ndarray], np.ndarray]


def random_policy(action_space: gym.spaces.Box, seed: int) -> PolicyFn:
    """Uniform-random actions, D4RL's "random" behaviour."""
    rng = np.random.default_rng(seed)

    def act(observation: np.ndarray) -> np.ndarray:
        return rng.uniform(action_space.low, action_space.high).astype(action_space.dtype)

    return act


def sb3_algorithm(path: str | Path) -> str:
    """ "SAC" or "TQC", read from the policy file without loading it."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read("data").decode()
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{path} is not a Stable-Baselines3 policy file: {err}") from None
    return "TQC" if '"sb3_contrib.tqc' in data else "SAC"


def sb3_policy(
    path: str | Path, deterministic: bool = False, seed: int | None = None, env_id: str = ""
) -> PolicyFn:
    """A Stable-Baselines3 SAC or TQC policy file as a function of the observation; with env_id,
    checked to act in that environment (its observation and action spaces).

    Sampled actions come from torch's global generator: give `seed` to make a recording repeatable.
    """
    path = Path(path)
    algorithm = sb3_algorithm(path)
    loader: type[OffPolicyAlgorithm]  # SAC or TQC
    try:
        if algorithm == "TQC":
            from sb3_contrib import TQC

            loader = TQC
        else:
            from stable_baselines3 import SAC

            loader = SAC
    except ImportError:
        raise DatasetError(
            "recording from a policy file needs pip install 'primal-dt[record]'"
        ) from None
    model = loader.load(path, device="cpu")
    if env_id:
        check_spaces(path, model.observation_space, model.action_space, env_id)
    if seed is not None:
        model.set_random_seed(seed)

    def act(observation: np.ndarray) -> np.ndarray:
        action, _ = model.predict(observation, deterministic=deterministic)
        return action

    return act


def check_spaces(path: Path, observations: Any, actions: Any, env_id: str) -> None:
    """A policy acts only in an environment with its own observation and action shapes."""
    env = make_env(env_id)
    wanted = (env.observation_space.shape, env.action_space.shape)
    env.close()
    if (observations.shape, actions.shape) != wanted:
        raise DatasetError(
            f"{path} is a policy for observations of shape {observations.shape} and actions of "
            f"shape {actions.shape}, but {env_id} has observations of shape {wanted[0]} and "
            f"actions of shape {wanted[1]}: give a policy trained on {env_id}"
        )


def policy_record(path: str | Path, deterministic: bool) -> dict[str, Any]:
    """What identifies a policy file in provenance: its path as given, sha256 and algorithm."""
    return {
        "file": str(path),
        "sha256": sha256(path),
        "algorithm": sb3_algorithm(path),
        "deterministic": deterministic,
    }


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    """The versions that shape a recording: Python and the packages that step or act."""
    found = {"python": platform.python_version()}
    for name in (
        "primal-dt",
        "minari",
        "gymnasium",
        "mujoco",
        "numpy",
        "torch",
        "stable-baselines3",
        "sb3-contrib",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def record_episodes(
    env_id: str,
    policy: PolicyFn,
    episodes: int | None = None,
    seed: int = 0,
    max_episode_steps: int | None = None,
    steps: int | None = None,
    progress: bool = False,
) -> list[Any]:
    """Roll `policy` out into Minari buffers: `episodes` episodes, or exactly `steps` steps.

    Episode i is reset with seed + i. With a step budget the last episode is cut where the budget
    ends and marked truncated, as a time limit would.
    """
    budget = steps if episodes is None else episodes
    if (episodes is None) == (steps is None) or budget is None or budget <= 0:
        raise DatasetError(
            f"record a positive number of episodes or of steps, not both "
            f"(got episodes={episodes}, steps={steps})"
        )
    env = make_env(env_id, max_episode_steps)
    buffers: list[Any] = []
    total = 0
    bar = progress_bar(budget, 0, env_id, progress, unit="step" if steps else "episode")
    try:
        while (total if steps else len(buffers)) < budget:
            room = None if steps is None else steps - total
            buffer = record_episode(env, policy, len(buffers), seed + len(buffers), room)
            total += len(buffer.rewards)
            bar.update(len(buffer.rewards) if steps else 1)
            buffers.append(buffer)
    finally:
        bar.close()
        env.close()
    return buffers


def record_episode(env: gym.Env, policy: PolicyFn, index: int, seed: int, room: int | None) -> Any:
    """Episode `index`, from reset(seed), as a Minari buffer; cut after `room` steps where given
    (the end of a step budget) and marked truncated there, as a time limit would."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    observation, _ = env.reset(seed=seed)
    observations, actions = [observation], []
    rewards: list[Any] = []  # as the environment returns them: their dtype is the dataset's
    terminations: list[bool] = []
    truncations: list[bool] = []
    while True:
        action = policy(observation)
        observation, reward, terminated, truncated, _ = env.step(action)
        truncated = truncated or len(rewards) + 1 == room
        observations.append(observation)
        actions.append(action)
        rewards.append(reward)
        terminations.append(terminated)
        truncations.append(truncated)
        if terminated or truncated:
            break
    return EpisodeBuffer(
        id=index,
        seed=seed,
        observations=np.asarray(observations),
        actions=np.asarray(actions, dtype=env.action_space.dtype),
        rewards=np.asarray(rewards),
        terminations=np.asarray(terminations),
        truncations=np.asarray(truncations),
    )


def episode_returns(env_id: str, policy: PolicyFn, episodes: int, seed: int) -> list[float]:
    """Each of `episodes` episodes' undiscounted return under `policy` (seeds seed, seed+1...)."""
    return [float(np.sum(b.rewards)) for b in record_episodes(env_id, policy, episodes, seed)]


def mean_return(env_id: str, policy: PolicyFn, episodes: int, seed: int) -> float:
    """The mean undiscounted return of `policy` over `episodes` episodes (seeds seed, seed+1...)."""
    return float(np.mean(episode_returns(env_id, policy, episodes, seed)))


def action_space(env_id: str) -> gym.spaces.Box:
    """The environment's action space (a Box: the locomotion tasks act in one)."""
    env = make_env(env_id)
    env.close()
    space = env.action_space
    assert isinstance(space, gym.spaces.Box), f"{env_id} acts in a box"
    return space


def write_dataset(
    dataset_id: str,
    env_id: str,
    buffers: list[Any],
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    algorithm_name: str = "unknown",
    description: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> Any:
    """Write buffers as the Minari dataset `dataset_id` in the local root; returns the dataset.

    `provenance` (plain JSON values) is stored as the metadata key "provenance".
    """
    import minari

    env = make_env(env_id)
    try:
        with warnings.catch_warnings():  # Minari warns about every optional field left empty
            warnings.simplefilter("ignore", UserWarning)
            dataset = minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env,
                algorithm_name=algorithm_name,
                author="primal-dt",
                description=description or f"{algorithm_name} episodes in {env_id} (primal-dt)",
                ref_min_score=ref_min_score,
                ref_max_score=ref_max_score,
            )
    finally:
        env.close()
    if provenance is not None:
        dataset.storage.update_metadata({"provenance": provenance})
    return dataset
