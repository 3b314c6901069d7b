"""Datasets recorded by the tests themselves: real v5 rollouts of real policies, written with
minari.create_dataset_from_buffers into a temporary MINARI_DATASETS_PATH for the whole session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from primal_dt.common.config import ModelConfig
from primal_dt.common.loading import load_config
from primal_dt.data.recording import random_policy, record_episodes, sb3_policy, write_dataset
from primal_dt.data.tasks import Task
from primal_dt.evaluation.rollout import Policy
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.snapshots import TaskInfo
from primal_dt.training.launch import start_run
from primal_dt.training.trainer import Trainer

# The tests' models are tiny: one thread is fastest, and it avoids OpenMP threads spinning against
# each other when the suite shares two cores with subprocesses or other jobs.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"

# The suite's own compile cache, new for each session (training/compiling.py): no test depends on
# what other processes left in a shared one, and the subprocesses the tests start inherit it.
_COMPILE_CACHE = tempfile.TemporaryDirectory(prefix="primal-dt-test-compile-")
os.environ["PRIMAL_DT_COMPILE_CACHE"] = _COMPILE_CACHE.name

# PRIMAL_DT_TEST_DEVICE=cuda (scripts/gpu_check.sh) runs the layer and model tests with CUDA as the
# default device and the training/evaluation tests with --device cuda; the default is the CPU.
DEVICE = os.environ.get("PRIMAL_DT_TEST_DEVICE", "cpu")
ON_DEVICE_MODULES = ("test_attention", "test_model")


@pytest.fixture(autouse=True)
def _default_device(request: pytest.FixtureRequest):
    """The layer and model tests build their tensors without naming a device: put them on DEVICE."""
    if DEVICE == "cpu" or request.module.__name__ not in ON_DEVICE_MODULES:
        yield
        return
    torch.set_default_device(DEVICE)
    try:
        yield
    finally:
        torch.set_default_device(None)


# The SB3 behaviour policies the tests record datasets with, carried in the repository
# (tests/policies: their licence and provenance are in its README).
POLICIES = Path(__file__).resolve().parent / "policies"

# Small model and run settings shared by the tests that train (seconds on 2 CPU cores).
TINY = [
    "model.embed_dim=32",
    "model.n_layer=3",  # as the configs' lists of kinds (primal-dt: softmax, softmax, primal)
    "model.n_head=2",
    # The older key (migrate.LEGACY_SETTINGS): the rank wherever a block is Primal, ignored elsewhere, so
    # that one list serves every config.
    "model.primal_rank=8",
    "model.context_len=5",
    "train.batch_size=16",
    "train.warmup_steps=10",
    "train.log_every=5",
    "train.eval_every=0",
    "eval.episodes=2",
    "eval.final_episodes=0",
]


def policy_file(algo: str, env_id: str) -> Path:
    """A behaviour policy of tests/policies; a missing one fails the test (never skips it)."""
    path = POLICIES / algo / f"{env_id}.zip"
    if not path.is_file():
        pytest.fail(f"behaviour policy {path} is missing from the repository (tests/policies)")
    return path


@pytest.fixture(scope="session")
def minari_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Minari root with the datasets the tests train on; MINARI_DATASETS_PATH points at it."""
    root = tmp_path_factory.mktemp("minari")
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    cheetah = "HalfCheetah-v5"
    # Seeded: the SB3 policies sample their actions, and an unseeded recording differs from one
    # session to the next (so would the tests that learn from it).
    expert = sb3_policy(policy_file("tqc", cheetah), deterministic=False, seed=0)
    write_dataset(
        "mujoco/halfcheetah/expert-v0",
        cheetah,
        record_episodes(cheetah, expert, episodes=3, seed=0),
        ref_min_score=-280.0,
        ref_max_score=11500.0,
        algorithm_name="TQC",
    )
    space = gym.make(cheetah).action_space
    write_dataset(
        "test/halfcheetah/random-v0",
        cheetah,
        record_episodes(cheetah, random_policy(space, seed=0), episodes=3, seed=100),
        algorithm_name="random",
    )
    hopper = "Hopper-v5"
    write_dataset(
        "test/hopper/random-v0",
        hopper,
        record_episodes(hopper, random_policy(gym.make(hopper).action_space, 0), 30, seed=100),
        algorithm_name="random",
    )
    for quality, algo in (("medium", "sac"), ("expert", "tqc")):
        policy = sb3_policy(policy_file(algo, hopper), seed=0)
        write_dataset(
            f"mujoco/hopper/{quality}-v0",
            hopper,
            record_episodes(hopper, policy, episodes=3, seed=10),
            algorithm_name=algo.upper(),
        )
    yield root
    if previous is None:
        del os.environ["MINARI_DATASETS_PATH"]
    else:
        os.environ["MINARI_DATASETS_PATH"] = previous


# --- helpers the test modules share ------------------------------------------------------------


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Any]]:
    """(path, figure) of every figure plots.save writes during the test; each is still saved."""
    from primal_dt.evaluation import plots  # matplotlib: only the tests that draw import it

    saved: list[tuple[Path, Any]] = []
    save = plots.save

    def keep(figure: Any, path: Path) -> Path:
        saved.append((path, figure))
        return save(figure, path)

    monkeypatch.setattr(plots, "save", keep)
    return saved


ROOT = Path(__file__).resolve().parents[1]  # the repository


def train_args(run_dir: Path, steps: int, *extra: str, config: str | None = None) -> list[str]:
    """`primal-dt train` arguments for a TINY run on hopper-medium, offline, on DEVICE; extra
    settings as --set overrides, and a named config (dt, primal-dt) where given."""
    args = ["train", "--env", "hopper-medium", "--offline", "--no-progress"]
    args += ["--run-dir", str(run_dir), "--steps", str(steps), "--device", DEVICE]
    args += ["--config", config] if config else []
    for setting in (*TINY, *extra):
        args += ["--set", setting]
    return args


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run as TensorBoard's own reader sees it: (step, value) per tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def tiny_trainer(task: Task, run_dir: Path, steps: int, *extra: str) -> Trainer:
    """A new run of the TINY model on `task`, ready to train."""
    config = load_config(
        None,
        [*TINY, f"train.steps={steps}", "train.lr=1e-3", f"train.device='{DEVICE}'", *extra],
    )
    return start_run(config, task, run_dir)


def hopper_policy() -> tuple[Policy, TaskInfo]:
    """An untrained but deterministic policy; reset noise makes the episodes end at different
    steps, some by falling (termination) and some at the 20-step limit (truncation)."""
    torch.manual_seed(0)
    config = ModelConfig(
        embed_dim=32,
        n_layer=2,
        n_head=2,
        context_len=5,
        attention=["softmax", "primal"],
        attention_settings={"primal": {"rank": 8}},
    )
    model = DecisionTransformer(config, 11, 3, 1000)
    policy = Policy(model, torch.zeros(11), torch.full((11,), 0.2), 1000.0, torch.device("cpu"))
    task = TaskInfo("test", (), "Hopper-v5", {"reset_noise_scale": 0.1}, 20, (3600.0, 1800.0), None)
    return policy, task
