"""A dataset carried as its actions (primal_dt/data/carried.py) and made again: the same bits, or a
clear error and nothing written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import minari
import numpy as np
import pytest
from conftest import policy_file

from primal_dt.cli import main
from primal_dt.common.errors import DatasetError
from primal_dt.data.carried import Carrier, carry, chains, digest, read_carrier, remake
from primal_dt.data.recording import record_episodes, sb3_policy, write_dataset
from primal_dt.data.replay import EpisodeRecorder
from primal_dt.data.sources import minari_root_at
from primal_dt.data.tasks import make_env

HOPPER = "Hopper-v5"


def episodes_of(root: Path, dataset_id: str) -> list:
    return list(minari.MinariDataset(root / dataset_id / "data").iterate_episodes())


def a_replay_buffer(env_id: str, steps: int, seed: int) -> list:
    """Episodes as the medium-replay recipe records them: its EpisodeRecorder under SB3's
    DummyVecEnv, seeded once (the vector environment's later resets are unseeded, each continuing
    the random stream), random actions, the last episode cut where stepping stops."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    recorder = EpisodeRecorder(make_env(env_id, 60))
    vec = DummyVecEnv([lambda: recorder])
    vec.seed(seed)
    vec.reset()
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        vec.step(rng.uniform(-1, 1, (1, *recorder.action_space.shape)).astype(np.float32))
    recorder.finish()
    vec.close()
    return recorder.episodes


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Minari root with a policy recording (every episode seeded, the last cut by a step budget)
    and a replay-buffer-like one (one seeded episode, then unseeded ones)."""
    root = tmp_path_factory.mktemp("carried-here")
    with minari_root_at(root):
        policy = sb3_policy(policy_file("medium", HOPPER), seed=0)
        write_dataset(
            "primal-dt/hopper/medium-v0",
            HOPPER,
            record_episodes(HOPPER, policy, steps=700, seed=3),
            ref_min_score=-20.0,
            ref_max_score=3000.0,
            algorithm_name="SAC",
            provenance={"recipe": "policy", "seed": 3},
        )
        write_dataset("test/hopper/chain-v0", HOPPER, a_replay_buffer(HOPPER, 150, 7))
    return root


@pytest.mark.parametrize("dataset_id", ["primal-dt/hopper/medium-v0", "test/hopper/chain-v0"])
def test_a_carried_dataset_is_made_again_bit_for_bit(here, tmp_path, dataset_id) -> None:
    with minari_root_at(here):
        carrier = carry(dataset_id)
    carrier.write(tmp_path / "carried.npz")
    elsewhere = tmp_path / "elsewhere"
    assert remake(tmp_path / "carried.npz", workers=2, root=elsewhere) == dataset_id
    made, recorded = episodes_of(elsewhere, dataset_id), episodes_of(here, dataset_id)
    assert len(made) == len(recorded) and digest(made) == digest(recorded) == carrier.about.digest
    for a, b in zip(made, recorded, strict=True):
        for name in ("observations", "actions", "rewards", "terminations", "truncations"):
            made_array, recorded_array = getattr(a, name), getattr(b, name)
            assert made_array.dtype == recorded_array.dtype, name
            assert np.array_equal(made_array, recorded_array), name
    held = minari.MinariDataset(elsewhere / dataset_id / "data").storage.metadata
    kept = minari.MinariDataset(here / dataset_id / "data").storage.metadata
    for key in ("ref_min_score", "ref_max_score", "algorithm_name", "description", "provenance"):
        assert held.get(key) == kept.get(key), key
    # Again: the same dataset already there is kept, and no error.
    assert remake(tmp_path / "carried.npz", root=elsewhere) == dataset_id


def test_chains_start_at_each_seeded_episode() -> None:
    seeds = np.array([4, -1, -1, 9, 10, -1])
    assert chains(seeds) == [range(0, 3), range(3, 4), range(4, 6)]


def test_a_carrier_that_steps_otherwise_writes_nothing(here, tmp_path) -> None:
    with minari_root_at(here):
        carrier = carry("primal-dt/hopper/medium-v0")
    actions = carrier.actions.copy()
    actions[5] = -actions[5]  # what another simulator build would do: other steps than recorded
    Carrier(carrier.about, actions, carrier.lengths, carrier.seeds, carrier.truncated).write(
        tmp_path / "other.npz"
    )
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(DatasetError, match="otherwise than where it was recorded.*nothing was"):
        remake(tmp_path / "other.npz", root=elsewhere)
    assert not (elsewhere / "primal-dt").exists()
    # A dataset of that id already there, but another one, is never replaced.
    with minari_root_at(here):
        chain = carry("test/hopper/chain-v0")
    chain.write(tmp_path / "chain.npz")
    assert remake(tmp_path / "chain.npz", root=elsewhere) == "test/hopper/chain-v0"
    about = dataclasses.replace(carrier.about, dataset_id="test/hopper/chain-v0")
    Carrier(about, carrier.actions, carrier.lengths, carrier.seeds, carrier.truncated).write(
        tmp_path / "same-name.npz"
    )
    with pytest.raises(DatasetError, match="holds another dataset than"):
        remake(tmp_path / "same-name.npz", root=elsewhere)
    assert digest(episodes_of(elsewhere, "test/hopper/chain-v0")) == chain.about.digest


def test_what_cannot_be_carried_or_read_says_so_in_one_line(here, tmp_path, capsys) -> None:
    with minari_root_at(here):
        episodes = episodes_of(here, "primal-dt/hopper/medium-v0")
        from minari.data_collector.episode_buffer import EpisodeBuffer

        copies = [  # as medium-expert copies its parts' episodes: no seeds
            EpisodeBuffer(
                id=e.id,
                observations=e.observations,
                actions=e.actions,
                rewards=e.rewards,
                terminations=e.terminations,
                truncations=e.truncations,
            )
            for e in episodes
        ]
        write_dataset("test/hopper/copies-v0", HOPPER, copies)
        with pytest.raises(DatasetError, match="without a seed.*medium and expert parts"):
            carry("test/hopper/copies-v0")
    (tmp_path / "bad.npz").write_bytes(b"not a carrier")
    with pytest.raises(DatasetError, match="is not a dataset carrier"):
        read_carrier(tmp_path / "bad.npz")
    with minari_root_at(here):
        carrier = carry("primal-dt/hopper/medium-v0")
    carrier.write(tmp_path / "whole.npz")
    whole = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])  # a transfer cut short
    with pytest.raises(DatasetError, match="is not a dataset carrier"):
        read_carrier(tmp_path / "cut.npz")
    short = dataclasses.replace(carrier, actions=carrier.actions[:-1])
    short.write(tmp_path / "short.npz")
    with pytest.raises(DatasetError, match="damaged: its episodes' lengths, seeds and actions"):
        read_carrier(tmp_path / "short.npz")
    with pytest.raises(DatasetError, match="no carrier at .*datasets carry ID --out FILE"):
        read_carrier(tmp_path / "missing.npz")
    with minari_root_at(tmp_path / "elsewhere"):
        assert main(["datasets", "remake", str(tmp_path / "bad.npz")]) != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "is not a dataset carrier (primal-dt datasets carry writes one)" in line
    assert not (tmp_path / "elsewhere").exists()


def test_carry_and_remake_from_the_command_line(here, tmp_path, capsys) -> None:
    carrier = tmp_path / "medium.npz"
    with minari_root_at(here):
        assert main(["datasets", "carry", "hopper-medium", "--out", str(carrier)]) == 0
    assert "primal-dt/hopper/medium-v0:" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.partial"))
    with minari_root_at(tmp_path / "elsewhere"):
        assert main(["datasets", "remake", str(carrier), "--workers", "2"]) == 0
        assert capsys.readouterr().out.strip() == "primal-dt/hopper/medium-v0"
    assert read_carrier(carrier).about.steps == 700
