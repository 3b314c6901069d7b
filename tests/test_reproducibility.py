"""Same command, same seed, same bits: under the default (automatic) threads, with evaluation
beside training, and however often a run is stopped (SIGINT, SIGTERM, SIGKILL) and resumed."""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import scalars, train_args

from primal_dt.cli import main
from primal_dt.evaluation.rollout import EvalOptions
from primal_dt.evaluation.service import CheckpointEvaluator
from primal_dt.store.locks import RunLock
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import EvalRequest, read_snapshot, write_snapshot
from primal_dt.tools.runs import read_run

STEPS = 100
# Checkpoints, logs and evaluations every few steps, so that kills land mid-step, mid-checkpoint
# and mid-evaluation; one episode per evaluation keeps each short.
EVALUATING = (
    "train.ckpt_every=10",
    "train.eval_every=20",
    "eval.episodes=1",
    "eval.final_episodes=1",
)
# bf16, what "auto" resolves to on the CPUs this project runs on, forced so that the tests mean
# the same on any machine; float32 has its own same-bits test.
BF16 = 'train.precision="bf16"'
TIMING = "train/steps_per_sec"  # the one scalar that is a measurement of time


def default_threads_env() -> dict[str, str]:
    """The environment a user's command gets: no OMP_NUM_THREADS (the tests' own process sets
    it to 1), so training takes the automatic count, one thread per usable core."""
    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "primal_dt.cli", *args],
        env=default_threads_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def train(run_dir: Path, steps: int = STEPS, *extra: str) -> None:
    process = start(train_args(run_dir, steps, *EVALUATING, BF16, *extra))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output


def fingerprint(run_dir: Path) -> tuple[dict, dict, list]:
    """What a run ends with: its weights, every logged scalar but the timing, every evaluation."""
    weights = read_snapshot(run_dir).weights
    logged = {tag: points for tag, points in scalars(run_dir).items() if tag != TIMING}
    evaluations = [
        (r.step, r.final, r.error, r.score, [(s.target, s.return_mean) for s in r.results])
        for r in read_results(RunDir(run_dir))
    ]
    return weights, logged, evaluations


def assert_same(a: Path, b: Path) -> None:
    (weights_a, logged_a, evals_a), (weights_b, logged_b, evals_b) = fingerprint(a), fingerprint(b)
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name
    assert logged_a == logged_b
    assert evals_a == evals_b


@pytest.fixture(scope="module")
def straight(minari_root, tmp_path_factory) -> Path:
    """A run never interrupted, with periodic evaluation beside it and automatic threads."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    train(run_dir)
    return run_dir


def test_the_same_command_gives_the_same_bits(straight, tmp_path) -> None:
    again = tmp_path / "again"
    train(again)
    assert_same(straight, again)
    logged = scalars(straight)
    # Every train/* and eval/* point exactly once (lists of (step, value) compare whole).
    assert [s for s, _ in logged["train/action_loss"]] == list(range(5, STEPS + 1, 5))
    assert [s for s, _ in logged["eval/3600/return"]] == [20, 40, 60, 80, 100]
    assert [s for s, _ in logged["eval/final_normalized_return"]] == [100]


def test_the_same_command_gives_the_same_bits_in_float32(minari_root, tmp_path) -> None:
    fp32 = 'train.precision="fp32"'
    train(tmp_path / "a", 40, fp32)
    train(tmp_path / "b", 40, fp32)
    assert read_snapshot(tmp_path / "a").config.train.precision == "fp32"
    assert_same(tmp_path / "a", tmp_path / "b")


def wait_for_checkpoint(process: subprocess.Popen, run_dir: Path, step: int) -> bool:
    """Until the run has saved a checkpoint of at least `step` (False: the run ended first)."""
    ckpt, seen = run_dir / "ckpt.pt", None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ckpt.exists() and ckpt.stat().st_mtime != seen:
            seen = ckpt.stat().st_mtime
            if read_snapshot(ckpt).step >= step:
                return True
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    raise AssertionError(f"no checkpoint of step {step} within 2 minutes")


def stop_and_resume(
    command: list[str],
    watched: Path,
    resume: list[str],
    kills: list[signal.Signals],
    steps: int,
    seed: int,
) -> list[tuple[str, str]]:
    """Start `command`; at a random moment after each of a series of checkpoints of `watched`
    (spread over its `steps`) send the next of `kills`, and start `resume` after each stop, until
    the training ends (successfully: asserted). Returns each stop's signal name and output."""
    rng = random.Random(seed)
    process = start(command)
    stopped = []
    for i, signum in enumerate(kills):
        if not wait_for_checkpoint(process, watched, (i + 1) * steps // (len(kills) + 1)):
            break  # the run finished before this kill
        time.sleep(rng.uniform(0.0, 0.1))
        process.send_signal(signum)
        output, _ = process.communicate(timeout=120)
        if process.returncode == 0:
            break
        assert process.returncode in (128 + signum, -signum), output
        stopped.append((signum.name, output))
        process = start(resume)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    return stopped


def test_a_run_stopped_and_resumed_many_times_ends_bit_identical(straight, tmp_path) -> None:
    """SIGINT, SIGTERM and SIGKILL in turn, spread over the run, each a random moment after a
    checkpoint (so mid-step, mid-checkpoint or mid-evaluation), every stop followed by --resume,
    until the run ends."""
    run_dir = tmp_path / "stopped"
    kills = [signal.SIGINT, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGINT]
    stopped = stop_and_resume(
        train_args(run_dir, STEPS, *EVALUATING, BF16),
        run_dir,
        ["train", "--resume", str(run_dir), "--no-progress"],
        kills,
        STEPS,
        seed=18,
    )
    assert len(stopped) >= 4, f"the run ended after only {[s for s, _ in stopped]}: too few stops"
    assert_same(straight, run_dir)
    # primal-dt report reads the same curves: every point once, as for the uninterrupted run.
    a, b = read_run(straight, spectra=False), read_run(run_dir, spectra=False)
    assert a.aux_loss == b.aux_loss and [s for s, _ in b.aux_loss] == list(range(5, STEPS + 1, 5))
    assert a.scores == b.scores and [s for s, _ in b.scores] == [20, 40, 60, 80, 100]
    # The task's charts too (copied from training.jsonl, which keeps every session's lines).
    logged = scalars(run_dir)
    (copy,) = [tag for tag in logged if tag.startswith("by_task/") and tag.endswith("ksvd_loss")]
    assert logged[copy] == logged["train/ksvd_loss"]
    # Nothing left behind: no temporary file, no lock, no queued snapshot.
    leftovers = [p.name for p in run_dir.rglob(".*") if p.suffix in (".tmp", ".lock")]
    assert leftovers == [] and list((run_dir / "eval_queue").glob("*")) == []


def test_extending_a_run_equals_training_it_straight_through(straight, tmp_path) -> None:
    """--resume --steps after the run ended: the same weights and losses as one long run; every
    point once, the first run's final evaluation (at its last step) kept."""
    run_dir = tmp_path / "extended"
    train(run_dir, 50)
    process = start(["train", "--resume", str(run_dir), "--steps", str(STEPS), "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (weights_a, logged_a, evals_a), (weights_b, logged_b, evals_b) = (
        fingerprint(straight),
        fingerprint(run_dir),
    )
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name
    assert {t: p for t, p in logged_a.items() if t.startswith("train/")} == {
        t: p for t, p in logged_b.items() if t.startswith("train/")
    }
    assert [e for e in evals_b if e[0] != 50] == evals_a
    steps = [(step, final) for step, final, *_ in evals_b]
    assert steps == [(20, False), (40, False), (50, True), (60, False), (80, False), (100, True)]
    # The report's quarters and the study's cost line count the steps trained, not config.json's
    # 50, and both sessions.
    summary = read_run(run_dir, spectra=False)
    assert summary.steps == summary.step == STEPS
    (first, second) = summary.sessions  # training.jsonl's two sessions, in order
    assert first[0] < first[1] <= second[0] < second[1]


def test_a_resumed_run_prints_the_results_its_predecessor_never_printed(
    minari_root, tmp_path
) -> None:
    """The evaluations recorded after the last results the stopped trainer printed (here by an
    external evaluator while no trainer ran) are printed when the run resumes, once each."""
    run_dir = tmp_path / "run"
    external = ('eval.service="external"', "train.eval_every=10", "eval.episodes=1")
    assert main(train_args(run_dir, 20, *external)) == 0
    assert read_results(RunDir(run_dir)) == []
    with CheckpointEvaluator(
        RunDir(run_dir), EvalOptions(device="cpu"), torch.device("cpu")
    ) as evaluator:
        assert len(evaluator.evaluate_queue()) == 2
    process = start(["train", "--resume", str(run_dir), "--steps", "25", "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    for step in (10, 20):
        assert output.count(f"step {step}: evaluation over 1 episodes") == 1, output


def test_resume_of_a_run_in_use_before_its_first_checkpoint_names_the_process(
    tmp_path, capsys
) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from primal_dt.store.rundir import RunDir; from primal_dt.store.locks import RunLock\n"
            f"lock = RunLock(RunDir(Path({str(run_dir)!r})), 'train').acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{run_dir} is in use: process {holder.pid} is its train writer" in line
    finally:
        holder.kill()
        holder.wait()
    assert RunLock(RunDir(run_dir), "train").holder() is None


def test_watch_refuses_a_folder_that_is_no_run_and_leaves_nothing(tmp_path, capsys) -> None:
    folder = tmp_path / "not-a-run"
    folder.mkdir()
    assert main(["eval", "--watch", str(folder), "--device", "cpu"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{folder} is not a primal-dt run directory" in line
    assert list(folder.iterdir()) == []


def _sleep_as_evaluator(parent: int) -> None:
    from primal_dt.evaluation.service import die_with_parent

    die_with_parent(parent)
    time.sleep(120)


def _parent_of_an_evaluator(pids) -> None:
    child = multiprocessing.get_context("spawn").Process(
        target=_sleep_as_evaluator, args=(os.getpid(),)
    )
    child.start()
    pids.put(child.pid)
    time.sleep(120)


def test_the_evaluation_process_dies_with_its_trainer() -> None:
    """A trainer killed with SIGKILL takes its evaluation process with it at once, so no orphan
    appends a result to the run a new trainer resumes."""
    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    parent = context.Process(target=_parent_of_an_evaluator, args=(pids,))
    parent.start()
    child = pids.get(timeout=60)
    time.sleep(1.0)  # the child has set its parent-death signal
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_the_evaluation_process_yields_the_cpu() -> None:
    code = "import os; from primal_dt.common.cpu import yield_cpu; yield_cpu(); print(os.nice(0))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "19", result.stderr


def test_a_resume_after_the_checkpoint_prints_each_result_once(minari_root, tmp_path) -> None:
    """Resumed from an earlier checkpoint (as after a SIGKILL), the results recorded after it are
    dropped, made again and printed once; the final table is printed."""
    run_dir = tmp_path / "run"
    assert (
        main(
            train_args(
                run_dir,
                20,
                "train.eval_every=10",
                "train.ckpt_every=10",
                "eval.episodes=1",
                "eval.final_episodes=1",
            )
        )
        == 0
    )
    shutil.copy(run_dir / "checkpoints" / "step_00000010.pt", run_dir / "ckpt.pt")
    process = start(["train", "--resume", str(run_dir), "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert output.count("step 20: final evaluation over 1 episodes") == 1, output
    # Recorded after the checkpoint of step 10 was saved, so it may not have been printed: once.
    assert output.count("step 10: evaluation over") == 1, output
    assert [(r.step, r.final) for r in read_results(RunDir(run_dir))] == [(10, False), (20, True)]
    assert "3600.0" in output  # the final table


def test_a_final_evaluation_still_queued_is_waited_for_on_resume(minari_root, tmp_path) -> None:
    """Stopped while its final snapshot waited in the queue: --resume evaluates it, prints the
    table, and fails (exit 1) if that evaluation fails."""
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10, "eval.final_episodes=1")) == 0
    run = RunDir(run_dir)
    snapshot = read_snapshot(run_dir)
    write_snapshot(run.queued(10), replace(snapshot, request=EvalRequest(1, True), training=None))
    run.eval_log.unlink()  # the final record never came
    process = start(["train", "--resume", str(run_dir), "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "step 10: final evaluation over 1 episodes" in output and "3600.0" in output
    run.queued(10).write_bytes(b"not a snapshot")  # now the final evaluation fails
    run.eval_log.unlink()
    process = start(["train", "--resume", str(run_dir), "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1, output
    assert "final evaluation failed" in output


def test_compiled_runs_give_the_same_bits_and_resume_to_them(minari_root, tmp_path) -> None:
    """train.compile (the whole step as one graph) under the automatic threads: the same command
    twice ends with the same weights and losses, and so does a run stopped halfway and resumed
    (its optimiser's step counts and schedule saved as the compiled steps left them)."""
    # One Primal block (and the embeddings whose backward scattered atomically): fewer kernels.
    one_block = ("model.n_layer=1", 'model.attention=["primal"]')
    compiled = ("train.compile=true", "train.ckpt_every=5", BF16, *one_block)

    def run(run_dir: Path, steps: int) -> None:
        process = start(train_args(run_dir, steps, *compiled))
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output

    run(tmp_path / "a", 30)
    run(tmp_path / "b", 30)
    assert_same(tmp_path / "a", tmp_path / "b")
    run(tmp_path / "c", 15)
    process = start(["train", "--resume", str(tmp_path / "c"), "--steps", "30", "--no-progress"])
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    assert_same(tmp_path / "a", tmp_path / "c")


def test_the_serving_loop_evaluates_once_more_after_finish_and_stops_without_its_parent() -> None:
    """serve_until: a snapshot queued just before the trainer sets `finish` is still evaluated
    (one round with finishing=True, then return); with its parent gone it evaluates nothing."""
    from primal_dt.evaluation.service import serve_until

    finish = threading.Event()
    rounds: list[bool] = []

    def evaluate(finishing: bool) -> None:
        rounds.append(finishing)
        if len(rounds) == 3:
            finish.set()

    serve_until(finish, os.getppid(), evaluate, poll_seconds=0.0)
    assert rounds == [False, False, False, True]
    rounds.clear()
    serve_until(threading.Event(), os.getppid() + 1, evaluate, poll_seconds=0.0)
    assert rounds == []
