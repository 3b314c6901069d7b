"""Loading Minari datasets, the task table, and the window sampler."""

from __future__ import annotations

import minari
import numpy as np
import pytest
import torch

from primal_dt.common.errors import DatasetError, TaskError
from primal_dt.data.episodes import Episode, WindowSampler, load_task_data, returns_to_go
from primal_dt.data.tasks import dataset_task, load_envs, resolve_task


def test_every_env_file_describes_a_v5_task() -> None:
    envs = load_envs()
    assert set(envs) == {"halfcheetah", "hopper", "walker2d", "ant", "humanoid", "swimmer"}
    for env in envs.values():
        assert env.gym_id.endswith("-v5")
        # Minari hosts no simple dataset for Swimmer.
        qualities = {"medium", "expert"} | ({"simple"} if env.name != "swimmer" else set())
        assert set(env.datasets) == qualities
        assert all(i == f"mujoco/{env.name}/{q}-v0" for q, i in env.datasets.items())
        assert env.ref_expert > env.ref_random
        assert len(env.eval_targets) == 2
    assert envs["hopper"].eval_targets == (3600.0, 1800.0)


def test_task_names_resolve_to_dataset_ids() -> None:
    task = resolve_task("halfcheetah-medium")
    assert task.dataset_ids == ("mujoco/halfcheetah/medium-v0",)
    combined = resolve_task("walker2d-medium-expert")
    assert combined.dataset_ids == ("mujoco/walker2d/medium-v0", "mujoco/walker2d/expert-v0")
    for bad in ("halfcheetah", "cheetah-medium", "hopper-medium-replay", "hopper-best"):
        with pytest.raises(TaskError, match="unknown task"):
            resolve_task(bad)


def test_loading_drops_the_final_observation_and_keeps_reference_scores(minari_root) -> None:
    data = load_task_data(resolve_task("halfcheetah-expert"), download=False)
    raw = minari.load_dataset("mujoco/halfcheetah/expert-v0")
    for episode, original in zip(data.episodes, raw.iterate_episodes(), strict=True):
        assert len(original.observations) == len(original.rewards) + 1
        np.testing.assert_array_equal(
            episode.observations, original.observations[:-1].astype(np.float32)
        )
        np.testing.assert_array_equal(episode.actions, original.actions)
    assert data.env_id == "HalfCheetah-v5"
    assert (data.state_dim, data.act_dim) == (17, 6)
    assert data.reference.random == -280.0 and data.reference.expert == 11500.0
    assert "Minari metadata" in data.reference.source


def test_reference_scores_fall_back_to_the_env_file(minari_root) -> None:
    data = load_task_data(dataset_task("test/halfcheetah/random-v0"), download=False)
    assert data.task.env is not None and data.task.env.name == "halfcheetah"
    assert data.reference.random == pytest.approx(-280.178953)
    assert "D4RL" in data.reference.source and "approximate" in data.reference.source
    assert data.eval_targets == (12000.0, 6000.0)


def test_medium_expert_combines_both_datasets(minari_root) -> None:
    medium = load_task_data(resolve_task("hopper-medium"), download=False)
    expert = load_task_data(resolve_task("hopper-expert"), download=False)
    both = load_task_data(resolve_task("hopper-medium-expert"), download=False)
    assert len(both.episodes) == len(medium.episodes) + len(expert.episodes)
    steps = [sum(len(ep.rewards) for ep in data.episodes) for data in (medium, expert, both)]
    assert steps[2] == steps[0] + steps[1]


def test_missing_dataset_offline_fails_fast_with_the_place_looked(minari_root) -> None:
    with pytest.raises(DatasetError) as err:
        load_task_data(resolve_task("walker2d-medium"), download=False)
    message = str(err.value)
    assert "mujoco/walker2d/medium-v0" in message
    assert str(minari_root) in message
    assert "--offline" in message


def test_returns_to_go_is_the_undiscounted_future_sum() -> None:
    np.testing.assert_allclose(returns_to_go(np.array([1.0, 2.0, 3.0])), [6.0, 5.0, 3.0])


def _sampler(lengths: list[int], context_len: int) -> tuple[WindowSampler, list[Episode]]:
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            observations=rng.normal(size=(n, 3)).astype(np.float32),
            actions=rng.uniform(-1, 1, size=(n, 2)).astype(np.float32),
            rewards=rng.normal(size=n).astype(np.float32),
        )
        for n in lengths
    ]
    mean, std = np.zeros(3), np.full(3, 2.0)
    sampler = WindowSampler(episodes, mean, std, context_len, 10.0, "cpu", seed=0)
    return sampler, episodes


def test_windows_match_the_episodes_and_are_left_padded() -> None:
    sampler, episodes = _sampler([3, 7, 12], context_len=5)
    batch = sampler.sample(256)
    for b in range(256):
        mask = batch.mask[b].numpy()
        valid = int(mask.sum())
        assert valid >= 1
        assert not mask[: 5 - valid].any() and mask[5 - valid :].all()  # padding on the left
        first_t = int(batch.timesteps[b, 5 - valid])
        for episode in episodes:  # the episode whose states these are
            window = episode.observations[first_t : first_t + valid] / 2.0
            if len(window) == valid and np.allclose(batch.states[b, 5 - valid :].numpy(), window):
                break
        else:
            pytest.fail(f"window {b} is not a slice of any episode")
        assert first_t + valid == len(episode.rewards) or valid == 5  # short only at the end
        rtg = returns_to_go(episode.rewards)[first_t : first_t + valid] / 10.0
        np.testing.assert_allclose(batch.returns_to_go[b, 5 - valid :].numpy(), rtg, rtol=1e-5)
        np.testing.assert_array_equal(
            batch.actions[b, 5 - valid :].numpy(), episode.actions[first_t : first_t + valid]
        )
        np.testing.assert_array_equal(
            batch.timesteps[b, 5 - valid :].numpy(), np.arange(valid) + first_t
        )
        for tensor in (batch.states, batch.actions):
            assert torch.all(tensor[b, : 5 - valid] == 0)


def test_trajectories_are_drawn_in_proportion_to_their_length() -> None:
    sampler, _ = _sampler([10, 30], context_len=1)
    batch = sampler.sample(20000)
    # With K = 1 each window is one step; long episodes' steps start at timestep up to 29.
    from_long = (batch.timesteps[:, 0] >= 10).float().mean().item()
    # P(long episode) = 30/40; P(t >= 10 | long) = 20/30, so P(t >= 10) = 0.5.
    assert from_long == pytest.approx(0.5, abs=0.02)


def test_sampler_is_reproducible_and_resumable() -> None:
    first, _ = _sampler([20, 20], context_len=4)
    second, _ = _sampler([20, 20], context_len=4)
    first.sample(8)
    state = first.state_dict()
    expected = first.sample(8)
    assert second.load_state_dict(state, step=1)  # exactly, on the same device type
    again = second.sample(8)
    for a, b in zip(expected, again, strict=True):
        assert torch.equal(a, b)
    # A state from the other device type (a CUDA generator's is 16 bytes) cannot be continued:
    # the generator is seeded from the seed and the step, the same for the same step.
    other = {"generator": torch.zeros(16, dtype=torch.uint8), "device": "cuda"}
    assert not first.load_state_dict(other, step=1) and not second.load_state_dict(other, step=1)
    for a, b in zip(first.sample(8), second.sample(8), strict=True):
        assert torch.equal(a, b)
