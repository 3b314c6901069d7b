"""Minari episodes -> normalised tensors on the training device -> batches of K-step windows.

Loading looks in the local Minari root first ($MINARI_DATASETS_PATH, default ~/.minari/datasets), then
among the datasets bundled with primal-dt (read in place there), and downloads only when allowed.
Each episode's final observation row (Minari stores T+1) is dropped.
Sampling follows the DT paper: a trajectory with probability proportional to its length and a
uniform start inside it, which is the same as a start drawn uniformly over all steps; windows that
run past the episode's end are left-padded and masked. Batches are gathered with tensor indexing
on the device, with no per-sample Python loop.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from primal_dt.common.errors import DatasetError, did_you_mean
from primal_dt.data.sources import find_dataset, ids_here, minari_root
from primal_dt.data.tasks import (
    EnvInfo,
    Task,
    env_for_gym_id,
    load_envs,
    quiet_mujoco_warnings,
)


@dataclass(frozen=True)
class ReferenceScores:
    """Returns of a random and an expert policy; score = 100 (R - random) / (expert - random)."""

    random: float
    expert: float
    source: str

    def normalize(self, returns: np.ndarray | float) -> np.ndarray:
        return (
            100.0
            * (np.asarray(returns, dtype=np.float64) - self.random)
            / (self.expert - self.random)
        )


@dataclass
class Episode:
    observations: np.ndarray  # (T, S), the final observation dropped
    actions: np.ndarray  # (T, A)
    rewards: np.ndarray  # (T,)


@dataclass
class TaskData:
    """Everything training and evaluation need to know about a task's data and environment."""

    task: Task
    episodes: list[Episode]
    env_id: str
    env_kwargs: dict[str, Any]
    max_episode_steps: int
    reference: ReferenceScores | None
    eval_targets: tuple[float, ...]

    @property
    def state_dim(self) -> int:
        return self.episodes[0].observations.shape[1]

    @property
    def act_dim(self) -> int:
        return self.episodes[0].actions.shape[1]

    @property
    def best_return(self) -> float:
        """The best episode return in the data (marked on return-conditioning curves)."""
        return max(float(ep.rewards.sum()) for ep in self.episodes)

    def state_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of all states, the std floored so constant features do not divide by 0."""
        states = np.concatenate([ep.observations for ep in self.episodes])
        return states.mean(axis=0), states.std(axis=0) + 1e-6


def _check_download_possible(dataset_id: str, where: str) -> None:
    """Fail in seconds, not after network time-outs, when a download cannot work."""
    if importlib.util.find_spec("huggingface_hub") is None:
        raise DatasetError(
            f"dataset {dataset_id} is not in {where}, and downloading it needs Minari's Hugging Face "
            f"support: pip install 'minari[hf]' (or copy the dataset folder there)"
        )
    remote = os.environ.get("MINARI_REMOTE", "hf://farama-minari")
    if remote.startswith("hf://"):
        try:
            socket.create_connection(("huggingface.co", 443), timeout=5).close()
        except OSError as err:
            raise DatasetError(
                f"dataset {dataset_id} is not in {where} and huggingface.co cannot be reached "
                f"to download it ({err}); copy the dataset folder there from a machine with "
                f"network, or set MINARI_DATASETS_PATH to where it is"
            ) from None


def known_ids(dataset_id: str) -> list[str]:
    """The dataset ids a misspelt one may have meant: those on this machine and the official
    ones of envs/; none where the id is itself an official one (merely not downloaded yet)."""
    official = {i for env in load_envs().values() for i in env.datasets.values()}
    return [] if dataset_id in official else sorted({*ids_here(), *official})


def open_dataset(dataset_id: str, download: bool) -> Any:
    """minari.load_dataset with a clear error when the dataset is missing or unreadable."""
    import minari

    found = find_dataset(dataset_id)
    where = str(found) if found else os.path.join(minari_root(), dataset_id)
    if found is None:
        named = f"{dataset_id}{did_you_mean(dataset_id, known_ids(dataset_id))}"
        if not download:
            raise DatasetError(
                f"dataset {named} not found at {where} and download is off (--offline): "
                f"set MINARI_DATASETS_PATH to the folder that holds it, copy it there, or make "
                f"one with primal-dt datasets make (primal-dt datasets list shows what is here)"
            )
        download_dataset(dataset_id, named)
    try:
        return minari.MinariDataset(os.path.join(where, "data"))
    except Exception as err:
        raise DatasetError(f"cannot read dataset {dataset_id} at {where}: {err}") from None


def download_dataset(dataset_id: str, named: str | None = None) -> None:
    """Fetch an official dataset into the Minari root, failing fast when that cannot work."""
    import minari

    where = os.path.join(minari_root(), dataset_id)
    _check_download_possible(named or dataset_id, where)  # named: with its did-you-mean
    try:
        minari.download_dataset(dataset_id)
    except Exception as err:  # Minari raises ValueError, hub errors, OSError...
        raise DatasetError(f"could not download dataset {dataset_id}: {err}") from None


def _read_episodes(dataset: Any, dataset_id: str) -> list[Episode]:
    episodes = []
    for raw in dataset.iterate_episodes():
        if not isinstance(raw.observations, np.ndarray) or not isinstance(raw.actions, np.ndarray):
            raise DatasetError(
                f"dataset {dataset_id} has dictionary or tuple observations or actions; "
                f"primal-dt needs flat Box observations and actions"
            )
        episode = Episode(
            observations=np.asarray(raw.observations[:-1], dtype=np.float32),
            actions=np.asarray(raw.actions, dtype=np.float32).reshape(len(raw.rewards), -1),
            rewards=np.asarray(raw.rewards, dtype=np.float32),
        )
        if len(episode.rewards) == 0:
            continue
        for name in ("observations", "actions", "rewards"):
            if not np.isfinite(getattr(episode, name)).all():
                raise DatasetError(
                    f"dataset {dataset_id} episode {raw.id} has NaN or infinite {name}; "
                    f"fix or re-record the dataset"
                )
        episodes.append(episode)
    if not episodes:
        raise DatasetError(f"dataset {dataset_id} has no episodes with any steps")
    return episodes


def _check_spaces(episodes: list[Episode], env: Any, dataset_id: str) -> list[Episode]:
    """The episodes must fit the environment the policy will be evaluated in."""
    expected = (env.observation_space.shape, env.action_space.shape)
    for episode in episodes:
        found = (episode.observations.shape[1:], episode.actions.shape[1:])
        if found != expected:
            raise DatasetError(
                f"dataset {dataset_id} has observations/actions of shape {found[0]}/{found[1]} "
                f"but its environment {env.spec.id} has {expected[0]}/{expected[1]}"
            )
    return episodes


def reference_scores(dataset: Any, env: EnvInfo | None, dataset_id: str) -> ReferenceScores | None:
    """The dataset's own ref_min_score/ref_max_score first, else the envs/ constants."""
    metadata = dataset.storage.metadata
    low, high = metadata.get("ref_min_score"), metadata.get("ref_max_score")
    if low is not None and high is not None and high != low:
        measured = (metadata.get("provenance") or {}).get("reference")
        how = f", {measured['how']}" if isinstance(measured, dict) and "how" in measured else ""
        return ReferenceScores(float(low), float(high), f"Minari metadata of {dataset_id}{how}")
    if env is not None:
        return ReferenceScores(env.ref_random, env.ref_expert, env.ref_source)
    return None


def load_task_data(task: Task, download: bool) -> TaskData:
    """Open every dataset of the task (two for medium-expert) and check they describe one env."""
    episodes: list[Episode] = []
    env_spec = None
    reference = None
    quiet_mujoco_warnings()
    for dataset_id in task.dataset_ids:
        dataset = open_dataset(dataset_id, download)
        env_instance = dataset.recover_environment(eval_env=True)
        spec = env_instance.spec
        episodes.extend(
            _check_spaces(_read_episodes(dataset, dataset_id), env_instance, dataset_id)
        )
        env_instance.close()
        if env_spec is not None and spec.id != env_spec.id:
            raise DatasetError(
                f"datasets {', '.join(task.dataset_ids)} are for different environments "
                f"({env_spec.id} and {spec.id}); they cannot be combined"
            )
        env_spec = spec
        env = task.env or env_for_gym_id(spec.id)
        reference = reference or reference_scores(dataset, env, dataset_id)
    assert env_spec is not None
    env = task.env or env_for_gym_id(env_spec.id)
    dims = {(ep.observations.shape[1], ep.actions.shape[1]) for ep in episodes}
    if len(dims) > 1:
        raise DatasetError(f"datasets of task {task.name} disagree on state/action sizes: {dims}")
    max_steps = env_spec.max_episode_steps or (env.max_episode_steps if env else 1000)
    return TaskData(
        task=replace(task, env=env),
        episodes=episodes,
        env_id=env_spec.id,
        env_kwargs=json.loads(json.dumps(env_spec.kwargs or {})),
        max_episode_steps=int(max_steps),
        reference=reference,
        eval_targets=env.eval_targets if env else (),
    )


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """Undiscounted sum of the rewards from each step to the episode's end."""
    return np.cumsum(rewards[::-1])[::-1].copy()


class Batch(NamedTuple):
    states: Tensor  # (B, K, S), normalised
    actions: Tensor  # (B, K, A)
    returns_to_go: Tensor  # (B, K), scaled
    timesteps: Tensor  # (B, K)
    mask: Tensor  # (B, K), true for real steps; padding is on the left


class WindowSampler:
    """The whole dataset as flat tensors on one device; sample() gathers random K-step windows."""

    def __init__(
        self,
        episodes: list[Episode],
        state_mean: np.ndarray,
        state_std: np.ndarray,
        context_len: int,
        return_scale: float,
        device: torch.device | str,
        seed: int,
    ) -> None:
        self.device = torch.device(device)
        self.context_len = context_len
        lengths = np.array([len(ep.rewards) for ep in episodes])
        states = (np.concatenate([ep.observations for ep in episodes]) - state_mean) / state_std
        rtg = np.concatenate([returns_to_go(ep.rewards) for ep in episodes]) / return_scale
        timesteps = np.concatenate([np.arange(n) for n in lengths])

        def put(array: np.ndarray, dtype: torch.dtype) -> Tensor:
            return torch.as_tensor(array, dtype=dtype).to(self.device)

        self.states = put(states, torch.float32)
        self.actions = put(np.concatenate([ep.actions for ep in episodes]), torch.float32)
        self.rtg = put(rtg, torch.float32)
        self.timesteps = put(timesteps, torch.long)
        self.episode_ends = put(np.cumsum(lengths), torch.long)
        self.offsets = torch.arange(context_len, device=self.device)
        self.seed = seed
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @property
    def num_steps(self) -> int:
        return self.states.shape[0]

    def share_data(self, other: WindowSampler) -> None:
        """Sample from another sampler's tensors (the runs of a pack sample one dataset with the
        same settings): one copy of the dataset on the device, each run its own generator."""
        if (other.states.shape, other.context_len) != (self.states.shape, self.context_len):
            raise ValueError("share_data: the samplers hold other data or window lengths")
        for name in ("states", "actions", "rtg", "timesteps", "episode_ends", "offsets"):
            setattr(self, name, getattr(other, name))

    def sample(self, batch_size: int) -> Batch:
        start = torch.randint(
            0, self.num_steps, (batch_size,), generator=self.generator, device=self.device
        )
        episode = torch.searchsorted(self.episode_ends, start, right=True)
        valid = torch.clamp(self.episode_ends[episode] - start, max=self.context_len)
        pad = (self.context_len - valid)[:, None]
        mask = self.offsets[None, :] >= pad
        index = torch.where(mask, start[:, None] + self.offsets[None, :] - pad, start[:, None])
        keep = mask.unsqueeze(-1)
        return Batch(
            states=self.states[index] * keep,
            actions=self.actions[index] * keep,
            returns_to_go=self.rtg[index] * mask,
            timesteps=self.timesteps[index] * mask,
            mask=mask,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "device": self.device.type}

    def load_state_dict(self, state: dict[str, Any], step: int) -> bool:
        """Continue from a saved state: exactly where it was saved on this device type (True).
        A CPU generator's state and a CUDA one's have different forms, so a state saved on the
        other type cannot be continued: the generator is then seeded from the run's seed and the
        step (False), and the batches from here on differ from the uninterrupted run's."""
        saved = state["generator"]
        same_kind = saved.numel() == self.generator.get_state().numel()
        if state.get("device", self.device.type) == self.device.type and same_kind:
            self.generator.set_state(saved)
            return True
        self.generator.manual_seed((self.seed * 1_000_003 + step) % 2**63)
        return False
