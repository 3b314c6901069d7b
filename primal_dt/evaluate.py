"""Roll a Decision Transformer out in its Gymnasium v5 environment and score the returns.

All episodes of one target run at once in a Gymnasium vector environment, with one batched model
call per environment step. Each episode conditions on its own running return-to-go (the target
minus the reward collected so far) and on its last K steps. The policy is deterministic (the tanh
head's output), so a seed fixes every return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from primal_dt.checkpoint import load_checkpoint
from primal_dt.config import config_from_dict
from primal_dt.data import ReferenceScores
from primal_dt.errors import CheckpointError
from primal_dt.model import DecisionTransformer
from primal_dt.tasks import make_env


@dataclass
class EnvSetup:
    """How to build the evaluation environment and score it, as stored in checkpoints."""

    env_id: str
    env_kwargs: dict[str, Any]
    max_episode_steps: int
    eval_targets: tuple[float, ...]
    reference: ReferenceScores | None

    def make_vector(self, num_envs: int) -> gym.vector.VectorEnv:
        def make() -> gym.Env:
            return make_env(self.env_id, self.max_episode_steps, **self.env_kwargs)

        return gym.vector.SyncVectorEnv([make for _ in range(num_envs)])


@dataclass
class Policy:
    """A trained model with the statistics it was trained with."""

    model: DecisionTransformer
    state_mean: torch.Tensor
    state_std: torch.Tensor
    return_scale: float
    device: torch.device

    @property
    def context_len(self) -> int:
        return self.model.config.context_len


@dataclass
class TargetResult:
    target: float
    returns: np.ndarray
    lengths: np.ndarray
    normalized: np.ndarray | None

    def summary(self) -> dict[str, Any]:
        def stat(values: np.ndarray | None, fn: Any) -> float | None:
            return None if values is None else float(fn(values))

        return {
            "target": self.target,
            "return_mean": float(self.returns.mean()),
            "return_std": float(self.returns.std()),
            "normalized_mean": stat(self.normalized, np.mean),
            "normalized_std": stat(self.normalized, np.std),
            "length_mean": float(self.lengths.mean()),
            "episodes": int(len(self.returns)),
        }


@torch.inference_mode()
def rollout(
    policy: Policy, setup: EnvSetup, target: float, episodes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Run `episodes` episodes in parallel, conditioned on `target`; returns (returns, lengths)."""
    model, device, k = policy.model, policy.device, policy.context_len
    was_training = model.training
    model.eval()
    envs = setup.make_vector(episodes)
    try:
        obs, _ = envs.reset(seed=seed)
        horizon = setup.max_episode_steps
        # k - 1 rows of left padding, so the window ending at step t is rows t .. t + k - 1.
        states = torch.zeros(episodes, horizon + k, model.state_dim, device=device)
        actions = torch.zeros(episodes, horizon + k, model.act_dim, device=device)
        rtg = torch.zeros(episodes, horizon + k, device=device)
        positions = torch.arange(k, device=device)
        remaining = torch.full((episodes,), target / policy.return_scale, device=device)
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        active = np.ones(episodes, dtype=bool)
        low, high = envs.single_action_space.low, envs.single_action_space.high
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        for t in range(horizon):
            row = t + k - 1
            observation = torch.as_tensor(obs, dtype=torch.float32, device=device)
            states[:, row] = (observation - policy.state_mean) / policy.state_std
            rtg[:, row] = remaining
            window = slice(t, t + k)
            timesteps = (t - (k - 1) + positions).clamp(min=0).expand(episodes, k)
            mask = (positions >= k - 1 - t).expand(episodes, k)
            with autocast:
                predicted, _ = model(states[:, window], actions[:, window], rtg[:, window],
                                     timesteps, mask)  # fmt: skip
            action = predicted[:, -1].float()
            actions[:, row] = action
            obs, reward, terminated, truncated, _ = envs.step(
                np.clip(action.cpu().numpy(), low, high)
            )
            returns += np.where(active, reward, 0.0)
            lengths += active
            remaining -= (
                torch.as_tensor(reward, dtype=torch.float32, device=device) / policy.return_scale
            )
            active &= ~(terminated | truncated)
            if not active.any():
                break
    finally:
        envs.close()
        model.train(was_training)
    return returns, lengths


def evaluate(
    policy: Policy,
    setup: EnvSetup,
    episodes: int,
    seed: int,
    targets: tuple[float, ...] | list[float] | None = None,
) -> list[TargetResult]:
    """Returns and normalised scores for each target (the task's targets by default)."""
    results = []
    for target in targets or setup.eval_targets:
        returns, lengths = rollout(policy, setup, float(target), episodes, seed)
        normalized = setup.reference.normalize(returns) if setup.reference else None
        results.append(TargetResult(float(target), returns, lengths, normalized))
    return results


def load_policy(path: str, device: torch.device) -> tuple[Policy, EnvSetup, dict[str, Any]]:
    """Policy and environment from a checkpoint file or run directory; also the raw checkpoint."""
    ckpt = load_checkpoint(path, map_location=device)
    try:
        config = config_from_dict(ckpt["config"])
        dims = ckpt["dims"]
        model = DecisionTransformer(
            config.model, dims["state_dim"], dims["act_dim"], dims["max_timestep"]
        ).to(device)
        model.load_state_dict(ckpt["model"])
        task = ckpt["task"]
        reference = task.get("reference")
        setup = EnvSetup(
            env_id=task["env_id"],
            env_kwargs=dict(task["env_kwargs"]),
            max_episode_steps=int(task["max_episode_steps"]),
            eval_targets=tuple(task["eval_targets"]),
            reference=ReferenceScores(**reference) if reference else None,
        )
    except (KeyError, TypeError, RuntimeError, ValueError) as err:
        reason = str(err).strip().splitlines()[0]
        raise CheckpointError(
            f"checkpoint {path} does not match this primal-dt: {reason}"
        ) from None
    check_env_matches(setup, dims["state_dim"], dims["act_dim"], f"checkpoint {path}")
    policy = Policy(
        model=model,
        state_mean=ckpt["state_mean"].to(device),
        state_std=ckpt["state_std"].to(device),
        return_scale=config.train.return_scale,
        device=device,
    )
    return policy, setup, ckpt


def check_env_matches(setup: EnvSetup, state_dim: int, act_dim: int, what: str) -> None:
    """A model for S states and A actions can only act in an environment with those sizes."""
    try:
        env = make_env(setup.env_id, setup.max_episode_steps, **setup.env_kwargs)
    except Exception as err:  # unknown id, bad kwargs, missing MuJoCo...
        raise CheckpointError(
            f"{what}: cannot make its environment {setup.env_id}: {err}"
        ) from None
    found = (env.observation_space.shape, env.action_space.shape)
    env.close()
    if found != ((state_dim,), (act_dim,)):
        raise CheckpointError(
            f"{what} is for states/actions of size {state_dim}/{act_dim}, but its environment "
            f"{setup.env_id} has shapes {found[0]}/{found[1]}"
        )


def format_table(task: str, results: list[TargetResult], reference: ReferenceScores | None) -> str:
    """A plain-text table of return and normalised score per target."""
    lines = [
        f"{'target':>10}  {'return (mean ± std)':>22}  {'normalized (mean ± std)':>24}  episodes"
    ]
    for result in results:
        s = result.summary()
        score = (
            f"{s['normalized_mean']:.1f} ± {s['normalized_std']:.1f}"
            if s["normalized_mean"] is not None and math.isfinite(s["normalized_mean"])
            else "n/a"
        )
        ret = f"{s['return_mean']:.1f} ± {s['return_std']:.1f}"
        lines.append(f"{s['target']:>10.1f}  {ret:>22}  {score:>24}  {s['episodes']:>8}")
    source = (
        f"reference scores: random {reference.random:.2f}, expert {reference.expert:.2f} "
        f"({reference.source})"
        if reference
        else "reference scores: none known for this environment, no normalised score"
    )
    return "\n".join([f"task {task}", *lines, source])
