"""primal-dt sweep and report: a tiny grid trains, resumes without redoing finished runs, and is
reported; the train command lines a sweep builds parse back with the CLI's parser; the threads a
local run gets; the attention spectrum against numpy's SVD; the same sweep as Ray tasks."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, scalars
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from primal_dt.cli import build_parser, main
from primal_dt.common.loading import load_config, named_config_path
from primal_dt.evaluation.spectrum import cumulative_spectrum, mean_cumulative_spectrum, rank_at
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot
from primal_dt.tools.grid import GridCell, SweepError, SweepOptions, command, plan
from primal_dt.tools.report_tables import markdown_table
from primal_dt.tools.runs import collect, group
from primal_dt.tools.sweep import local_thread_env, ray_gpus, sweep_lock

# Every run: 10 steps of a tiny model, then a final evaluation of one episode.
SETTINGS = (*TINY, "eval.final_episodes=1", "eval.targets=[1800.0]")
GRID = [
    f"{task}/{config}-s{seed}"
    for seed in (0, 1)
    for task in ("hopper-medium", "hopper-expert")
    for config in ("dt", "primal-dt")
]


def sweep_args(runs: Path, tasks: str, seeds: str, configs: str, *extra: str) -> list[str]:
    args = [
        "sweep",
        "--tasks",
        tasks,
        "--seeds",
        seeds,
        "--configs",
        configs,
        "--runs-dir",
        str(runs),
        "--steps",
        "10",
        "--device",
        "cpu",
        "--offline",
        *extra,
    ]
    for setting in SETTINGS:
        args += ["--set", setting]
    return args


def test_spectrum_matches_numpy_svd() -> None:
    rng = np.random.default_rng(0)
    left, _ = np.linalg.qr(rng.standard_normal((7, 4)))
    right, _ = np.linalg.qr(rng.standard_normal((5, 4)))
    sigma = np.array([4.0, 2.0, 1.0, 0.5])
    matrix = left @ np.diag(sigma) @ right.T  # 7 x 5, rank 4, singular values known
    expected = np.cumsum(sigma) / sigma.sum()
    numpy_sigma = np.linalg.svd(matrix, compute_uv=False)
    np.testing.assert_allclose(np.cumsum(numpy_sigma) / numpy_sigma.sum(), [*expected, 1.0])
    got = cumulative_spectrum(torch.tensor(matrix, dtype=torch.float32))
    np.testing.assert_allclose(got.numpy(), [*expected, 1.0], atol=1e-6)
    assert rank_at(got) == 3 and rank_at(got, 0.5) == 1  # 7/7.5 >= 0.9; 4/7.5 >= 0.5

    # Windows: padded tokens are left out, and a shorter window's curve stays at 1 beyond its end.
    outputs = torch.randn(3, 6, 4)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, :4] = False  # two real tokens, left-padded
    curves = []
    for window, real in zip(outputs.numpy(), mask.numpy(), strict=True):
        s = np.linalg.svd(window[real], compute_uv=False)
        curves.append(np.pad(np.cumsum(s) / s.sum(), (0, 4 - len(s)), constant_values=1.0))
    np.testing.assert_allclose(
        mean_cumulative_spectrum(outputs, mask).numpy(), np.mean(curves, axis=0), atol=1e-6
    )


def test_train_command_lines_parse_back(tmp_path) -> None:
    """The sweep's `primal-dt train` command lines, parsed by the CLI's own parser, give back the
    cell: a start its task, config, run directory and every --set override (the steps among them);
    a resume its run directory and steps."""
    options = SweepOptions(
        ["hopper-medium"],
        [3],
        ["dt"],
        runs_dir=tmp_path / "runs",
        steps=10,
        device="cpu",
        offline=True,
        overrides=list(SETTINGS),
    )
    (cell,) = plan(options)
    run_dir = str((tmp_path / "runs").resolve() / "hopper-medium" / "dt-s3")
    prefix = [sys.executable, "-m", "primal_dt.cli"]

    start = command(cell, options)
    assert cell.action == "start" and start[:3] == prefix
    args = build_parser().parse_args(start[3:])
    assert args.command == "train" and args.resume is None and args.no_progress
    assert (args.env, args.config, args.run_dir) == ("hopper-medium", "dt", run_dir)
    assert args.set == [
        *SETTINGS,
        "train.steps=10",
        "train.seed=3",
        'train.device="cpu"',
        "data.download=false",
    ]
    config = load_config(named_config_path(args.config), args.set, task=args.env)
    assert (config.train.steps, config.train.seed, config.train.device) == (10, 3, "cpu")
    assert config.model.embed_dim == 32 and config.eval.targets == [1800.0]

    for action in ("resume", "evaluate"):  # evaluate: a resume that only does the final evaluation
        resume = command(replace(cell, action=action), options)
        assert resume[:3] == prefix
        args = build_parser().parse_args(resume[3:])
        assert (args.command, args.resume, args.steps) == ("train", [run_dir], 10)
        assert args.offline and args.no_progress and args.env is None and args.set is None


def test_threads_of_a_local_run() -> None:
    """Runs sharing this machine split its cores evenly: --parallel P on C cores gives each run
    C // P threads, and never fewer than one."""
    assert local_thread_env(1, cores=8) == {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8"}
    threads = [local_thread_env(parallel, cores=8)["OMP_NUM_THREADS"] for parallel in (2, 3, 8, 16)]
    assert threads == ["4", "2", "1", "1"]
    assert local_thread_env(3, cores=2) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def test_sweep_resumes_and_reports(minari_root, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    # One cell was interrupted at step 5 of 10; another holds what a failed start left behind.
    partial = runs / "hopper-medium" / "dt-s0"
    train = [
        "train",
        "--env",
        "hopper-medium",
        "--config",
        "dt",
        "--seed",
        "0",
        "--run-dir",
        str(partial),
        "--steps",
        "5",
        "--device",
        "cpu",
        "--offline",
        "--no-progress",
    ]
    for setting in SETTINGS:
        train += ["--set", setting]
    assert main(train) == 0
    stale = runs / "hopper-expert" / "primal-dt-s1"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    (stale / "stale.txt").write_text("left by a start that failed")
    capsys.readouterr()

    grid = sweep_args(runs, "hopper-medium,hopper-expert", "0,1", "dt,primal-dt")
    assert main([*grid, "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "8 runs" in out and "1 to resume, 7 to start" in out, out
    assert "hopper-medium/dt-s0: resume from step 5" in out
    assert sum(line.startswith("done ") for line in out.splitlines()) == 8, out
    for name in GRID:
        run_dir = runs / name
        assert read_snapshot(run_dir).step == 10, name
        finals = [r for r in read_results(RunDir(run_dir)) if r.final]
        assert finals[-1].step == 10 and finals[-1].episodes == 1, name
        assert (run_dir / "train.log").stat().st_size > 0
        assert (run_dir / "spectrum_windows.pt").exists()  # made by the evaluator
    assert not (stale / "stale.txt").exists()  # cleaned, then trained like the others

    # The evaluator logged each block's spectrum as an image at the evaluated step, and the run's
    # curves were copied under per-task tags for the Custom Scalars layout written into runs/.
    events = EventAccumulator(
        str(runs / "hopper-expert" / "primal-dt-s0"), size_guidance={"images": 0}
    )
    events.Reload()
    assert {"spectrum/block_0", "spectrum/block_1"} <= set(events.Tags()["images"])
    assert [e.step for e in events.Images("spectrum/block_1")] == [10]
    logged = scalars(runs / "hopper-expert" / "primal-dt-s0")
    assert logged["by_task/hopper-expert/train/ksvd_loss"] == logged["train/ksvd_loss"]
    assert logged["by_task/hopper-expert/eval/1800/normalized_return"][-1][0] == 10
    assert [s for s, _ in logged["spectrum/block_1/rank_90"]] == [10]
    # Each run's layout carries its task's category (TensorBoard merges them over runs); the
    # runs directory itself holds no event file, which TensorBoard would list as a run ".".
    assert not list(runs.glob("events.out.tfevents*"))
    for task in ("hopper-expert", "hopper-medium"):
        run = EventAccumulator(str(runs / task / "primal-dt-s0"))
        run.Reload()
        (config,) = run.Tensors("custom_scalars__config__")
        layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
        assert [c.title for c in layout.category] == [task, "primal-dt run"]
        regexes = [c.multiline.tag[0] for c in layout.category[0].chart]
        assert regexes == [
            f"^by_task/{task}/eval/.*/normalized_return$",
            f"^by_task/{task}/train/(?!action_loss$)\\w+_loss$",
        ]
        copied = set(scalars(runs / task / "primal-dt-s0"))
        for regex in regexes:  # each chart of the task's category has a line
            assert any(re.fullmatch(regex, tag) for tag in copied), regex

    # Run again: finished runs are skipped; a run killed during its final evaluation is only
    # evaluated; nothing is trained again.
    ckpts = {name: (runs / name / "ckpt.pt").stat().st_mtime_ns for name in GRID}
    lost = runs / "hopper-expert" / "primal-dt-s1" / "eval.jsonl"
    lines = lost.read_text().splitlines()
    lost.write_text("\n".join(line for line in lines if '"final": true' not in line) + "\n")
    assert main(grid) == 0
    out = capsys.readouterr().out
    assert "7 finished, 0 to resume, 0 to start, 1 to evaluate" in out, out
    assert "[1/1] hopper-expert/primal-dt-s1: final evaluation" in out
    assert {name: (runs / name / "ckpt.pt").stat().st_mtime_ns for name in GRID} == ckpts
    assert read_results(RunDir(lost.parent))[-1].final
    assert main(grid) == 0
    assert "8 finished, 0 to resume, 0 to start, 0 to evaluate" in capsys.readouterr().out

    # The same directory with other settings is refused, naming the setting.
    assert main([*grid, "--set", "train.lr=0.5"]) == 2
    assert "holds a run with train.lr = 0.0001 (the sweep asks for 0.5)" in capsys.readouterr().err

    assert main(["report", str(runs)]) == 0
    table = capsys.readouterr().out
    report = runs / "report"
    written = sorted(p.name for p in report.iterdir())
    # 2 seeds: no aggregates (they need 5), so no aggregate figures.
    assert written == [
        "curves_hopper-expert.png",
        "curves_hopper-medium.png",
        "report.csv",
        "report.json",
        "report.md",
        "runs",  # its copy of the runs as small text
        "spectrum_hopper-expert.png",
        "spectrum_hopper-medium.png",
    ]
    for png in report.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    rows = list(csv.DictReader((report / "report.csv").open()))
    assert [(r["task"], r["config"]) for r in rows] == [
        ("hopper-expert", "dt"),
        ("hopper-expert", "primal-dt"),
        ("hopper-medium", "dt"),
        ("hopper-medium", "primal-dt"),
        ("average", "dt"),
        ("average", "primal-dt"),
    ]
    for row in rows[:4]:
        assert row["seeds"] == "0 1" and row["n_final"] == "2" and "n_best" not in row
        assert row["steps"] == "10" and row["reference_source"].startswith(
            "random -20.27, expert 3,234.30: D4RL reference"
        )
        assert row["dataset_ids"] == f"mujoco/hopper/{row['task'].split('-')[1]}-v0"
        finals = [
            read_results(RunDir(runs / row["task"] / f"{row['config']}-s{s}"))[-1].score
            for s in (0, 1)
        ]
        assert float(row["final_mean"]) == pytest.approx(np.mean(finals), abs=1e-4)
    average = rows[5]
    expected = np.mean([float(r["final_mean"]) for r in rows[:4] if r["config"] == "primal-dt"])
    assert float(average["final_mean"]) == pytest.approx(expected, abs=1e-3)
    assert "| hopper-medium | dt | 0,1 |" in table and "| **average** | primal-dt |" in table
    text = (report / "report.md").read_text()
    assert "| hopper-expert | primal-dt | 2 | Primal |" in text
    assert "| hopper-expert | dt | 1 | softmax |" in text
    assert "![spectrum_hopper-medium](spectrum_hopper-medium.png)" in text

    # A run without its final evaluation is marked in its row and in the notes, not a crash.
    lost.write_text("\n".join(line for line in lines if '"final": true' not in line) + "\n")
    missing = collect(runs, skip=report, spectra=False)
    table = markdown_table(group(missing))
    assert "| hopper-expert | primal-dt | 0,1 |" in table and "(1 of 2 seeds)" in table
    assert "no final evaluation" in next(r for r in missing if r.path == lost.parent).notes


def test_sweep_and_report_errors(minari_root, tmp_path, capsys, monkeypatch) -> None:
    cases = {
        ("sweep", "--tasks", "hopper-mediocre"): "unknown task 'hopper-mediocre'",
        ("sweep", "--tasks", "hopper-medium", "--configs", "nope"): "unknown config 'nope'",
        ("sweep", "--tasks", "hopper-medium", "--seeds", "0,x"): "--seeds: 'x' is not valid",
        ("sweep", "--tasks", "hopper-medium", "--parallel", "0"): "--parallel must be >= 1",
        ("sweep", "--tasks", "hopper-medium", "--set", "train.nope=1"): "unknown config key",
        ("report", str(tmp_path)): "no runs under",
        ("report", str(tmp_path / "nothing")): "is not a directory",
    }
    for args, message in cases.items():
        assert main(list(args)) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("primal-dt: error: "), (args, err)
        assert message in err[0], (args, err)
    runs = tmp_path / "runs"
    runs.mkdir()
    with sweep_lock(runs):  # another sweep holds the runs directory
        assert main(sweep_args(runs, "hopper-medium", "0", "dt")) == 2
    assert f"another sweep (pid {os.getpid()}) is running in {runs}" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(sweep_args(tmp_path / "runs", "hopper-medium", "0", "dt", "--ray", "auto")) == 2
    assert "--ray needs Ray: pip install 'primal-dt[ray]'" in capsys.readouterr().err
    assert [path.name for path in runs.iterdir()] == [".sweep.lock"]  # no layout, no run directory


def test_gpus_per_ray_run(tmp_path) -> None:
    def gpus(devices: list[str], cluster_gpus: float, given: float | None = None) -> float:
        options = SweepOptions(
            ["hopper-medium"], [0], ["dt"], ray_address="HOST", gpus_per_run=given
        )
        cells = [
            GridCell("hopper-medium", "dt", "dt", 0, RunDir(tmp_path), 10, [], d) for d in devices
        ]
        return ray_gpus(options, cells, cluster_gpus)

    assert gpus(["cpu"], 0) == gpus(["auto"], 0) == gpus(["cpu", "cpu"], 4) == 0
    assert gpus(["auto"], 4) == gpus(["cpu", "cuda:1"], 4) == gpus(["cuda"], 1) == 0.25
    assert gpus(["auto"], 4, 1.0) == 1 and gpus(["cuda"], 4, 0.0) == 0  # kept as given
    refusals = {
        (("cpu",), 0, 0.5): "the Ray cluster at HOST has 0 GPUs but --gpus-per-run asks for 0.5 "
        "per run; leave it out to train on CPUs",
        (("auto",), 2, 3.0): "has 2 GPUs but --gpus-per-run asks for 3 per run; give at most 2",
        (("cuda",), 0, None): "train.device is cuda but the Ray cluster at HOST has no GPUs",
        (("cpu", "cuda:0"), 0, 0.0): "train.device is cuda:0 but",
    }
    for (devices, cluster, given), message in refusals.items():
        with pytest.raises(SweepError, match=re.escape(message)):
            gpus(list(devices), cluster, given)


def test_sweep_on_a_local_ray_instance(minari_root, tmp_path, capsys) -> None:
    import ray  # the ray extra: installed by .ci/run

    runs = tmp_path / "runs"
    runs.mkdir()
    # walker2d-medium is a valid task whose dataset is not here: its run fails, the other finishes.
    args = sweep_args(runs, "hopper-expert,walker2d-medium", "3", "primal-dt", "--ray", "local")
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)  # the sweep's
    capsys.readouterr()  # what Ray logged while starting
    try:
        # A GPU this cluster lacks is refused in one line, before anything is written.
        refusals = {
            ("--gpus-per-run", "1"): "the Ray cluster at local has 0 GPUs but --gpus-per-run asks "
            "for 1 per run; leave it out to train on CPUs",
            ("--device", "cuda"): "train.device is cuda but the Ray cluster at local has no GPUs; "
            "use --device cpu or auto",
        }
        for extra, message in refusals.items():
            assert main([*args, *extra]) == 2, extra
            assert capsys.readouterr().err.splitlines() == [f"primal-dt: error: {message}"]
            assert list(runs.iterdir()) == [], extra
        assert main(args) == 1  # the CPU runs ask for no GPU by default
    finally:
        ray.shutdown()
    out, err = capsys.readouterr()
    assert "; on Ray at local, 0 GPUs per run" in out
    assert "done hopper-expert/primal-dt-s3" in out
    assert "FAILED walker2d-medium/primal-dt-s3 (exit 2): primal-dt: error: dataset " in out
    assert "mujoco/walker2d/medium-v0 not found" in out
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("primal-dt: error: 1 of 2 runs failed (walker2d-medium/primal-dt-s3)")
    )
    run_dir = runs / "hopper-expert" / "primal-dt-s3"
    assert read_snapshot(run_dir).step == 10
    assert read_results(RunDir(run_dir))[-1].final
    assert json.loads((run_dir / "config.json").read_text())["train"]["seed"] == 3


def test_a_runs_score_is_its_first_targets_everywhere(tmp_path) -> None:
    """One definition (store/results.py target_score): the normalised return at the first
    target, never the best of the targets, in the sweep's line as in the report's table."""
    from primal_dt.store.results import EvalResult, TargetSummary, append_result, target_score
    from primal_dt.tools.sweep import final_summary

    first = TargetSummary(3600.0, 1200.0, 10.0, 35.9, 0.3, 500.0, 10)
    better = TargetSummary(1800.0, 1230.0, 10.0, 36.9, 0.3, 500.0, 10)
    record = EvalResult(step=100, checkpoint="ckpt.pt", final=True, results=[first, better])
    record.score = 36.9  # as records before this definition said: the best of the targets
    assert target_score(record) == 35.9
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    append_result(run, record)
    assert final_summary(run) == "final return at target 3600 35.9"
