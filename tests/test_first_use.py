"""The bad inputs a new user types, each one true line with its fix, and a start that fails leaves
nothing behind (docs/errors.md's promises, walked)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import train_args

from primal_dt.cli import main
from primal_dt.data.sources import BUNDLED_ROOT
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.locks import RunLock
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The error a command printed: one line, no traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.startswith("primal-dt: error: "), err
    return line


def test_a_batch_that_cannot_fit_is_refused_before_the_run_directory(
    minari_root, tmp_path, capsys
) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 5, "train.batch_size=10000000000")) == 2
    line = one_line(capsys)
    assert (
        "train.batch_size=10000000000 needs at least" in line and "lower train.batch_size" in line
    )
    assert not run_dir.exists()


def test_a_start_that_fails_in_its_first_steps_leaves_nothing(
    minari_root, tmp_path, capsys, monkeypatch
) -> None:
    def out_of_memory(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"
        )

    monkeypatch.setattr("primal_dt.training.trainer.Trainer.train_step", out_of_memory)
    made_here = tmp_path / "new"
    assert main(train_args(made_here, 5)) == 2
    line = one_line(capsys)
    assert "training ran out of memory" in line and "lower train.batch_size" in line, line
    assert not made_here.exists()
    # A folder the user made keeps what was in it, and only that.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert main(train_args(theirs, 5)) == 2
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_a_start_killed_before_its_first_checkpoint_is_named_and_cleared(
    minari_root, tmp_path, capsys
) -> None:
    run_dir = tmp_path / "run"
    # A start killed at once (SIGKILL: nothing of it can clean up) before its first checkpoint.
    code = (
        "import os, sys; from primal_dt.training import trainer; "
        "trainer.Trainer.train_step = lambda *a: os._exit(137); "
        "from primal_dt.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = train_args(run_dir, 5)
    killed = subprocess.run([sys.executable, "-c", code, *args], capture_output=True)
    assert killed.returncode == 137, killed.stderr
    run = RunDir(run_dir)
    assert run.unsaved_start and list(run_dir.glob("events.out.tfevents.*"))
    lock = RunLock(run, "train")  # while a start trains, before its first checkpoint
    lock.acquire()
    try:
        assert main(["eval", "--ckpt", str(run_dir)]) == 2
        assert "has no checkpoint yet: process" in one_line(capsys)
    finally:
        lock.release()
    for command in (["eval", "--ckpt", str(run_dir)], ["train", "--resume", str(run_dir)]):
        assert main(command) == 2, command
        line = one_line(capsys)
        assert "holds a start that saved no checkpoint" in line, line
        assert f"primal-dt train --run-dir {run_dir}" in line, line
    old_events = set(run_dir.glob("events.out.tfevents.*"))
    assert main(args) == 0  # --run-dir clears it and trains
    assert "cleared an earlier start" in capsys.readouterr().err
    assert read_snapshot(run_dir).step == 5
    assert not old_events & set(run_dir.glob("events.out.tfevents.*"))


def test_a_list_value_that_is_not_toml_gets_toml_s_reason(minari_root, tmp_path, capsys) -> None:
    assert main(train_args(tmp_path / "run", 5, 'model.attention=["primal","softmax"')) == 2
    line = one_line(capsys)
    assert '--set model.attention: ["primal","softmax" is not a TOML value' in line, line
    assert "Unclosed array" in line and "unknown attention" not in line, line
    assert not (tmp_path / "run").exists()


def test_a_file_where_a_folder_is_needed_is_named_with_the_fix(
    minari_root, tmp_path, capsys
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    sweep = ["sweep", "--tasks", "hopper-medium", "--seeds", "0", "--runs-dir", str(blocker)]
    assert main(sweep) == 2
    out = capsys.readouterr()
    assert out.out == "", "the sweep printed its plan before refusing"
    assert f"--runs-dir {blocker} must be a folder; give another path" in out.err
    assert main(["report", str(tmp_path), "--out", str(blocker)]) == 2
    assert f"--out {blocker} must be a folder" in one_line(capsys)
    assert main(train_args(blocker / "sub", 5)) == 2
    line = one_line(capsys)
    assert f"--run-dir {blocker / 'sub'} must be a folder: {blocker} is a file" in line, line
    assert "disk has space" not in line
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["--env", "hopper-mediun"], "hopper-medium"),
        (["--config", "primal-td"], "primal-dt"),
        (["--set", "train.lrr=1e-3"], "train.lr"),
        (["--set", "model.attention=primall"], "primal"),
        (["--set", "model.attention_settings.primal.rnak=8"], "rank"),
        (["--set", "model.primal_blocks=lats"], "last"),
        (["--set", "train.precision=bf61"], "bf16"),
        (["--set", "train.compile_mode=reduce_overhead"], "reduce-overhead"),
        (["--set", "eval.service=proces"], "process"),
        (["--dataset", "mujoco/hopper/mediun-v0"], "mujoco/hopper/medium-v0"),
    ],
)
def test_every_misspelt_choice_gets_did_you_mean(
    minari_root, tmp_path, capsys, args, meant
) -> None:
    base = ["train", "--offline", "--device", "cpu", "--steps", "5"]
    base += ["--run-dir", str(tmp_path / "run")]
    if "--env" not in args and "--dataset" not in args:
        base += ["--env", "hopper-medium"]
    assert main(base + args) == 2
    line = one_line(capsys)
    assert f"(did you mean '{meant}'?)" in line, line
    assert not (tmp_path / "run").exists()


def test_from_takes_a_step_or_its_file_with_any_padding(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 20, "train.ckpt_every=5")) == 0
    for given in ("step_10.pt", str(run_dir / "checkpoints" / "step_10.pt"), "10"):
        assert main(["train", "--resume", str(run_dir), "--from", given, "--steps", "12"]) == 0
        assert read_snapshot(run_dir).step == 12, given
    assert main(["train", "--resume", str(run_dir), "--from", "7"]) == 2
    line = one_line(capsys)
    assert "--from takes one of" in line and "by step or file (10, 12)" in line, line


def test_the_bundled_dataset_names_policies_a_clone_has() -> None:
    metadata = BUNDLED_ROOT / "primal-dt/hopper/bundled-v0/data/metadata.json"
    provenance = json.loads(metadata.read_text())["provenance"]
    for policy in (provenance["policy"], provenance["reference"]["expert_policy"]):
        path = ROOT / policy["file"]
        assert path.is_file(), policy["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == policy["sha256"]


def test_recording_prints_lines_not_a_redrawn_bar_where_stderr_is_a_file(minari_root) -> None:
    code = (
        "import gymnasium as gym; from primal_dt.data.recording import random_policy, "
        "record_episodes; space = gym.make('Hopper-v5').action_space; "
        "record_episodes('Hopper-v5', random_policy(space, 0), steps=300, seed=0, progress=True)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    assert "Hopper-v5: step 300/300 (100%)" in done.stderr.splitlines()[-1], done.stderr


@pytest.mark.parametrize("kind", sorted(ATTENTIONS))
def test_every_kind_is_built_from_width_and_heads_alone(kind) -> None:
    layer_class = ATTENTIONS[kind]
    torch.manual_seed(0)
    layer = layer_class(32, 4)
    assert all(m.p == 0.0 for m in layer.modules() if hasattr(m, "p") and isinstance(m.p, float))
    x, mask = torch.randn(2, 9, 32), torch.ones(2, 9, dtype=torch.bool)
    layer.train()
    first, _ = layer(x, mask)
    second, _ = layer(x, mask)
    torch.testing.assert_close(first, second)  # no dropout in training mode
    if layer_class.settings_class is not None:  # the defaults are the settings class's
        from primal_dt.common.config import ModelConfig

        torch.manual_seed(0)
        configured = layer_class.from_config(
            ModelConfig(embed_dim=32, n_head=4, dropout=0.0, context_len=20),
            layer_class.settings_class(),
        )
        for (name, a), (_, b) in zip(
            layer.state_dict().items(), configured.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(a, b, msg=name)
