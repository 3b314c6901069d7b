"""Roll a Decision Transformer out in its Gymnasium v5 environment and score the returns.

All episodes of one target run at once in a Gymnasium vector environment, with one batched model
call per environment step. Each episode conditions on its own running return-to-go (the target
minus the reward collected so far) and on its last K steps. The policy is deterministic (the tanh
head's output), so a seed fixes every return.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from primal_dt.checkpoint import load_checkpoint
from primal_dt.config import config_from_dict
from primal_dt.data import ReferenceScores
from primal_dt.errors import CheckpointError, first_line
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

    def make_vector(self, num_envs: int, workers: int = 0) -> gym.vector.VectorEnv:
        """num_envs copies of the environment, with resets left to the caller (rollout resets
        each finished slot with the seed of its next episode).

        workers <= 1 steps them one after another in this process (SyncVectorEnv); workers > 1
        puts each in its own process (AsyncVectorEnv) with at most `workers` stepping at once.
        """
        make = partial(make_env, self.env_id, self.max_episode_steps, **self.env_kwargs)
        if workers > 1:
            return gym.vector.AsyncVectorEnv(
                [make] * num_envs,
                autoreset_mode=gym.vector.AutoresetMode.DISABLED,
                max_concurrency=workers,
            )
        return gym.vector.SyncVectorEnv(
            [make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED
        )


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


@dataclass
class Job:
    """One episode to run: the target it is conditioned on and the seed of its reset."""

    target_index: int
    target: float
    seed: int


@torch.inference_mode()
def rollout(
    policy: Policy,
    setup: EnvSetup,
    jobs: list[Job],
    num_envs: int | None = None,
    workers: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Run every job, num_envs at a time (all at once by default); returns (returns, lengths).

    Each environment slot keeps its own K-step window, return-to-go and timestep; when its
    episode ends it is reset with the seed of the next job, so an episode's result depends only
    on its seed and target, not on how many run beside it. Every step is one batched model call
    for all slots (model.act: the last action of each window, without computing the others).
    Slots left without a job keep stepping (reset when they end) but are not counted.
    """
    model, device, k = policy.model, policy.device, policy.context_len
    slots = min(len(jobs), num_envs or len(jobs))
    was_training = model.training
    model.eval()
    envs = setup.make_vector(slots, workers)
    try:
        obs, _ = envs.reset(seed=[job.seed for job in jobs[:slots]])
        job_of = np.arange(slots)  # the job each slot runs; -1 once there are none left
        next_job = slots
        t = torch.zeros(slots, dtype=torch.long, device=device)
        states = torch.zeros(slots, k, model.state_dim, device=device)
        actions = torch.zeros(slots, k, model.act_dim, device=device)
        rtg = torch.zeros(slots, k, device=device)
        scale = policy.return_scale
        remaining = torch.tensor([job.target / scale for job in jobs[:slots]], device=device)
        returns = np.zeros(len(jobs))
        lengths = np.zeros(len(jobs), dtype=np.int64)
        positions = torch.arange(k, device=device)
        low, high = envs.single_action_space.low, envs.single_action_space.high
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        while (job_of >= 0).any():
            # Slide every window one step left and put the new step in its last row.
            states, actions, rtg = states.roll(-1, 1), actions.roll(-1, 1), rtg.roll(-1, 1)
            observation = torch.as_tensor(obs, dtype=torch.float32, device=device)
            states[:, -1] = (observation - policy.state_mean) / policy.state_std
            actions[:, -1] = 0.0
            rtg[:, -1] = remaining
            timesteps = (t[:, None] - (k - 1) + positions).clamp(min=0)
            mask = positions[None, :] >= (k - 1 - t)[:, None]
            with autocast:
                action = model.act(states, actions, rtg, timesteps, mask).float()
            actions[:, -1] = action
            obs, reward, terminated, truncated, _ = envs.step(
                np.clip(action.cpu().numpy(), low, high)
            )
            running = job_of >= 0
            returns[job_of[running]] += reward[running]
            lengths[job_of[running]] += 1
            remaining -= torch.as_tensor(reward, dtype=torch.float32, device=device) / scale
            t += 1
            done = terminated | truncated
            if not done.any():
                continue
            seeds: list[int | None] = [None] * slots
            for slot in np.flatnonzero(done):
                job_of[slot] = next_job if next_job < len(jobs) else -1
                if job_of[slot] >= 0:
                    seeds[slot] = jobs[next_job].seed
                    remaining[slot] = jobs[next_job].target / scale
                    next_job += 1
            obs, _ = envs.reset(seed=seeds, options={"reset_mask": done})
            reset = torch.as_tensor(done, device=device)
            states[reset], actions[reset], rtg[reset], t[reset] = 0.0, 0.0, 0.0, 0
    finally:
        envs.close()
        model.train(was_training)
    return returns, lengths


@torch.inference_mode()
def sequential_rollout(
    policy: Policy, setup: EnvSetup, jobs: list[Job]
) -> tuple[np.ndarray, np.ndarray]:
    """The reference implementations' evaluation: one episode after another, one model call per
    step with a batch of one. Kept as the baseline the vectorised rollout is checked and timed
    against."""
    model, device, k = policy.model, policy.device, policy.context_len
    was_training = model.training
    model.eval()
    env = make_env(setup.env_id, setup.max_episode_steps, **setup.env_kwargs)
    low, high = env.action_space.low, env.action_space.high
    returns, lengths = np.zeros(len(jobs)), np.zeros(len(jobs), dtype=np.int64)
    try:
        for index, job in enumerate(jobs):
            obs, _ = env.reset(seed=job.seed)
            states, actions, rtg = [], [], []
            remaining = torch.tensor(job.target / policy.return_scale, device=device)
            done = False
            while not done:
                state = torch.as_tensor(obs, dtype=torch.float32, device=device)
                states.append((state - policy.state_mean) / policy.state_std)
                actions.append(torch.zeros(model.act_dim, device=device))
                rtg.append(remaining.clone())
                n = min(len(states), k)
                pad = k - n
                window_states = torch.zeros(1, k, model.state_dim, device=device)
                window_actions = torch.zeros(1, k, model.act_dim, device=device)
                window_rtg = torch.zeros(1, k, device=device)
                window_states[0, pad:] = torch.stack(states[-n:])
                window_actions[0, pad:] = torch.stack(actions[-n:])
                window_rtg[0, pad:] = torch.stack(rtg[-n:])
                first = len(states) - n
                timesteps = torch.zeros(1, k, dtype=torch.long, device=device)
                timesteps[0, pad:] = torch.arange(first, first + n, device=device)
                mask = (torch.arange(k, device=device) >= pad)[None]
                predicted, _ = model(window_states, window_actions, window_rtg, timesteps, mask)
                actions[-1] = predicted[0, -1].float()
                obs, reward, terminated, truncated, _ = env.step(
                    np.clip(actions[-1].cpu().numpy(), low, high)
                )
                returns[index] += reward
                lengths[index] += 1
                remaining -= (
                    torch.tensor(reward, dtype=torch.float32, device=device) / policy.return_scale
                )
                done = terminated or truncated
    finally:
        env.close()
        model.train(was_training)
    return returns, lengths


def make_jobs(targets: tuple[float, ...] | list[float], episodes: int, seed: int) -> list[Job]:
    """Episode i of every target resets with seed + i: the targets meet the same start states."""
    return [
        Job(index, float(target), seed + episode)
        for index, target in enumerate(targets)
        for episode in range(episodes)
    ]


def evaluate(
    policy: Policy,
    setup: EnvSetup,
    episodes: int,
    seed: int,
    targets: tuple[float, ...] | list[float] | None = None,
    workers: int = 0,
    num_envs: int | None = None,
) -> list[TargetResult]:
    """Returns and normalised scores for each target (the task's targets by default).

    The episodes of all targets run together, so one model call serves every target.
    """
    targets = tuple(targets or setup.eval_targets)
    jobs = make_jobs(targets, episodes, seed)
    returns, lengths = rollout(policy, setup, jobs, num_envs, workers)
    results = []
    for index, target in enumerate(targets):
        ours = np.array([job.target_index == index for job in jobs])
        normalized = setup.reference.normalize(returns[ours]) if setup.reference else None
        results.append(TargetResult(float(target), returns[ours], lengths[ours], normalized))
    return results


def model_from_checkpoint(ckpt: dict[str, Any], device: torch.device | str) -> DecisionTransformer:
    """The checkpoint's model with its weights, on device. A checkpoint that does not fit raises
    KeyError, TypeError, RuntimeError or ValueError (load_policy turns them into one line)."""
    config = config_from_dict(ckpt["config"])
    dims = ckpt["dims"]
    model = DecisionTransformer(
        config.model, dims["state_dim"], dims["act_dim"], dims["max_timestep"]
    ).to(device)
    model.load_state_dict(ckpt["model"])
    return model


def load_policy(path: str, device: torch.device) -> tuple[Policy, EnvSetup, dict[str, Any]]:
    """Policy and environment from a checkpoint file or run directory; also the raw checkpoint."""
    ckpt = load_checkpoint(path, map_location=device)
    try:
        model = model_from_checkpoint(ckpt, device)
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
        raise CheckpointError(
            f"checkpoint {path} does not match this primal-dt: {first_line(err)}"
        ) from None
    check_env_matches(setup, model.state_dim, model.act_dim, f"checkpoint {path}")
    policy = Policy(
        model=model,
        state_mean=ckpt["state_mean"].to(device),
        state_std=ckpt["state_std"].to(device),
        return_scale=float(ckpt["config"]["train"]["return_scale"]),
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


def evaluate_checkpoint(
    path: str | Path,
    device: torch.device,
    episodes: int | None = None,
    seed: int | None = None,
    targets: list[float] | tuple[float, ...] | None = None,
    workers: int = 0,
) -> dict[str, Any]:
    """Evaluate one checkpoint file; the record that eval.jsonl and `primal-dt eval` report.

    Unless given, episodes come from the snapshot's request (see eval_service) or the run's
    eval.episodes, and the seed is the run's train.seed, so re-evaluating a checkpoint in a fresh
    process repeats the numbers logged during training.
    """
    start = time.perf_counter()
    policy, setup, ckpt = load_policy(str(path), device)
    request = ckpt.get("eval", {})
    episodes = episodes or request.get("episodes") or ckpt["config"]["eval"]["episodes"]
    seed = ckpt["config"]["train"]["seed"] if seed is None else seed
    results = evaluate(policy, setup, episodes, seed, targets, workers)
    summaries = [r.summary() for r in results]
    best = max(summaries, key=lambda s: s["return_mean"])
    ref = setup.reference
    return {
        "step": int(ckpt["step"]),
        "checkpoint": str(path),
        "task": ckpt["task"]["name"],
        "dataset_ids": list(ckpt["task"].get("dataset_ids", [])),
        "env_id": setup.env_id,
        "episodes": int(episodes),
        "seed": int(seed),
        "final": bool(request.get("final", False)),
        "reference": None
        if ref is None
        else {"random": ref.random, "expert": ref.expert, "source": ref.source},
        "results": summaries,
        # The best target's normalised score (its return where there are no reference scores).
        "score": best["normalized_mean"]
        if best["normalized_mean"] is not None
        else best["return_mean"],
        "seconds": round(time.perf_counter() - start, 2),
    }


def _mean_std(mean: float | None, std: float | None) -> str:
    if mean is None or std is None or not math.isfinite(mean):
        return "n/a"
    return f"{mean:.1f} ± {std:.1f}"


def format_table(records: list[dict[str, Any]]) -> str:
    """One table for evaluation records of any runs: a row per checkpoint and target, with the
    reference scores each normalised score was computed from as numbered notes below it."""
    header = ["checkpoint", "task", "step", "target", "return", "normalized", "episodes", "ref"]
    rows, sources = [], []
    for record in records:
        ref = record["reference"]
        note = "-"
        if ref is not None:
            text = f"random {ref['random']:.2f}, expert {ref['expert']:.2f}: {ref['source']}"
            if text not in sources:
                sources.append(text)
            note = f"[{sources.index(text) + 1}]"
        if "error" in record:
            rows.append([record["checkpoint"], record.get("task", "?"), str(record["step"]),
                         "-", "evaluation failed: " + record["error"], "", "", ""])  # fmt: skip
            continue
        for s in record["results"]:
            rows.append([
                record["checkpoint"], record["task"], str(record["step"]), f"{s['target']:.1f}",
                _mean_std(s["return_mean"], s["return_std"]),
                _mean_std(s["normalized_mean"], s["normalized_std"]), str(s["episodes"]), note,
            ])  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {"step", "target", "return", "normalized", "episodes"}
    lines = [
        "  ".join(
            cell.rjust(width) if name in right else cell.ljust(width)
            for name, cell, width in zip(header, row, widths, strict=True)
        ).rstrip()
        for row in [header, *rows]
    ]
    lines += [f"[{i}] reference scores: {text}" for i, text in enumerate(sources, 1)]
    if any(record.get("reference", 0) is None for record in records):
        lines.append("-: no reference scores known for this environment, no normalised score")
    trained_on = {
        (r["task"], " + ".join(r["dataset_ids"])) for r in records if r.get("dataset_ids")
    }
    lines += [f"{task} was trained on {ids}" for task, ids in sorted(trained_on)]
    return "\n".join(lines)
