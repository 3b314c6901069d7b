"""The reference implementations' evaluation loop, kept as the plain baseline that the vectorised
rollout (rollout.py) is checked against (tests/test_evaluation.py) and timed against
(scripts/bench_eval.py): one episode after another, one model call per step with a batch of one.
Not used by training or `primal-dt eval`."""

from __future__ import annotations

from contextlib import closing

import gymnasium as gym
import numpy as np
import torch

from primal_dt.common.device import autocast
from primal_dt.evaluation.rollout import Job, Policy
from primal_dt.method.model import evaluating
from primal_dt.store.snapshots import TaskInfo


@torch.inference_mode()
def sequential_rollout(
    policy: Policy, task: TaskInfo, jobs: list[Job]
) -> tuple[np.ndarray, np.ndarray]:
    """Each job's return and length, one episode after another, one model call per step with a
    batch of one, in the policy's precision."""
    model, device, k = policy.model, policy.device, policy.context_len
    env = task.make_env()
    space = env.action_space
    assert isinstance(space, gym.spaces.Box), "the policy's tanh head acts in a box"
    low, high = space.low, space.high
    returns, lengths = np.zeros(len(jobs)), np.zeros(len(jobs), dtype=np.int64)
    with evaluating(model), closing(env):
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
                with autocast(policy.precision, device):  # as the vectorised rollout acts
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
    return returns, lengths
