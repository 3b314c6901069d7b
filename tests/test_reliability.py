"""Never lose a run, never execute a checkpoint, reject bad input clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import TINY, policy_file, train_args

from primal_dt.cli import main
from primal_dt.data.recording import random_policy, record_episodes, write_dataset
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot, write_snapshot


def test_sigterm_saves_and_says_how_to_resume(minari_root, tmp_path) -> None:
    """The message and exit status of a stop by signal; that the resumed run ends bit-identical
    to an uninterrupted one, after any number of stops, is test_reproducibility's."""
    steps = 1500
    killed = tmp_path / "killed"
    args = train_args(killed, steps, "train.ckpt_every=100000")
    process = subprocess.Popen(
        [sys.executable, "-m", "primal_dt.cli", *args], stderr=subprocess.PIPE, text=True
    )
    lines = []
    for line in process.stderr:  # training starts right after this line
        lines.append(line)
        if line.startswith("run directory:"):
            break
    time.sleep(1.0)  # into the training loop (a signal before it would stop at step 1)
    process.send_signal(signal.SIGTERM)
    lines += process.stderr.readlines()
    assert process.wait(timeout=60) == 128 + signal.SIGTERM, "".join(lines)
    message = lines[-1]
    assert message.startswith("primal-dt: stopped: ")  # a requested stop, not an error
    assert "stopped by SIGTERM" in message and f"primal-dt train --resume {killed}" in message
    stopped_at = read_snapshot(killed).step
    assert 0 < stopped_at < steps, "the signal came too late to test an interruption"
    assert main(["train", "--resume", str(killed), "--steps", str(stopped_at + 5)]) == 0
    assert read_snapshot(killed).step == stopped_at + 5


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_crafted_to_run_code_is_refused(tmp_path, capsys) -> None:
    marker = tmp_path / "code-ran"
    crafted = tmp_path / "ckpt.pt"
    torch.save({"format": "primal-dt-checkpoint", "version": 1, "x": _RunsCode(marker)}, crafted)
    assert main(["eval", "--ckpt", str(crafted)]) == 2
    err = capsys.readouterr().err
    assert "holds objects other than tensors and plain values" in err and "weights_only" not in err
    assert not marker.exists()


def test_bad_checkpoints_are_refused_and_left_as_they_were(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10)) == 0
    capsys.readouterr()
    good = (run_dir / "ckpt.pt").read_bytes()

    truncated = tmp_path / "truncated" / "ckpt.pt"
    truncated.parent.mkdir()
    truncated.write_bytes(good[: len(good) // 2])
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    ckpt = read_snapshot(run_dir)
    ckpt.task.env_id = "HalfCheetah-v5"
    other_env = tmp_path / "other-env.pt"
    write_snapshot(other_env, ckpt)

    cases = [
        (["eval", "--ckpt", str(truncated)], "is damaged (truncated or corrupt"),
        (["train", "--resume", str(truncated.parent)], "is damaged (truncated or corrupt"),
        (["eval", "--ckpt", str(foreign)], "not a primal-dt checkpoint"),
        (["eval", "--ckpt", str(other_env)], "states/actions of size 11/3"),
        (["train", "--resume", str(tmp_path)], "not a primal-dt run directory"),
        (["train", "--resume", str(run_dir)], "has trained all its 10 steps; pass --steps N"),
        (["train", "--resume", str(run_dir), "--steps", "5"], "--steps 5 is before"),
    ]
    for args, expected in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (args, err)
    assert (run_dir / "ckpt.pt").read_bytes() == good
    assert truncated.read_bytes() == good[: len(good) // 2]


def test_keeps_the_last_checkpoints_and_the_best(minari_root, tmp_path) -> None:
    run_dir = tmp_path / "run"
    extra = ("train.ckpt_every=5", "train.keep_checkpoints=2", "train.eval_every=10")
    assert main(train_args(run_dir, 20, *extra)) == 0
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["step_00000015.pt", "step_00000020.pt"]
    assert read_snapshot(run_dir / "checkpoints" / "step_00000015.pt").step == 15
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    best = max(records, key=lambda r: r["score"])
    assert read_snapshot(run_dir / "best.pt").step == best["step"]


def test_a_diverging_run_stops_without_saving(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    extra = ("train.lr=1e30", "train.warmup_steps=0", "train.grad_clip=1e30")
    assert main(train_args(run_dir, 20, *extra)) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "training diverged" in message and "no checkpoint had been saved yet" in message
    assert not (run_dir / "ckpt.pt").exists()


def test_datasets_with_bad_values_are_refused(minari_root, tmp_path, capsys) -> None:
    hopper = "Hopper-v5"
    buffers = record_episodes(hopper, random_policy(gym.make(hopper).action_space, 0), 2, seed=0)
    buffers[1].observations[3, 2] = np.nan
    write_dataset("test/hopper/nan-v0", hopper, buffers)
    args = ["train", "--dataset", "test/hopper/nan-v0", "--offline", "--run-dir", str(tmp_path)]
    assert main(args) == 2
    message = capsys.readouterr().err.strip()
    assert "test/hopper/nan-v0" in message and "NaN or infinite observations" in message
    assert not any(tmp_path.iterdir())


def test_config_values_out_of_range_are_refused(minari_root, tmp_path, capsys) -> None:
    cases = {
        "train.steps=-5": "train.steps must be > 0",
        "model.dropout=1.5": "model.dropout must be in [0, 1)",
        # The older form, beside the default config's list of kinds:
        "model.primal_blocks=[7]": "model.primal_blocks (its older form) must be left out",
        'model.attention="perfomer"': "unknown attention 'perfomer' (did you mean 'performer'?)",
        "model.attention_settings.primal.rank=0": "attention_settings.primal.rank must be > 0",
        'model.attention_settings.primal.rank="8"': "primal.rank must be an integer, got '8'",
        "model.attention_settings.performer.features=8": "performer: no block uses performer",
        "model.primal_init='xavier'": "primal.init must be one of per-head, public, got 'xavier'",
        "train.device='tpu'": "train.device must be",
        "data.download=3": "data.download must be true or false",
    }
    if not torch.cuda.is_available():  # each names the setting that asked for CUDA
        cases["train.device='cuda'"] = "train.device is cuda but no CUDA device is available"
        cases["eval.device='cuda'"] = "eval.device is cuda but no CUDA device is available"
    for setting, expected in cases.items():
        args = ["train", "--env", "hopper-medium", "--run-dir", str(tmp_path / "x")]
        assert main([*args, "--set", setting]) == 2, setting
        assert expected in capsys.readouterr().err, setting
    assert not (tmp_path / "x").exists()


def test_empty_datasets_and_datasets_that_do_not_fit_their_env_are_refused(
    minari_root, tmp_path, capsys
) -> None:
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    steps = 5
    wrong_size = EpisodeBuffer(
        id=0,
        observations=np.zeros((steps + 1, 5)),
        actions=np.zeros((steps, 3), dtype=np.float32),
        rewards=np.zeros(steps),
        terminations=np.zeros(steps, dtype=bool),
        truncations=np.zeros(steps, dtype=bool),
    )
    env = gym.make("Hopper-v5")
    minari.create_dataset_from_buffers(
        "test/hopper/wrong-size-v0",
        [wrong_size],
        env=env,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (5,)),
        action_space=env.action_space,
        ref_min_score=0.0,
        ref_max_score=1.0,
    )
    minari.create_dataset_from_buffers(
        "test/hopper/empty-v0", [], env=env, ref_min_score=0.0, ref_max_score=1.0
    )
    cases = {
        "test/hopper/wrong-size-v0": "shape (5,)/(3,) but its environment Hopper-v5 has (11,)/(3,)",
        "test/hopper/empty-v0": "has no episodes",
    }
    for dataset_id, expected in cases.items():
        args = ["train", "--dataset", dataset_id, "--offline", "--run-dir", str(tmp_path / "x")]
        assert main(args) == 2, dataset_id
        assert expected in capsys.readouterr().err, dataset_id
    assert not (tmp_path / "x").exists()


def test_divergence_keeps_the_last_good_checkpoint(minari_root, tmp_path) -> None:
    from conftest import TINY

    from primal_dt.common.loading import load_config
    from primal_dt.data.tasks import resolve_task
    from primal_dt.training.launch import start_run
    from primal_dt.training.trainer import TrainingDiverged

    config = load_config(
        None, [*TINY, "train.steps=10", "train.ckpt_every=5", "train.device='cpu'"]
    )
    trainer = start_run(config, resolve_task("hopper-medium"), tmp_path / "run")
    trainer.train(progress=False)
    good = (tmp_path / "run" / "ckpt.pt").read_bytes()
    trainer.config.train.steps = 20
    trainer.config.train.grad_clip = 1e30
    trainer.scheduler.base_lrs = [1e30]  # blow the run up from here on
    with pytest.raises(TrainingDiverged, match="the last good checkpoint, .*ckpt.pt, is kept"):
        trainer.train(progress=False)
    assert (tmp_path / "run" / "ckpt.pt").read_bytes() == good
    assert read_snapshot(tmp_path / "run").step == 10


def test_a_run_directory_has_one_writer_and_a_killed_one_leaves_no_lock(
    minari_root, tmp_path
) -> None:
    run_dir = tmp_path / "run"
    args = train_args(run_dir, 100_000, "train.ckpt_every=5", "eval.final_episodes=1")
    writer = subprocess.Popen(
        [sys.executable, "-m", "primal_dt.cli", *args], stderr=subprocess.PIPE, text=True
    )
    try:
        for line in writer.stderr:
            if line.startswith("run directory:"):
                break
        deadline = time.monotonic() + 60
        while not (run_dir / "ckpt.pt").exists():
            assert time.monotonic() < deadline and writer.poll() is None, "no checkpoint"
            time.sleep(0.2)
        busy = f"{run_dir} is in use: process {writer.pid} is its"
        for second in (
            ["train", "--resume", str(run_dir), "--no-progress"],
            train_args(run_dir, 10),  # a new run in the same directory
            ["eval", "--watch", str(run_dir), "--device", "cpu"],
        ):
            result = subprocess.run(
                [sys.executable, "-m", "primal_dt.cli", *second], capture_output=True, text=True
            )
            assert result.returncode == 2, result.stderr
            (line,) = result.stderr.strip().splitlines()
            assert (
                busy in line and ("train writer" if second[0] == "train" else "eval writer") in line
            )
        assert writer.poll() is None  # the first writer goes on undisturbed
    finally:
        writer.kill()
        writer.wait()
    # SIGKILL: the OS released the locks; what an atomic write left half-done is removed.
    stale = run_dir / ".ckpt.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    step = read_snapshot(run_dir).step
    resume = ["train", "--resume", str(run_dir), "--steps", str(step + 5), "--no-progress"]
    assert main(resume) == 0
    assert read_snapshot(run_dir).step == step + 5
    assert not stale.exists()


def test_bad_values_give_one_line_and_write_nothing(minari_root, tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cases = [
        (["--seed", "-1"], "train.seed must be in 0..4294967295, got -1"),
        (["--seed", "4294967296"], "train.seed must be in 0..4294967295"),
        (["--set", "train.lr=nan"], "train.lr must be a finite number, got nan"),
        (["--set", "train.lr=inf"], "train.lr must be a finite number, got inf"),
        (["--set", "eval.targets=[1800.0, nan]"], "eval.targets must be a finite number"),
    ]
    for extra, expected in cases:
        assert main(train_args(tmp_path / "x", 5) + extra) == 2, extra
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("primal-dt: error: ") and expected in line, (extra, line)
    assert not (tmp_path / "x").exists()
    # A run directory that cannot be made (here: inside a file) is one line naming the path.
    assert main(train_args(blocker / "run", 5)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("primal-dt: error: ") and str(blocker) in line
    assert main(["eval", "--ckpt", str(tmp_path), "--targets", "nan"]) == 2
    assert "--targets must be finite returns" in capsys.readouterr().err


def test_files_follow_the_umask(minari_root, tmp_path) -> None:
    previous = os.umask(0o022)
    try:
        assert main(train_args(tmp_path / "run", 5, "train.ckpt_every=5")) == 0
    finally:
        os.umask(previous)
    for name in ("ckpt.pt", "config.json", "checkpoints/step_00000005.pt"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o644, name


def test_a_behaviour_policy_for_another_environment_names_both_spaces(minari_root, capsys) -> None:
    walker = policy_file("sac", "Walker2d-v5")
    args = [
        "datasets",
        "make",
        "--env",
        "hopper",
        "--recipe",
        "policy",
        "--name",
        "wrong",
        "--policy",
        str(walker),
        "--steps",
        "10",
        "--no-progress",
    ]
    assert main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        f"{walker} is a policy for observations of shape (17,) and actions of shape (6,), but "
        f"Hopper-v5 has observations of shape (11,) and actions of shape (3,)" in line
    ), line
    assert not (minari_root / "primal-dt" / "hopper" / "wrong-v0").exists()


def test_a_misspelt_recipe_gets_did_you_mean(minari_root, capsys) -> None:
    assert main(["datasets", "make", "--env", "hopper", "--recipe", "polcy"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown recipe 'polcy' (did you mean 'policy'?)" in line, line
    assert main(["datasets", "make", "--env", "hoper", "--recipe", "policy"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown env 'hoper' (did you mean 'hopper'?)" in line, line


def test_bad_seeds_of_eval_and_sweep_are_one_line(minari_root, tmp_path, capsys) -> None:
    cases = [
        (["eval", "--ckpt", str(tmp_path), "--seed", "-1"], "--seed must be in 0..4294967295"),
        (
            ["sweep", "--tasks", "hopper-medium", "--seeds", "-1,2", "--runs-dir", str(tmp_path)],
            "--seeds must be in 0..4294967295, got -1",
        ),
        (
            ["sweep", "--tasks", "hopper-medium", "--seeds", "1,-2", "--runs-dir", str(tmp_path)],
            "--seeds must be in 0..4294967295, got -2",
        ),
    ]
    for args, expected in cases:
        assert main(args) == 2, args
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("primal-dt: error: ") and expected in line, (args, line)
    assert not any(tmp_path.iterdir())


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_resuming_after_config_json_was_edited_names_the_settings(
    minari_root, tmp_path, capsys
) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 5)) == 0
    started = json.loads((run_dir / "config.json").read_text())
    edited = {
        **started,
        "model": {**started["model"], "embed_dim": 48},
        "train": {**started["train"], "lr": 0.5},
    }
    (run_dir / "config.json").write_text(json.dumps(edited))
    before = files_of(run_dir)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "10", "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{run_dir / 'config.json'} differs from the settings" in line, line
    embed = started["model"]["embed_dim"]
    assert f"model.embed_dim ({embed} in the checkpoint, 48 in config.json)" in line, line
    assert "train.lr (" in line and "put config.json back" in line, line
    assert files_of(run_dir) == before
    # Put back, it resumes; --steps (train.steps) differs from config.json and is no edit.
    (run_dir / "config.json").write_text(json.dumps(started))
    assert main(["train", "--resume", str(run_dir), "--steps", "10", "--no-progress"]) == 0
    assert read_snapshot(run_dir).step == 10


def test_rolling_an_extended_run_back_says_how_far_it_trains(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10, "train.ckpt_every=5")) == 0
    assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 0
    capsys.readouterr()
    step_5 = run_dir / "checkpoints" / "step_00000005.pt"
    assert main(["train", "--resume", str(run_dir), "--from", str(step_5), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert (
        "rolled back to step 5: what the run did after it is dropped; it trains to step 10, the "
        "length that checkpoint was saved with (the run had since been extended to 15 steps: "
        "pass --steps 15 to train as far)" in err
    ), err
    assert read_snapshot(run_dir).step == 10


def test_resuming_a_run_whose_ckpt_is_damaged_gives_the_command_that_works(
    minari_root, tmp_path, capsys
) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10, "train.ckpt_every=5")) == 0
    ckpt = run_dir / "ckpt.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    command = line.split("to continue from the newest of them: ")[-1]
    step_10 = run_dir / "checkpoints" / "step_00000010.pt"
    assert command == f"primal-dt train --resume {run_dir} --from {step_10}", line
    assert main([*command.split()[1:], "--steps", "15", "--no-progress"]) == 0
    assert read_snapshot(run_dir).step == 15


@pytest.mark.parametrize(
    ("layer", "arguments", "said"),
    [
        ("primal", (30, 4, 8, 0.1), "embed_dim (30) must be divisible by n_head (4)"),
        ("primal", (32, 4, 0, 0.1), "rank must be positive, got 0"),
        ("primal", (32, 4, 8, 0.1, "perhead"), "got 'perhead' (did you mean 'per-head'?)"),
        ("primal", (32, 4, 8, 1.5), "dropout must be in [0, 1), got 1.5"),
        ("softmax", (30, 4, 0.1), "embed_dim (30) must be divisible by n_head (4)"),
    ],
)
def test_the_attention_layers_check_their_arguments_when_built(layer, arguments, said) -> None:
    from primal_dt.method.attention import PrimalAttention, SoftmaxAttention

    with pytest.raises(
        ValueError, match="^" + ("PrimalAttention" if layer == "primal" else "SoftmaxAttention")
    ) as raised:
        (PrimalAttention if layer == "primal" else SoftmaxAttention)(*arguments)
    assert said in str(raised.value)


def test_eval_of_a_finished_run_repeats_its_final_evaluation(minari_root, tmp_path, capsys) -> None:
    """Without --episodes, `eval --ckpt RUN` takes the run's final-evaluation settings for the
    checkpoint of its last step, so it prints the numbers its final evaluation logged."""
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10, "eval.final_episodes=3", "eval.episodes=2")) == 0
    (final,) = read_results(RunDir(run_dir))
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(run_dir), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["episodes"] == 3 == final.episodes
    assert [(s["target"], s["return_mean"]) for s in record["results"]] == [
        (s.target, s.return_mean) for s in final.results
    ]


def test_sweep_takes_the_final_episodes_of_its_runs(minari_root, tmp_path) -> None:
    runs = tmp_path / "runs"
    args = [
        "sweep",
        "--tasks",
        "hopper-medium",
        "--seeds",
        "0",
        "--configs",
        "dt",
        "--runs-dir",
        str(runs),
        "--steps",
        "5",
        "--final-episodes",
        "2",
        "--device",
        "cpu",
        "--offline",
    ]
    for setting in TINY:
        if not setting.startswith("eval.final_episodes"):
            args += ["--set", setting]
    assert main(args) == 0
    (record,) = read_results(RunDir(runs / "hopper-medium" / "dt-s0"))
    assert record.final and record.episodes == 2
