"""Roll a Decision Transformer out in its Gymnasium v5 environment and score the returns.

All episodes of all targets run at once in a Gymnasium vector environment, with one batched
model call per environment step. Each episode conditions on its own running return-to-go (the target
minus the reward collected so far) and on its last K steps. The policy is deterministic (the tanh
head's output), so a seed fixes every return.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from primal_dt.common.config import check_device_name
from primal_dt.common.device import Precision, autocast, recorded_precision
from primal_dt.common.errors import CheckpointError, ConfigError
from primal_dt.evaluation.video import VideoUnavailable, headless_rendering, mp4_writer, video_name
from primal_dt.evaluation.windows import Windows
from primal_dt.method.model import DecisionTransformer, evaluating
from primal_dt.store.results import EvalResult, TargetSummary, target_score
from primal_dt.store.snapshots import Snapshot, TaskInfo

# What a fork server imports once for the workers it forks: each worker still runs the main
# script's imports (multiprocessing re-imports __main__ in every child), which then find these
# loaded instead of importing torch again.
WORKER_PRELOAD = ["torch", "gymnasium.envs.mujoco", "primal_dt.evaluation.rollout"]


def make_vector(
    task: TaskInfo, num_envs: int, workers: int = 0, render: bool = False
) -> gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv:
    """num_envs copies of the task's environment, with resets left to the caller (rollout resets
    each finished slot with the seed of its next episode); with render, drawing RGB frames.

    workers <= 1 steps them one after another in this process (SyncVectorEnv); workers > 1 puts
    each in its own process (AsyncVectorEnv) with at most `workers` stepping at once.
    """
    # The models' "track" camera follows the body; Gymnasium's default free camera stays where
    # the episode started and loses the robot once it moves (a model without it gets the latter).
    drawn = {"render_mode": "rgb_array", "camera_name": "track"} if render else {}
    make = partial(task.make_env, **drawn)
    if workers > 1:
        # A process forked from one that holds CUDA inherits a CUDA context it cannot use, so
        # where CUDA is live the workers are forked from a fork server, a fresh process without
        # CUDA that has imported WORKER_PRELOAD once. Spawning each instead imported torch once
        # per slot: on an H200, 100 slots had not started within a minute. Elsewhere they fork
        # directly from this process.
        context = None
        if torch.cuda.is_initialized():
            multiprocessing.set_forkserver_preload(WORKER_PRELOAD)  # before the server starts
            context = "forkserver"
        return gym.vector.AsyncVectorEnv(
            [make] * num_envs,
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,
            max_concurrency=workers,
            context=context,
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
    precision: Precision = "fp32"  # the run's recorded train.precision: it acts as it trained

    @property
    def context_len(self) -> int:
        return self.model.config.context_len

    @property
    def runs(self) -> int:
        """The models acting at once: 1, or a pack's (packed.PackedPolicy)."""
        return 1

    def act(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        rtg: torch.Tensor,
        timesteps: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The action (B, A) of each window's last step (model.act)."""
        return self.model.act(states, actions, rtg, timesteps, mask)


@dataclass
class TargetResult:
    target: float
    returns: np.ndarray
    lengths: np.ndarray
    normalized: np.ndarray | None

    def summary(self) -> TargetSummary:
        def stat(values: np.ndarray | None, fn: Any) -> float | None:
            return None if values is None else float(fn(values))

        return TargetSummary(
            target=self.target,
            return_mean=float(self.returns.mean()),
            return_std=float(self.returns.std()),
            normalized_mean=stat(self.normalized, np.mean),
            normalized_std=stat(self.normalized, np.std),
            length_mean=float(self.lengths.mean()),
            episodes=int(len(self.returns)),
        )


@dataclass
class Job:
    """One episode to run: the target it is conditioned on and the seed of its reset."""

    target_index: int
    target: float
    seed: int


@torch.inference_mode()
def rollout(
    policy: Policy,
    task: TaskInfo,
    jobs: list[Job],
    num_envs: int | None = None,
    workers: int = 0,
    on_frame: Callable[[np.ndarray], object] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run every job, num_envs at a time (all at once by default); returns (returns, lengths).
    With `on_frame` (one job only), the episode is rendered and each frame handed to it: the
    start state's and one after each step (inside video.headless_rendering where there is no
    display). Rendering reads the simulation and never changes it.

    Each environment slot keeps its own K-step window, return-to-go and timestep; when its
    episode ends it is reset with the seed of the next job, so an episode's result depends only
    on its seed and target, not on how many run beside it. Every step is one batched model call
    for all slots (model.act: the last action of each window, without computing the others).
    Slots left without a job keep stepping (reset when they end) but are not counted.

    A pack's policy (policy.runs > 1) acts for every slot at once, run r's model in the r-th of
    `runs` equal blocks of slots: its jobs come run by run, and all start at once.
    """
    model, device, k = policy.model, policy.device, policy.context_len
    slots = min(len(jobs), num_envs or len(jobs))
    if on_frame is not None and len(jobs) != 1:
        raise ValueError("rendering records one episode at a time")
    if policy.runs > 1 and (slots != len(jobs) or len(jobs) % policy.runs):
        raise ValueError("a pack's jobs come run by run, as many each, and all start at once")
    envs = make_vector(task, slots, workers, render=on_frame is not None)
    with evaluating(model), closing(envs):
        obs, _ = envs.reset(seed=[job.seed for job in jobs[:slots]])
        if on_frame is not None:
            on_frame(first_frame(envs))
        job_of = np.arange(slots)  # the job each slot runs; -1 once there are none left
        next_job = slots
        windows = Windows.empty(slots, k, model.state_dim, model.act_dim, device)
        scale = policy.return_scale
        remaining = torch.tensor([job.target / scale for job in jobs[:slots]], device=device)
        returns = np.zeros(len(jobs))
        lengths = np.zeros(len(jobs), dtype=np.int64)
        space = envs.single_action_space
        assert isinstance(space, gym.spaces.Box), "the policy's tanh head acts in a box"
        low, high = space.low, space.high
        while (job_of >= 0).any():
            action = act(policy, windows, obs, remaining)
            obs, reward, terminated, truncated, _ = envs.step(
                np.clip(action.cpu().numpy(), low, high)
            )
            if on_frame is not None:
                on_frame(first_frame(envs))
            running = job_of >= 0
            returns[job_of[running]] += reward[running]
            lengths[job_of[running]] += 1
            remaining -= torch.as_tensor(reward, dtype=torch.float32, device=device) / scale
            windows.t += 1
            done = terminated | truncated
            if not done.any():
                continue
            seeds, next_job = next_jobs(done, job_of, next_job, jobs, remaining, scale)
            obs, _ = envs.reset(seed=seeds, options={"reset_mask": done})
            windows.clear(torch.as_tensor(done, device=device))
    return returns, lengths


def act(policy: Policy, windows: Windows, obs: np.ndarray, remaining: torch.Tensor) -> torch.Tensor:
    """Every slot's action: this observation, normalised, and the return still to go pushed into
    its window, then one batched model call; the action is written into the window's last step."""
    observation = torch.as_tensor(obs, dtype=torch.float32, device=policy.device)
    state = (observation - policy.state_mean) / policy.state_std
    timesteps, mask = windows.push(state, remaining)
    with autocast(policy.precision, policy.device):
        action = policy.act(windows.states, windows.actions, windows.rtg, timesteps, mask).float()
    windows.actions[:, -1] = action
    return action


def next_jobs(
    done: np.ndarray,
    job_of: np.ndarray,
    next_job: int,
    jobs: list[Job],
    remaining: torch.Tensor,
    scale: float,
) -> tuple[list[int | None], int]:
    """Each slot whose episode ended takes the next job in order (job_of, and its target as the
    return to go in remaining, both set in place), or none (-1) when all have started; returns the
    seeds to reset the slots with (None: not reset, or no job) and the next job not yet started."""
    seeds: list[int | None] = [None] * len(job_of)
    for slot in np.flatnonzero(done):
        job_of[slot] = next_job if next_job < len(jobs) else -1
        if job_of[slot] >= 0:
            seeds[slot] = jobs[next_job].seed
            remaining[slot] = jobs[next_job].target / scale
            next_job += 1
    return seeds, next_job


def first_frame(envs: gym.vector.VectorEnv) -> np.ndarray:
    """The first slot's frame of a vector environment made with render (rgb_array mode)."""
    frames = envs.render()
    assert frames is not None, "rendering needs an environment made with render=True"
    return cast(np.ndarray, frames[0])  # gymnasium types a frame as any render mode's


def make_jobs(targets: tuple[float, ...] | list[float], episodes: int, seed: int) -> list[Job]:
    """Episode i of every target resets with seed + i: the targets meet the same start states."""
    return [
        Job(index, float(target), seed + episode)
        for index, target in enumerate(targets)
        for episode in range(episodes)
    ]


def score_targets(
    policy: Policy,
    task: TaskInfo,
    episodes: int,
    seed: int,
    targets: tuple[float, ...] | list[float] | None = None,
    workers: int = 0,
    num_envs: int | None = None,
) -> list[TargetResult]:
    """Returns and normalised scores for each target (the task's targets by default).

    The episodes of all targets run together, so one model call serves every target.
    """
    targets = tuple(targets or task.eval_targets)
    jobs = make_jobs(targets, episodes, seed)
    returns, lengths = rollout(policy, task, jobs, num_envs, workers)
    return target_results(task, targets, jobs, returns, lengths)


def target_results(
    task: TaskInfo,
    targets: tuple[float, ...],
    jobs: list[Job],
    returns: np.ndarray,
    lengths: np.ndarray,
) -> list[TargetResult]:
    """The jobs' returns and lengths, target by target, with their normalised scores."""
    results = []
    for index, target in enumerate(targets):
        ours = np.array([job.target_index == index for job in jobs])
        normalized = task.reference.normalize(returns[ours]) if task.reference else None
        results.append(TargetResult(float(target), returns[ours], lengths[ours], normalized))
    return results


def load_policy(snapshot: Snapshot, device: torch.device, what: str) -> Policy:
    """The snapshot's policy on device, once its environment is known to fit the model."""
    check_env_matches(snapshot.task, snapshot.state_dim, snapshot.act_dim, what)
    return Policy(
        model=snapshot.build_model(device),
        state_mean=snapshot.state_mean.to(device),
        state_std=snapshot.state_std.to(device),
        return_scale=snapshot.config.train.return_scale,
        device=device,
        precision=recorded_precision(snapshot.config.train.precision, device),
    )


def check_env_matches(task: TaskInfo, state_dim: int, act_dim: int, what: str) -> None:
    """A model for S states and A actions can only act in an environment with those sizes."""
    try:
        env = task.make_env()
    except Exception as err:  # unknown id, bad kwargs, missing MuJoCo...
        raise CheckpointError(f"{what}: cannot make its environment {task.env_id}: {err}") from None
    found = (env.observation_space.shape, env.action_space.shape)
    env.close()
    if found != ((state_dim,), (act_dim,)):
        raise CheckpointError(
            f"{what} is for states/actions of size {state_dim}/{act_dim}, but its environment "
            f"{task.env_id} has shapes {found[0]}/{found[1]}"
        )


@dataclass
class EvalOptions:
    """What a command asks of an evaluation; None (or 0) leaves it to plan_evaluation's defaults
    from the run, so re-evaluating a checkpoint repeats the numbers logged in training (those of
    a run evaluated in its pack to the rounding of batched products: packed.py)."""

    device: str = "auto"
    workers: int = 0
    episodes: int | None = None
    seed: int | None = None
    targets: list[float] | None = None
    videos: int = 0  # episodes per target also rendered to MP4 (video.py)

    def validate(self) -> EvalOptions:
        if self.episodes is not None and self.episodes <= 0:
            raise ConfigError(f"--episodes must be > 0, got {self.episodes}")
        if self.workers < 0:
            raise ConfigError(f"--workers must be >= 0, got {self.workers}")
        if self.videos < 0:
            raise ConfigError(f"--video must be >= 0 episodes, got {self.videos}")
        if self.seed is not None and not 0 <= self.seed < 2**32:  # gymnasium's reset seeds
            raise ConfigError(f"--seed must be in 0..{2**32 - 1}, got {self.seed}")
        if any(not math.isfinite(target) for target in self.targets or ()):
            raise ConfigError(f"--targets must be finite returns, got {self.targets}")
        check_device_name(self.device, "--device")
        return self


@dataclass(frozen=True)
class EvalPlan:
    """What one evaluation of one snapshot does, resolved (plan_evaluation)."""

    episodes: int  # per target
    seed: int  # episode i of each target resets with seed + i
    targets: tuple[float, ...]
    final: bool
    videos: int  # episodes per target also rendered to MP4
    workers: int


def plan_evaluation(snapshot: Snapshot, options: EvalOptions) -> EvalPlan:
    """The one place that decides what an evaluation does: the command's options where given,
    else the snapshot's queued request, else the run's config. Episodes: the request's, else
    eval.final_episodes for a checkpoint of the run's last step (what its final evaluation used),
    else eval.episodes; seed: the run's train.seed; targets: eval.targets, else the task's;
    videos: eval.video_episodes at a final evaluation."""
    config, request = snapshot.config, snapshot.request
    final = request.final if request is not None else False
    if request is not None:
        episodes = request.episodes
    elif snapshot.step >= config.train.steps and config.eval.final_episodes:
        episodes = config.eval.final_episodes
    else:
        episodes = config.eval.episodes
    return EvalPlan(
        episodes=options.episodes or episodes,
        seed=config.train.seed if options.seed is None else options.seed,
        targets=tuple(options.targets or config.eval.targets or snapshot.task.eval_targets),
        final=final,
        videos=options.videos or (config.eval.video_episodes if final else 0),
        workers=options.workers,
    )


def evaluation_record(
    snapshot: Snapshot, policy: Policy, plan: EvalPlan, checkpoint: str
) -> EvalResult:
    """Evaluate a loaded snapshot's policy as planned; the result eval.jsonl and `primal-dt eval`
    report, in which the checkpoint is called `checkpoint`."""
    start = time.perf_counter()
    task = snapshot.task
    results = score_targets(policy, task, plan.episodes, plan.seed, plan.targets, plan.workers)
    return result_record(snapshot, policy, plan, checkpoint, results, time.perf_counter() - start)


def result_record(
    snapshot: Snapshot,
    policy: Policy,
    plan: EvalPlan,
    checkpoint: str,
    results: list[TargetResult],
    seconds: float,
    pack: int = 1,
) -> EvalResult:
    """The record of an evaluation that gave results in seconds (with `pack` runs at once)."""
    task = snapshot.task
    summaries = [r.summary() for r in results]
    record = EvalResult(
        step=snapshot.step,
        checkpoint=checkpoint,
        task=task.name,
        dataset_ids=list(task.dataset_ids),
        env_id=task.env_id,
        episodes=plan.episodes,
        seed=plan.seed,
        final=plan.final,
        reference=task.reference,
        results=summaries,
        seconds=round(seconds, 2),
        pack=pack,
        finished_at=round(time.time(), 3),
        dataset_best_return=task.dataset_best_return,
        device=str(policy.device),
        precision=policy.precision,
    )
    record.score = target_score(record)
    return record


def record_videos(snapshot: Snapshot, policy: Policy, plan: EvalPlan, folder: Path) -> list[Path]:
    """plan.videos episodes per target rendered to MP4 files in folder, named by step, target,
    seed and return; the same episodes (seeds) as the evaluation's first ones."""
    task = snapshot.task
    env = task.make_env()
    fps = env.metadata["render_fps"]  # real time: one frame per environment step
    env.close()
    paths, partial_path = [], folder / f".recording_step_{snapshot.step}.mp4"
    for job in make_jobs(plan.targets, plan.videos, plan.seed):
        with headless_rendering(), mp4_writer(partial_path, fps) as writer:
            returns, _ = rollout(policy, task, [job], on_frame=writer.append_data)
        path = folder / video_name(snapshot.step, job.target, job.seed, float(returns[0]))
        partial_path.replace(path)
        paths.append(path)
    return paths


def add_videos(
    record: EvalResult, snapshot: Snapshot, policy: Policy, plan: EvalPlan, folder: Path
) -> None:
    """Record the videos into the evaluation's record, or why they could not be made: a video
    never fails the evaluation it illustrates."""
    try:
        record.videos = [str(p) for p in record_videos(snapshot, policy, plan, folder)]
    except VideoUnavailable as err:
        record.video_error = str(err)
