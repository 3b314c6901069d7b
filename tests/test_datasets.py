"""`primal-dt datasets`: recipes that write real Minari datasets, task resolution, the bundled data.

Every dataset here is recorded in this module's own Minari root from real Hopper-v5 rollouts of the
SB3 policies in tests/policies (or a uniform-random policy, or SAC training itself).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from conftest import TINY, policy_file
from stable_baselines3 import SAC

from primal_dt.cli import main
from primal_dt.common.errors import TaskError
from primal_dt.data import references
from primal_dt.data.episodes import load_task_data
from primal_dt.data.recipes import write_in_place
from primal_dt.data.recording import (
    mean_return,
    random_policy,
    record_episodes,
    sb3_policy,
    write_dataset,
)
from primal_dt.data.sources import BUNDLED_ROOT, origin
from primal_dt.data.tasks import resolve_task
from primal_dt.store.snapshots import read_snapshot

HOPPER = "Hopper-v5"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(*args: str) -> int:
    return main(["datasets", "make", "--env", "hopper", "--no-progress", *args])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's Minari root, holding a made medium (SAC) and expert (TQC) Hopper dataset."""
    path = tmp_path_factory.mktemp("datasets-root")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(path))
        sac, tqc = policy_file("sac", HOPPER), policy_file("tqc", HOPPER)
        assert (
            make(
                "--recipe",
                "policy",
                "--policy",
                str(sac),
                "--name",
                "medium",
                "--episodes",
                "3",
                "--expert-policy",
                str(tqc),
                "--ref-episodes",
                "2",
            )
            == 0
        )
        assert (
            make(
                "--recipe",
                "policy",
                "--policy",
                str(tqc),
                "--name",
                "expert",
                "--steps",
                "600",
                "--deterministic",
                "--seed",
                "7",
            )
            == 0
        )
        yield path


def test_policy_recipe_writes_a_minari_dataset_with_provenance_and_reference_scores(root) -> None:
    dataset = minari.load_dataset("primal-dt/hopper/medium-v0")
    env = gym.make(HOPPER)
    assert dataset.observation_space == env.observation_space
    assert dataset.action_space == env.action_space
    assert dataset.total_episodes == 3
    assert [ep.id for ep in dataset.iterate_episodes()] == [0, 1, 2]

    metadata = dataset.storage.metadata
    provenance = metadata["provenance"]
    assert provenance["recipe"] == "policy" and provenance["env_id"] == HOPPER
    assert provenance["episodes"] == 3 and provenance["seed"] == 0
    sac, tqc = policy_file("sac", HOPPER), policy_file("tqc", HOPPER)
    assert provenance["policy"] == {
        "file": str(sac),
        "sha256": sha256(sac),
        "algorithm": "SAC",
        "deterministic": False,
    }
    assert provenance["reference"]["expert_policy"]["sha256"] == sha256(tqc)
    assert provenance["reference"]["expert_policy"]["algorithm"] == "TQC"
    assert {"minari", "gymnasium", "mujoco", "stable-baselines3"} <= set(provenance["versions"])

    # The reference scores are measured: the random one is reproduced exactly from its seeds.
    reference = provenance["reference"]
    assert metadata["ref_min_score"] == reference["random"]
    assert metadata["ref_max_score"] == reference["expert"]
    space = env.action_space
    assert reference["random"] == mean_return(HOPPER, random_policy(space, 100_000), 2, 100_000)
    assert reference["expert"] > 1000 > reference["random"]

    # The expert dataset: an exact step budget, the last episode cut and marked truncated.
    expert = minari.load_dataset("primal-dt/hopper/expert-v0")
    assert expert.total_steps == 600
    last = list(expert.iterate_episodes())[-1]
    assert last.truncations[-1] and not last.terminations[-1]
    assert expert.storage.metadata["provenance"]["policy"]["deterministic"] is True
    assert "ref_min_score" not in expert.storage.metadata  # no --expert-policy: none measured
    assert not list(root.glob(".primal-dt-staging-*"))


def test_task_names_resolve_to_made_datasets_and_say_which(root, tmp_path) -> None:
    task = resolve_task("hopper-medium")
    assert task.dataset_ids == ("primal-dt/hopper/medium-v0",)  # no official one here
    assert origin(task.dataset_ids[0]) == f"made locally, in {root}"
    data = load_task_data(task, download=False)
    assert (
        data.reference.random
        == minari.load_dataset(task.dataset_ids[0]).storage.metadata["ref_min_score"]
    )
    assert "measured on Hopper-v5" in data.reference.source
    with pytest.raises(TaskError, match="datasets make --env hopper --recipe medium-replay"):
        resolve_task("hopper-medium-replay")

    # An official dataset present in the root wins over the made one.
    official = tmp_path / "official-root"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(official))
        assert resolve_task("hopper-medium").dataset_ids == ("mujoco/hopper/medium-v0",)
        space = gym.make(HOPPER).action_space
        write_dataset(
            "mujoco/hopper/medium-v0",
            HOPPER,
            record_episodes(HOPPER, random_policy(space, 0), 1, seed=0),
        )
        assert resolve_task("hopper-medium").dataset_ids == ("mujoco/hopper/medium-v0",)
        assert origin("mujoco/hopper/medium-v0") == f"present, in {official}"


def test_medium_expert_contains_both_parts(root, capsys) -> None:
    assert make("--recipe", "medium-expert", "--offline") == 0
    assert capsys.readouterr().out.strip() == "primal-dt/hopper/medium-expert-v0"
    combined = minari.load_dataset("primal-dt/hopper/medium-expert-v0")
    medium = minari.load_dataset("primal-dt/hopper/medium-v0")
    expert = minari.load_dataset("primal-dt/hopper/expert-v0")
    assert combined.total_episodes == medium.total_episodes + expert.total_episodes
    assert combined.total_steps == medium.total_steps + expert.total_steps
    parts = [*medium.iterate_episodes(), *expert.iterate_episodes()]
    for got, want in zip(combined.iterate_episodes(), parts, strict=True):
        np.testing.assert_array_equal(got.observations, want.observations)
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.rewards, want.rewards)
    provenance = combined.storage.metadata["provenance"]
    assert [s["id"] for s in provenance["sources"]] == [
        "primal-dt/hopper/medium-v0",
        "primal-dt/hopper/expert-v0",
    ]
    # The expert part has no reference scores, so the medium part's are carried over.
    assert combined.storage.metadata["ref_max_score"] == medium.storage.metadata["ref_max_score"]
    assert (
        "copied from the metadata of primal-dt/hopper/medium-v0" in provenance["reference"]["how"]
    )
    # The task now means the combined dataset made here, in one piece.
    assert resolve_task("hopper-medium-expert").dataset_ids == (
        "primal-dt/hopper/medium-expert-v0",
    )


def test_medium_replay_records_every_transition_sac_saw(root, tmp_path, capsys) -> None:
    policy_out = tmp_path / "medium.zip"
    assert (
        make(
            "--recipe",
            "medium-replay",
            "--target-return",
            "1",
            "--eval-every",
            "100",
            "--eval-episodes",
            "1",
            "--learning-starts",
            "50",
            "--max-steps",
            "1000",
            "--policy-out",
            str(policy_out),
        )
        == 0
    )
    assert "reached 1.0 after 100 steps" in capsys.readouterr().err
    dataset = minari.load_dataset("primal-dt/hopper/medium-replay-v0")
    training = dataset.storage.metadata["provenance"]["training"]
    assert training["reached"] and training["steps"] == 100 == dataset.total_steps
    assert training["medium_policy"] == {"file": str(policy_out), "sha256": sha256(policy_out)}
    SAC.load(policy_out, device="cpu")  # the policy reached is kept, and loads

    # The episodes are the real transitions: the first one's actions, replayed in an environment
    # reset with its seed, give back its observations and rewards.
    episodes = list(dataset.iterate_episodes())
    assert all(ep.terminations[-1] or ep.truncations[-1] for ep in episodes)
    env = gym.make(HOPPER)
    first = episodes[0]
    observation, _ = env.reset(seed=0)
    np.testing.assert_array_equal(observation, first.observations[0])
    for t, action in enumerate(first.actions):
        observation, reward, *_ = env.step(action)
        np.testing.assert_allclose(observation, first.observations[t + 1], rtol=1e-6)
        assert reward == pytest.approx(first.rewards[t])
    assert resolve_task("hopper-medium-replay").dataset_ids == (
        "primal-dt/hopper/medium-replay-v0",
    )

    # Without reaching the target, the budget ends the run, and the episode in progress is kept.
    assert (
        make(
            "--recipe",
            "medium-replay",
            "--name",
            "replay-budget",
            "--target-return",
            "1e6",
            "--eval-every",
            "60",
            "--eval-episodes",
            "1",
            "--learning-starts",
            "100",
            "--max-steps",
            "120",
            "--policy-out",
            str(tmp_path / "b.zip"),
        )
        == 0
    )
    budget = minari.load_dataset("primal-dt/hopper/replay-budget-v0")
    assert budget.total_steps == 120
    assert not budget.storage.metadata["provenance"]["training"]["reached"]


def test_make_never_overwrites_nor_leaves_half_a_dataset(root, tmp_path, capsys) -> None:
    before = sha256(root / "primal-dt/hopper/medium-v0/data/main_data.hdf5")
    assert make("--recipe", "random", "--name", "medium", "--episodes", "1") == 2
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and "--force" in err and len(err.splitlines()) == 1
    assert sha256(root / "primal-dt/hopper/medium-v0/data/main_data.hdf5") == before

    not_a_policy = tmp_path / "policy.zip"
    not_a_policy.write_text("not a zip file")
    assert make("--recipe", "policy", "--policy", str(not_a_policy), "--name", "broken") == 2
    assert "not a Stable-Baselines3 policy file" in capsys.readouterr().err
    assert not (root / "primal-dt/hopper/broken-v0").exists()

    def fails_half_way() -> None:
        write_dataset("primal-dt/hopper/half-v0", HOPPER, [])
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_in_place(root, "primal-dt/hopper/half-v0", False, fails_half_way)
    assert not (root / "primal-dt/hopper/half-v0").exists()
    assert not list(root.glob(".primal-dt-staging-*"))

    assert make("--recipe", "random", "--steps", "50", "--seed", "3") == 0
    assert make("--recipe", "random", "--steps", "80", "--force") == 0
    random = minari.load_dataset("primal-dt/hopper/random-v0")
    assert random.total_steps == 80 and random.storage.metadata["provenance"]["seed"] == 0


def test_list_info_and_download(root, capsys) -> None:
    assert main(["datasets", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "downloadable" in rows["mujoco/walker2d/medium-v0"]
    assert "made locally" in rows["primal-dt/hopper/medium-v0"]
    assert "hopper-medium" in rows["primal-dt/hopper/medium-v0"]
    assert "bundled" in rows["primal-dt/hopper/bundled-v0"]

    assert main(["datasets", "info", "hopper-medium"]) == 0
    out = capsys.readouterr().out
    returns = [
        float(np.sum(ep.rewards))
        for ep in minari.load_dataset("primal-dt/hopper/medium-v0").iterate_episodes()
    ]
    assert "episodes     3" in out
    assert f"mean {np.mean(returns):.1f}" in out and f"max {max(returns):.1f}" in out
    assert "measured on Hopper-v5" in out and '"recipe": "policy"' in out

    start = time.monotonic()
    assert main(["datasets", "download", "mujoco/walker2d/medium-v0"]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err.strip()
    assert "mujoco/walker2d/medium-v0" in err and len(err.splitlines()) == 1
    assert main(["datasets", "download", "primal-dt/hopper/medium-v0"]) == 2
    assert "made locally" in capsys.readouterr().err
    assert main(["datasets", "info", "mujoco/walker2d/medium-v0"]) == 2
    assert "not on this machine" in capsys.readouterr().err


def test_bundled_dataset_loads_and_trains_end_to_end(tmp_path, capsys) -> None:
    folder = BUNDLED_ROOT / "primal-dt/hopper/bundled-v0"
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) < 3_000_000
    dataset = minari.MinariDataset(folder / "data")
    metadata = dataset.storage.metadata
    provenance = metadata["provenance"]
    assert dataset.env_spec.id == HOPPER and dataset.total_steps == provenance["steps"]
    assert provenance["policy"]["algorithm"] == "SAC"
    assert provenance["reference"]["expert_policy"]["algorithm"] == "TQC"
    sac, tqc = policy_file("sac", HOPPER), policy_file("tqc", HOPPER)
    assert provenance["policy"]["sha256"] == sha256(sac)
    assert provenance["reference"]["expert_policy"]["sha256"] == sha256(tqc)
    assert metadata["ref_min_score"] < metadata["ref_max_score"]

    empty = tmp_path / "fresh-machine"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(empty))
        assert resolve_task("hopper-bundled").dataset_ids == ("primal-dt/hopper/bundled-v0",)
        args = [
            "train",
            "--env",
            "hopper-bundled",
            "--offline",
            "--no-progress",
            "--device",
            "cpu",
            "--steps",
            "10",
            "--run-dir",
            str(tmp_path / "run"),
        ]
        for setting in (*TINY, "eval.final_episodes=1"):
            args += ["--set", setting]
        assert main(args) == 0
    out, err = capsys.readouterr()
    assert "dataset: primal-dt/hopper/bundled-v0 (bundled with primal-dt)" in err
    assert "Minari metadata of primal-dt/hopper/bundled-v0" in out  # normalised with its scores
    task = read_snapshot(tmp_path / "run" / "ckpt.pt").task
    assert task.dataset_ids == ("primal-dt/hopper/bundled-v0",)
    assert task.reference.expert == metadata["ref_max_score"]
    assert not (empty / "primal-dt").exists()  # read in place, never copied
    json.dumps(provenance)  # plain JSON all the way down


def test_one_reference_per_environment_measured_to_a_standard_error_and_used_by_make(
    root, tmp_path, monkeypatch, capsys
) -> None:
    """datasets reference: episodes added a batch at a time until each mean's standard error is
    under the tolerance (of the expert's mean), against a direct computation; datasets make
    --reference writes that pair into the dataset's metadata, and refuses a file without the
    environment or measured with another expert, before recording anything."""
    monkeypatch.setattr(references, "BATCH", 2)  # (10 at a time in earnest)
    monkeypatch.setattr(references, "TOLERANCE", 0.05)
    tqc, sac = policy_file("tqc", HOPPER), policy_file("sac", HOPPER)
    out = tmp_path / "references.json"
    args = ["datasets", "reference", "--env", "hopper", "--expert-policy", str(tqc)]
    assert main([*args, "--out", str(out)]) == 0
    found = references.read_references(out)["Hopper-v5"]
    expert = [
        float(np.sum(b.rewards))
        for b in record_episodes(
            HOPPER, sb3_policy(tqc, False, 200_000, HOPPER), found.expert_episodes, 200_000
        )
    ]
    assert found.expert_episodes >= 4 and found.expert == pytest.approx(np.mean(expert))
    assert found.expert_se == pytest.approx(np.std(expert, ddof=1) / np.sqrt(len(expert)))
    assert found.expert_se <= 0.05 * found.expert and found.random_se <= 0.05 * found.expert
    assert found.expert_policy["sha256"] == sha256(tqc) and found.random < 100 < found.expert
    # Used by make: the file's pair in the metadata, measured nothing.
    medium = ["--recipe", "policy", "--policy", str(sac), "--episodes", "1", "--expert-policy"]
    assert make(*medium, str(tqc), "--name", "referenced", "--reference", str(out)) == 0
    metadata = minari.load_dataset("primal-dt/hopper/referenced-v0").storage.metadata
    assert (metadata["ref_min_score"], metadata["ref_max_score"]) == (found.random, found.expert)
    assert metadata["provenance"]["reference"]["how"] == found.how
    assert f"{found.expert_episodes} of tqc/Hopper-v5.zip" in found.how
    capsys.readouterr()
    # Refused in one line before recording: another expert, no such environment in the file.
    assert make(*medium, str(sac), "--name", "other", "--reference", str(out)) == 2
    assert "measured with another expert policy" in capsys.readouterr().err
    out.write_text("{}")
    assert make(*medium, str(tqc), "--name", "other", "--reference", str(out)) == 2
    assert "has no reference scores for Hopper-v5" in capsys.readouterr().err
    assert not (root / "primal-dt" / "hopper" / "other-v0").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "policy", "--name", "medium"], "needs --policy FILE"),
        (["--recipe", "policy", "--policy", "missing.zip", "--name", "x"], "no such file"),
        (["--recipe", "random", "--name", "Medium_1"], "lower-case words"),
        (["--recipe", "medium-replay", "--episodes", "3"], "policy and random recipes"),
        (["--recipe", "random", "--steps", "0"], "--steps must be > 0"),
    ],
)
def test_make_refuses_bad_options_in_one_line(root, capsys, args, message) -> None:
    assert make(*args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert main(["datasets", "make", "--env", "cheetah", "--recipe", "random"]) == 2
    assert "unknown env 'cheetah'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "env_name, gym_id", [("humanoid", "Humanoid-v5"), ("swimmer", "Swimmer-v5")]
)
def test_every_locomotion_env_records_trains_and_evaluates_offline(
    env_name, gym_id, tmp_path, capsys, monkeypatch
) -> None:
    """The environments beyond D4RL's four: a dataset recorded from an SB3 policy file (a few
    hundred steps of SAC, saved as a user's policy would be) and from random actions, a short
    run on it offline, and its final evaluation scored against the env file's reference."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    agent = SAC("MlpPolicy", gym.make(gym_id), learning_starts=50, seed=0)
    agent.learn(100)
    agent.save(tmp_path / "sac.zip")
    made = ["datasets", "make", "--env", env_name, "--no-progress", "--episodes", "2"]
    assert (
        main(
            [*made, "--recipe", "policy", "--policy", str(tmp_path / "sac.zip"), "--name", "medium"]
        )
        == 0
    )
    assert main([*made, "--recipe", "random"]) == 0
    assert capsys.readouterr().out.split() == [
        f"primal-dt/{env_name}/medium-v0",
        f"primal-dt/{env_name}/random-v0",
    ]
    task = resolve_task(f"{env_name}-medium")
    assert task.dataset_ids == (f"primal-dt/{env_name}/medium-v0",)
    data = load_task_data(task, download=False)
    assert data.env_id == gym_id and len(data.episodes) == 2
    train = [
        "train",
        "--env",
        f"{env_name}-random",
        "--offline",
        "--no-progress",
        "--device",
        "cpu",
        "--steps",
        "5",
        "--final-episodes",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    for setting in TINY:
        train += ["--set", setting]
    assert main(train) == 0
    table = capsys.readouterr().out
    env = resolve_task(f"{env_name}-random").env
    assert f"{env.eval_targets[0]:.1f}" in table and f"{env.eval_targets[1]:.1f}" in table
    assert f"random {env.ref_random:.2f}, expert {env.ref_expert:.2f}" in table
