"""The CPU thread policy (primal_dt/cpu.py): how many threads training takes, that it leaves its
evaluation process a core while that evaluates, and that OpenMP threads are told to sleep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY

from primal_dt.config import load_config
from primal_dt.cpu import quiet_waits, training_threads, usable_cores
from primal_dt.run import EvalRequest
from primal_dt.tasks import resolve_task
from primal_dt.train import start_run


def test_thread_counts(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert training_threads(0) == usable_cores() == len(os.sched_getaffinity(0))
    assert training_threads(0, evaluation_beside=True) == max(1, usable_cores() - 1)
    assert training_threads(3) == training_threads(3, evaluation_beside=True) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # as a sweep sets it: cores // parallel
    assert training_threads(0) == 4 and training_threads(0, evaluation_beside=True) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert training_threads(0, evaluation_beside=True) == 1  # never fewer than one


def test_waits_sleep_unless_the_user_chose(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    quiet_waits()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    quiet_waits()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    # The command line sets it before torch (and its OpenMP) loads: see it in a fresh process.
    code = (
        "import os, sys; from primal_dt import cli; sys.argv = ['primal-dt', '--version']\n"
        "try: cli.main()\nexcept SystemExit: print(os.environ['OMP_WAIT_POLICY'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.stdout.strip().splitlines()[-1] == "PASSIVE", result.stderr


def test_training_leaves_its_evaluation_a_core_while_it_evaluates(
    minari_root, tmp_path, monkeypatch
) -> None:
    """Automatic threads (here 2, from OMP_NUM_THREADS); an explicit train.threads is kept."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    settings = [*TINY, "train.steps=10", "train.device='cpu'", "eval.device='cpu'",
                "train.eval_every=5"]  # fmt: skip
    trainer = start_run(load_config(None, settings), resolve_task("hopper-medium"), tmp_path)
    assert trainer.shares_cpu and calls == [2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: calls[-1])
    trainer._queue_evaluation(EvalRequest(1, final=False))  # an evaluation is in flight
    assert calls[-1] == 1
    trainer.run_dir.queued(0).unlink()  # the evaluator took it: the core comes back
    trainer._share_cpu(evaluating=bool(trainer.run_dir.queued_snapshots()))
    assert calls[-1] == 2


@pytest.mark.parametrize("eval_device", ["cpu", "auto"])
def test_a_cpu_shared_only_with_a_cpu_evaluation(minari_root, tmp_path, eval_device) -> None:
    settings = [*TINY, "train.steps=10", "train.device='cpu'", f"eval.device='{eval_device}'",
                "eval.final_episodes=1"]  # fmt: skip
    trainer = start_run(load_config(None, settings), resolve_task("hopper-medium"), tmp_path)
    assert trainer.shares_cpu == (eval_device == "cpu" or not torch.cuda.is_available())
    external = load_config(None, [*settings, 'eval.service="external"'])
    assert not start_run(external, resolve_task("hopper-medium"), tmp_path / "ext").shares_cpu
