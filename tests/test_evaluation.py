"""The evaluation service: vectorised rollouts against a sequential loop, evaluation beside
training, a failing snapshot that does not stop training, --watch, and the multi-run table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import hopper_policy, scalars, train_args

from primal_dt.cli import main
from primal_dt.evaluation.rollout import EvalOptions, make_jobs, make_vector, rollout
from primal_dt.evaluation.sequential import sequential_rollout
from primal_dt.evaluation.service import watch
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot


def test_vectorised_rollout_matches_the_sequential_loop() -> None:
    policy, setup = hopper_policy()
    jobs = make_jobs((3600.0, 100.0), episodes=6, seed=10)
    expected_returns, expected_lengths = sequential_rollout(policy, setup, jobs)
    assert len(set(expected_lengths)) > 2 and expected_lengths.max() == 20  # ends vary
    assert (expected_returns[:6] != expected_returns[6:]).any()  # the target matters
    for num_envs, workers in ((None, 0), (5, 0), (1, 0), (4, 2)):
        returns, lengths = rollout(policy, setup, jobs, num_envs, workers)
        np.testing.assert_array_equal(lengths, expected_lengths, err_msg=f"{num_envs=} {workers=}")
        np.testing.assert_allclose(returns, expected_returns, rtol=1e-6, atol=1e-6)
    again, _ = rollout(policy, setup, jobs, 5)
    np.testing.assert_array_equal(again, rollout(policy, setup, jobs, 5)[0])
    other, _ = rollout(policy, setup, make_jobs((3600.0, 100.0), episodes=6, seed=11))
    assert not np.allclose(other, expected_returns)


def test_where_cuda_is_live_the_workers_come_from_a_fork_server(monkeypatch) -> None:
    """A worker forked from a process holding CUDA cannot use it, and spawning one per slot
    imports torch per slot: the workers fork from a server that imported torch once, and give
    the same episodes."""
    policy, setup = hopper_policy()
    jobs = make_jobs((3600.0,), episodes=4, seed=10)
    expected_returns, expected_lengths = sequential_rollout(policy, setup, jobs)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    envs = make_vector(setup, 2, workers=2)
    try:
        assert {type(process).__name__ for process in envs.processes} == {"ForkServerProcess"}
        servers = {parent_pid(process.pid) for process in envs.processes}
        assert len(servers) == 1 and servers != {os.getpid()}
        server_maps = Path(f"/proc/{servers.pop()}/maps").read_text()
        assert "libtorch" in server_maps  # torch was imported in the server, before the fork
    finally:
        envs.close()
    returns, lengths = rollout(policy, setup, jobs, 2, workers=2)
    np.testing.assert_array_equal(lengths, expected_lengths)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-6, atol=1e-6)


def parent_pid(pid: int) -> int:
    """The parent of a process, from /proc (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def test_training_hands_evaluations_to_the_service(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    # A snapshot the evaluator cannot load is waiting in the queue when training starts.
    (run_dir / "eval_queue").mkdir(parents=True)
    (run_dir / "eval_queue" / "step_00000003.pt").write_bytes(b"garbage")
    extra = (
        "train.eval_every=5",
        "eval.targets=[1800.0]",
        "eval.final_episodes=3",
        "train.ckpt_every=5",
        "eval.workers=2",
    )
    assert main(train_args(run_dir, 15, *extra)) == 0
    out, err = capsys.readouterr()
    assert "step 3: evaluation failed: CheckpointError" in err
    assert "step 15: final evaluation over 3 episodes" in err
    assert "1800.0" in out and "[1] reference scores" in out  # the final table

    records = read_results(RunDir(run_dir))
    assert [r.step for r in records] == [3, 5, 10, 15]
    assert "is not a checkpoint at all" in records[0].error
    assert [(r.episodes, r.final) for r in records[1:]] == [(2, False), (2, False), (3, True)]
    assert not list((run_dir / "eval_queue").iterdir())  # every snapshot was taken, then deleted
    assert {r.checkpoint for r in records} == {str(run_dir)}
    logged = scalars(run_dir)
    for name in ("return", "normalized_return", "episode_length"):
        assert [s for s, _ in logged[f"eval/1800/{name}"]] == [5, 10, 15], name
    assert logged["eval/1800/return"][-1][1] == pytest.approx(records[-1].results[0].return_mean)
    best = max(records[1:], key=lambda r: r.score)
    assert read_snapshot(run_dir / "best.pt").step == best.step

    # Every kept checkpoint of the run, and a second run, in one table.
    other = tmp_path / "other"
    assert main(train_args(other, 5, "eval.targets=[900.0]")) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--ckpt",
                str(run_dir),
                str(other),
                "--all",
                "--episodes",
                "1",
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    table = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["results"][0]["target"]) for r in table] == [
        (5, 1800.0),
        (10, 1800.0),
        (15, 1800.0),
        (5, 900.0),
    ]
    assert main(["eval", "--ckpt", str(run_dir), str(other), "--episodes", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "checkpoint",
        "task",
        "step",
        "target",
        "return",
        "normalized",
        "episodes",
        "ref",
    ]
    assert all("hopper-medium" in row for row in lines[1:3])  # one row per run
    assert lines[3].startswith("[1] reference scores: random -20.27, expert 3234.30: D4RL")
    assert lines[4] == "hopper-medium was trained on mujoco/hopper/medium-v0"


def test_watch_evaluates_what_an_external_service_queues(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    extra = ("train.eval_every=5", "eval.service=external", "eval.final_episodes=2")
    assert main(train_args(run_dir, 10, *extra)) == 0
    assert f"for: primal-dt eval --watch {run_dir}" in capsys.readouterr().err
    assert not (run_dir / "eval.jsonl").exists()  # nobody evaluated during training
    assert sorted(p.name for p in (run_dir / "eval_queue").iterdir()) == [
        "step_00000005.pt",
        "step_00000010.pt",
    ]

    watch(
        run_dir,
        EvalOptions(device="cpu"),
        torch.device("cpu"),
        poll_seconds=0.1,
        stop=lambda: bool(read_results(RunDir(run_dir))),
    )
    records = read_results(RunDir(run_dir))
    assert [(r.step, r.episodes, r.final) for r in records] == [
        (5, 2, False),
        (10, 2, True),
    ]
    assert not list((run_dir / "eval_queue").iterdir())
    # checkpoints/step_00000010.pt was saved too; its step is already evaluated, so it is skipped.
    assert (run_dir / "checkpoints" / "step_00000010.pt").exists()

    # The command runs until it is stopped, evaluating checkpoints as they appear.
    # It writes the record before it prints the line: wait for the line (read as it comes), not
    # for the record, before stopping it.
    watcher = subprocess.Popen(
        [sys.executable, "-m", "primal_dt.cli", "eval", "--watch", str(run_dir), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C as at a terminal, however the suite was started (a background job's shell
        # ignores SIGINT, and a child inherits that: Python then never raises KeyboardInterrupt).
        preexec_fn=partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    assert watcher.stdout is not None
    threading.Thread(target=lines.extend, args=(watcher.stdout,), daemon=True).start()
    try:
        assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 0
        deadline = time.monotonic() + 60
        while not any("step 15: final evaluation over 2 episodes" in line for line in lines):
            assert time.monotonic() < deadline, "the watcher evaluated nothing"
            time.sleep(0.2)
    finally:
        watcher.send_signal(signal.SIGINT)
        err = watcher.stderr.read() if watcher.stderr else ""
        watcher.wait(timeout=30)
    assert watcher.returncode == 0, err
    assert any(r.step == 15 and r.final for r in read_results(RunDir(run_dir)))
    assert "stopped watching" in err


@pytest.mark.parametrize("service", ["process", "inline"])
def test_the_evaluators_notes_reach_the_terminal_during_training(
    minari_root, tmp_path, capsys, service
) -> None:
    """What the evaluator could not log (here the attention spectrum, whose saved windows are
    unreadable) is printed by `train`, from the process beside training as from inline."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spectrum_windows.pt").write_bytes(b"not windows")
    extra = (
        "train.eval_every=5",
        "eval.episodes=1",
        "eval.final_episodes=1",
        f'eval.service="{service}"',
    )
    assert main(train_args(run_dir, 10, *extra)) == 0
    err = capsys.readouterr().err
    for step in (5, 10):
        assert f"step {step}: attention spectrum not logged: ValueError: " in err, err
    assert "spectrum_windows.pt is damaged" in err and "weights_only" not in err


def test_inline_and_background_evaluators_record_the_same(minari_root, tmp_path) -> None:
    """The evaluator changes where an evaluation runs, never what it finds."""
    found = {}
    for service in ("process", "inline"):
        run_dir = tmp_path / service
        extra = (
            "train.eval_every=5",
            "eval.episodes=2",
            "eval.final_episodes=2",
            f'eval.service="{service}"',
        )
        assert main(train_args(run_dir, 10, *extra)) == 0
        found[service] = [
            (r.step, r.final, r.score, [s.return_mean for s in r.results], r.best)
            for r in read_results(RunDir(run_dir))
        ]
    assert found["inline"] == found["process"] and len(found["inline"]) == 2
