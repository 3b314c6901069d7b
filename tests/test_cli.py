"""train -> checkpoint -> eval through the command line, resume, and clear errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, scalars, train_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from primal_dt.cli import main
from primal_dt.common.loading import packaged_config_names
from primal_dt.data.episodes import ReferenceScores
from primal_dt.store.snapshots import read_snapshot


def test_train_then_eval_end_to_end(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    extra = (
        "train.eval_every=10",
        "eval.targets=[1800.0]",
        "train.ckpt_every=10",
        "eval.final_episodes=3",
    )
    assert main(train_args(run_dir, 20, *extra)) == 0
    out = capsys.readouterr().out
    assert "1800.0" in out and "D4RL" in out  # the test dataset has none of its own: D4RL's

    logged = scalars(run_dir)
    for tag in ("action_loss", "ksvd_loss", "loss", "lr", "grad_norm", "steps_per_sec"):
        assert [step for step, _ in logged[f"train/{tag}"]] == [5, 10, 15, 20], tag
    assert [step for step, _ in logged["eval/1800/normalized_return"]] == [10, 20]
    assert [step for step, _ in logged["eval/1800/return"]] == [10, 20]
    assert [step for step, _ in logged["eval/final_normalized_return"]] == [20]
    assert all(value > 0 for _, value in logged["train/ksvd_loss"])  # primal-dt config: last block
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")
    # The run's own Custom Scalars layout: each loss on a chart of its own, the returns per
    # target; and its task's category, filled by the copy made when the run finished.
    (config,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    assert [category.title for category in layout.category] == ["hopper-medium", "primal-dt run"]
    charts = {chart.title: list(chart.multiline.tag) for chart in layout.category[1].chart}
    assert charts["action loss"] == [r"^train/action_loss$"]
    assert charts["auxiliary loss (ksvd_loss)"] == [r"^train/ksvd_loss$"]
    tags = set(logged)
    for category in layout.category:
        for chart in category.chart:
            (regex,) = chart.multiline.tag
            assert any(re.fullmatch(regex, tag) for tag in tags), chart.title  # it has a line
    assert logged["by_task/hopper-medium/train/ksvd_loss"] == logged["train/ksvd_loss"]
    assert {t for t in tags if re.fullmatch(charts["return per target"][0], t)} == {
        "eval/1800/return"
    }

    ckpt = read_snapshot(run_dir / "ckpt.pt")
    assert ckpt.step == 20
    assert ckpt.task.env_id == "Hopper-v5"
    assert ckpt.task.reference == ReferenceScores(
        random=-20.272305,
        expert=3234.3,
        source="D4RL reference scores (Fu et al. 2020), measured on Hopper-v2: approximate for v5",
    )
    assert ckpt.config.model.block_kinds() == ["softmax", "softmax", "primal"]
    assert ckpt.config.model.embed_dim == 32
    assert ckpt.state_mean.shape == (11,)

    # A fresh process evaluating the final checkpoint with the run's seed and the final
    # evaluation's episodes gets the numbers logged during training.
    fresh = subprocess.run(
        [
            sys.executable,
            "-m",
            "primal_dt.cli",
            "eval",
            "--ckpt",
            str(run_dir),
            "--episodes",
            "3",
            "--device",
            DEVICE,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    (record,) = json.loads(fresh.stdout)
    assert record["task"] == "hopper-medium" and record["step"] == 20 and record["seed"] == 0
    (result,) = record["results"]
    assert result["target"] == 1800.0 and result["episodes"] == 3
    for key in ("return_mean", "return_std", "normalized_mean", "normalized_std"):
        assert isinstance(result[key], float)
    logged_record = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(r["step"], r["episodes"], r["final"]) for r in logged_record] == [
        (10, 2, False),
        (20, 3, True),
    ]
    assert record["results"] == logged_record[-1]["results"]
    assert record["score"] == result["normalized_mean"]  # the first target's (target_score)
    assert result["return_mean"] == pytest.approx(logged["eval/1800/return"][-1][1], rel=1e-6)

    assert main(["eval", "--ckpt", str(run_dir / "ckpt.pt"), "--episodes", "1"]) == 0
    table = capsys.readouterr().out
    assert "normalized" in table and "reference scores" in table and "1800.0" in table


def test_resume_continues_exactly_where_the_run_stopped(minari_root, tmp_path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(train_args(straight, 30)) == 0
    assert main(train_args(resumed, 15)) == 0
    assert read_snapshot(resumed).step == 15
    # A run is resumed from its directory or, as here, from its ckpt.pt.
    resume = ["train", "--resume", str(resumed / "ckpt.pt"), "--steps", "30", "--no-progress"]
    assert main(resume) == 0
    a, b = read_snapshot(straight), read_snapshot(resumed)
    assert b.step == 30
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name
    assert scalars(straight)["train/action_loss"] == scalars(resumed)["train/action_loss"]


def test_errors_are_one_line_and_the_console_script_has_no_traceback(
    minari_root, tmp_path, capsys
) -> None:
    cases = {
        ("train", "--env", "halfcheetah-mediocre"): "unknown task 'halfcheetah-mediocre'",
        ("train", "--env", "halfcheeta-medium"): "(did you mean 'halfcheetah-medium'?)",
        ("train", "--env", "hopper-medium", "--config", "primal_dt"): "(did you mean 'primal-dt'?)",
        ("train", "--env", "hopper-medium", "--set", "train.lrr=1"): "(did you mean 'train.lr'?)",
        ("train", "--env", "walker2d-medium", "--offline"): "mujoco/walker2d/medium-v0 not found",
        ("train", "--env", "hopper-medium", "--set", "train.nope=1"): "unknown config key",
        ("train", "--env", "hopper-medium", "--set", "train.lr=fast"): "train.lr must be a number",
        ("train", "--env", "hopper-medium", "--set", "model.n_head=3"): "divisible",
        ("train", "--env", "hopper-medium", "--set", "lr"): "--set expects key=value",
        ("eval", "--ckpt", str(tmp_path / "nothing.pt")): "does not exist",
        ("eval", "--ckpt", str(tmp_path)): "not a primal-dt run directory",
        ("eval", "--ckpt", str(tmp_path), "--episodes", "0"): "--episodes must be > 0",
    }
    if not torch.cuda.is_available():  # the error names the option that asked for CUDA
        cases[("eval", "--ckpt", str(tmp_path), "--device", "cuda")] = (
            "--device is cuda but no CUDA"
        )
    for args, message in cases.items():
        assert main(list(args)) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("primal-dt: error: "), (args, lines)
        assert message in lines[-1], (args, lines[-1])

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == "primal-dt 0.1.0"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    usage = capsys.readouterr().out
    assert "train.steps, default 100000" in usage and "hopper-bundled" in usage
    listed = " ".join(usage.split())  # argparse wraps the help
    assert f"configs: {', '.join(packaged_config_names())}" in listed, listed

    # The console script itself: one line, its exit status, and no traceback.
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    result = subprocess.run(
        [sys.executable, "-m", "primal_dt.cli", "eval", "--ckpt", str(corrupt)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("primal-dt: error: ") and "is not a checkpoint at all" in line


def test_a_run_directory_is_never_overwritten(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 5)) == 0
    before = (run_dir / "ckpt.pt").read_bytes()
    assert main(train_args(run_dir, 5)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run_dir / "ckpt.pt").read_bytes() == before
