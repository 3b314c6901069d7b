"""The CPU thread policy (primal_dt/common/cpu.py): how many threads training takes (one count for the
whole run), and that OpenMP threads are told to sleep."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from conftest import ROOT, TINY

from primal_dt.common.cpu import (
    SPIN_COUNT,
    WAIT_SETTINGS,
    quiet_waits,
    training_threads,
    usable_cores,
    wait_settings,
)
from primal_dt.common.loading import load_config
from primal_dt.data.tasks import resolve_task
from primal_dt.store.results import read_results
from primal_dt.training.launch import start_run


def test_thread_counts(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert training_threads(0) == usable_cores() == len(os.sched_getaffinity(0))
    assert training_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # as a sweep sets it: cores // parallel
    assert training_threads(0) == 4


def test_waits_are_bounded_unless_the_user_chose(monkeypatch) -> None:
    for name in WAIT_SETTINGS:  # recorded, so that what quiet_waits sets is undone afterwards
        monkeypatch.setenv(name, "recorded")
        monkeypatch.delenv(name)
    quiet_waits()
    assert os.environ["GOMP_SPINCOUNT"] == str(SPIN_COUNT) and os.environ["KMP_BLOCKTIME"] == "0"
    assert wait_settings({"PATH": "/bin"}) == {
        "GOMP_SPINCOUNT": str(SPIN_COUNT),
        "KMP_BLOCKTIME": "0",
    }
    for name in WAIT_SETTINGS:  # any wait setting of the user's: all left as they are
        assert wait_settings({name: "1"}) == {}
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.delenv("KMP_BLOCKTIME")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    quiet_waits()
    assert "GOMP_SPINCOUNT" not in os.environ and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    # The command line sets them before torch (and its OpenMP) loads: see it in a fresh process.
    code = (
        "import os, sys; from primal_dt import cli; sys.argv = ['primal-dt', '--version']\n"
        "try: cli.main()\n"
        "except SystemExit: print(os.environ['GOMP_SPINCOUNT'], os.environ['KMP_BLOCKTIME'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.stdout.strip().splitlines()[-1] == f"{SPIN_COUNT} 0", result.stderr


def test_the_gpu_check_runs_its_steps_with_the_command_lines_waits() -> None:
    """scripts/gpu_check.sh exports wait_settings for every step, so that a benchmark times what the
    command does and the dry run's CPU seconds count work, not threads spinning for a core another
    process holds (on a busy machine torch's default spin tripled the evaluation step's); a wait
    setting of the caller's is kept. `--only ''` runs no step and prints what the steps would see."""
    bare = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}

    def seen(env: dict[str, str]) -> str:
        command = ["bash", "scripts/gpu_check.sh", "--dry-run", "--only", ""]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip()

    assert seen(bare) == f"=== OpenMP waits: GOMP_SPINCOUNT={SPIN_COUNT} KMP_BLOCKTIME=0"
    assert (
        seen({**bare, "OMP_WAIT_POLICY": "PASSIVE"}) == "=== OpenMP waits: OMP_WAIT_POLICY=PASSIVE"
    )


def test_the_thread_count_is_fixed_for_the_whole_run(minari_root, tmp_path, monkeypatch) -> None:
    """Set once, when the run is assembled, and never again, however evaluations come and go
    beside it: the weights' bits depend on the count."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    settings = [
        *TINY,
        "train.steps=20",
        "train.device='cpu'",
        "eval.device='cpu'",
        "train.eval_every=5",
        "eval.episodes=1",
        "eval.final_episodes=1",
    ]
    trainer = start_run(load_config(None, settings), resolve_task("hopper-medium"), tmp_path)
    trainer.train(progress=False)
    assert calls == [2]
    assert [r.step for r in read_results(trainer.run_dir)] == [5, 10, 15, 20]
