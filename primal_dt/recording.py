"""Record episodes of a policy in a Gymnasium environment as a Minari dataset.

Uses minari.create_dataset_from_buffers, so the result is an ordinary Minari dataset that
minari.load_dataset opens; no extra dependencies (DataCollector would pull in jax). Behaviour
policies are either uniform-random or Stable-Baselines3 models (SAC, or TQC from sb3-contrib).
"""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from primal_dt.errors import DatasetError
from primal_dt.tasks import make_env

PolicyFn = Callable[[np.ndarray], np.ndarray]


def random_policy(action_space: gym.spaces.Box, seed: int) -> PolicyFn:
    """Uniform-random actions, D4RL's "random" behaviour."""
    rng = np.random.default_rng(seed)

    def act(observation: np.ndarray) -> np.ndarray:
        return rng.uniform(action_space.low, action_space.high).astype(action_space.dtype)

    return act


def sb3_policy(path: str | Path, deterministic: bool = False) -> PolicyFn:
    """A Stable-Baselines3 SAC or TQC policy file as a function of the observation."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read("data").decode()
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{path} is not a Stable-Baselines3 policy file: {err}") from None
    try:
        if '"sb3_contrib.tqc' in data:
            from sb3_contrib import TQC as Algorithm
        else:
            from stable_baselines3 import SAC as Algorithm
    except ImportError:
        raise DatasetError(
            "recording from a policy file needs pip install 'primal-dt[record]'"
        ) from None
    model = Algorithm.load(path, device="cpu")

    def act(observation: np.ndarray) -> np.ndarray:
        action, _ = model.predict(observation, deterministic=deterministic)
        return action

    return act


def record_episodes(
    env_id: str,
    policy: PolicyFn,
    episodes: int,
    seed: int,
    max_episode_steps: int | None = None,
) -> list[Any]:
    """Roll `policy` out for `episodes` episodes (seeds seed, seed+1, ...) into Minari buffers."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    env = make_env(env_id, max_episode_steps)
    buffers = []
    try:
        for index in range(episodes):
            observation, _ = env.reset(seed=seed + index)
            observations, actions, rewards, terminations, truncations = (
                [observation],
                [],
                [],
                [],
                [],
            )
            while True:
                action = policy(observation)
                observation, reward, terminated, truncated, _ = env.step(action)
                observations.append(observation)
                actions.append(action)
                rewards.append(reward)
                terminations.append(terminated)
                truncations.append(truncated)
                if terminated or truncated:
                    break
            buffers.append(
                EpisodeBuffer(
                    id=index,
                    seed=seed + index,
                    observations=np.asarray(observations),
                    actions=np.asarray(actions, dtype=env.action_space.dtype),
                    rewards=np.asarray(rewards),
                    terminations=np.asarray(terminations),
                    truncations=np.asarray(truncations),
                )
            )
    finally:
        env.close()
    return buffers


def write_dataset(
    dataset_id: str,
    env_id: str,
    buffers: list[Any],
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    algorithm_name: str = "unknown",
    description: str | None = None,
) -> Any:
    """Write buffers as the Minari dataset `dataset_id` in the local root; returns the dataset."""
    import minari

    env = make_env(env_id)
    try:
        with warnings.catch_warnings():  # Minari warns about every optional field left empty
            warnings.simplefilter("ignore", UserWarning)
            return minari.create_dataset_from_buffers(
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
