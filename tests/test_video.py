"""Episode videos: rendered offscreen on the CPU (MuJoCo's EGL back-end with Mesa), written to MP4
and read back, the same returns with and without rendering, TensorBoard GIFs from training's final
evaluation, and one clear line (never a failed run) when the back-end is missing; without videos,
no back-end is needed whatever MUJOCO_GL says."""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import hopper_policy, train_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from primal_dt.cli import main
from primal_dt.evaluation.rollout import load_policy, make_jobs, rollout
from primal_dt.evaluation.video import headless_rendering, mp4_writer, read_frames
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot


def test_a_rendered_episode_is_an_mp4_with_the_same_return(tmp_path) -> None:
    policy, task = hopper_policy()  # episodes of at most 20 steps
    gl_before = os.environ.get("MUJOCO_GL")
    jobs = make_jobs((1800.0,), 1, seed=10)
    returns, lengths = rollout(policy, task, jobs)  # not rendered
    frames: list[np.ndarray] = []
    with headless_rendering():
        rendered, _ = rollout(policy, task, jobs, on_frame=frames.append)
    assert os.environ.get("MUJOCO_GL") == gl_before  # restored
    assert rendered[0] == returns[0]  # exactly: rendering only reads the simulation
    assert len(frames) == lengths[0] + 1 and frames[0].shape == (480, 480, 3)
    path = tmp_path / "episode.mp4"
    with mp4_writer(path, fps=25) as writer:
        for frame in frames:
            writer.append_data(frame)
    back, fps = read_frames(path)
    assert len(back) == len(frames) and fps == 25
    assert np.abs(back[0].astype(int) - back[-1]).mean() > 0.5  # the hopper moved
    assert np.abs(back[0].astype(int) - frames[0]).mean() < 3  # a lossy copy of what was drawn


def test_eval_video_writes_one_mp4_per_episode_named_by_its_return(minari_root, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 5, "eval.targets=[1800.0, 900.0]")) == 0
    capsys.readouterr()
    args = ["eval", "--ckpt", str(run_dir), "--episodes", "2", "--device", "cpu", "--json"]
    assert main([*args, "--video"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    videos = sorted(RunDir(run_dir).videos.glob("*.mp4"))
    assert [v.name.split("_return_")[0] for v in videos] == [
        "step_00000005_target_1800_seed_0",
        "step_00000005_target_900_seed_0",
    ]
    # The video of episode 0 of each target returns what the evaluation's episode 0 did.
    snapshot = read_snapshot(run_dir)
    for video in videos:
        target = float(re.search(r"target_(\d+)", video.name)[1])
        episode_return = float(re.search(r"return_(-?[\d.]+)\.mp4", video.name)[1])
        assert len(read_frames(video)[0]) > 1
        policy_return = rollout_return(snapshot, target)
        assert episode_return == pytest.approx(policy_return, abs=0.05)
    assert record["videos"] == [str(v) for v in videos]
    # The numbers are those of an evaluation without videos.
    assert main(args) == 0
    (plain,) = json.loads(capsys.readouterr().out)
    assert plain["results"] == record["results"]


def rollout_return(snapshot, target: float) -> float:
    policy = load_policy(snapshot, torch.device("cpu"), "test")
    returns, _ = rollout(policy, snapshot.task, make_jobs((target,), 1, snapshot.config.train.seed))
    return float(returns[0])


def test_final_evaluation_videos_reach_tensorboard(minari_root, tmp_path) -> None:
    run_dir = tmp_path / "run"
    extra = ("eval.final_episodes=1", "eval.video_episodes=1", "eval.targets=[1800.0]")
    assert main(train_args(run_dir, 5, *extra)) == 0
    (final,) = read_results(RunDir(run_dir))
    assert final.final and len(final.videos) == 1 and final.video_error is None
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    (tag,) = [t for t in events.Tags()["images"] if t.startswith("video/")]
    assert tag == "video/target_1800/seed_0"
    (image,) = events.Images(tag)
    assert image.step == 5 and image.encoded_image_string[:6] == b"GIF89a"


def test_a_missing_back_end_is_one_line_and_never_fails_training(
    minari_root, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("MUJOCO_GL", "glfw")  # a back-end that cannot draw here: no display
    monkeypatch.delenv("DISPLAY", raising=False)
    run_dir = tmp_path / "run"
    extra = ("eval.final_episodes=1", "eval.video_episodes=1", "eval.targets=[1800.0]")
    assert main(train_args(run_dir, 5, *extra)) == 0  # training and its evaluation stand
    err = capsys.readouterr().err
    assert "no videos: cannot render offscreen (MUJOCO_GL=glfw)" in err
    assert "apt-get install libegl1 libegl-mesa0" in err
    (final,) = read_results(RunDir(run_dir))
    assert final.results and final.videos == [] and "libegl-mesa0" in final.video_error
    assert main(["eval", "--ckpt", str(run_dir), "--episodes", "1", "--video"]) == 2
    out, err = capsys.readouterr()
    assert "1800.0" in out  # the evaluation's table is printed first
    (line,) = [line for line in err.splitlines() if line.startswith("primal-dt:")]
    assert line.startswith("primal-dt: error: cannot render offscreen") and "libegl1" in line
    assert not list(RunDir(run_dir).videos.glob("*.mp4"))  # no half-written file


def missing_back_end() -> tuple[str, str]:
    """A MuJoCo back-end this machine lacks, and the package its line must name: osmesa where
    libOSMesa is missing (as on the machine of issue 18), else egl where libEGL is, else glfw
    without a display (no back-end of its own to install: the line names EGL's packages)."""
    if ctypes.util.find_library("OSMesa") is None:
        return "osmesa", "apt-get install libosmesa6"
    if ctypes.util.find_library("EGL") is None:
        return "egl", "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0"
    return "glfw", "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0"


def test_only_videos_need_the_back_end_mujoco_gl_names(minari_root, tmp_path) -> None:
    """Issue 18: with MUJOCO_GL naming a back-end that is not installed, training and evaluation
    work (the simulation needs no OpenGL) and only the videos fail, saying what to install."""
    back_end, install = missing_back_end()
    env = {**os.environ, "MUJOCO_GL": back_end}  # set before MuJoCo is imported, as a user does
    env.pop("PYOPENGL_PLATFORM", None)
    env.pop("DISPLAY", None)

    def primal_dt(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "primal_dt.cli", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)

    run_dir = tmp_path / "run"
    extra = ("eval.final_episodes=1", "eval.video_episodes=1", "eval.targets=[1800.0]")
    trained = primal_dt(*train_args(run_dir, 5, *extra))
    assert trained.returncode == 0, trained.stderr
    assert f"no videos: cannot render offscreen (MUJOCO_GL={back_end})" in trained.stderr
    assert "Traceback" not in trained.stderr
    (final,) = read_results(RunDir(run_dir))
    assert final.results and final.videos == []
    assert f"MUJOCO_GL={back_end}" in final.video_error and install in final.video_error

    plain = primal_dt("eval", "--ckpt", str(run_dir), "--episodes", "1", "--device", "cpu")
    assert plain.returncode == 0, plain.stderr
    assert "1800.0" in plain.stdout and "primal-dt:" not in plain.stderr

    video = primal_dt(
        "eval", "--ckpt", str(run_dir), "--episodes", "1", "--device", "cpu", "--video"
    )
    assert video.returncode == 2
    assert video.stdout == plain.stdout  # the evaluation's table, printed first, the same numbers
    (line,) = [line for line in video.stderr.splitlines() if line.startswith("primal-dt:")]
    assert f"MUJOCO_GL={back_end}" in line and install in line
    assert "Traceback" not in video.stderr  # the line alone, not Gymnasium's half-made viewer
    assert not list(RunDir(run_dir).videos.glob("*.mp4"))


@pytest.mark.parametrize("module", ["imageio", "imageio_ffmpeg"])
def test_eval_video_without_the_extra_names_it_and_writes_nothing(
    minari_root, tmp_path, capsys, monkeypatch, module: str
) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 5, "eval.final_episodes=1")) == 0
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import raises
    assert main(["eval", "--ckpt", str(run_dir), "--episodes", "1", "--video"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        f"primal-dt: error: videos need imageio and imageio-ffmpeg ({module} is not installed): "
        "pip install 'primal-dt[video]'"
    ]
    assert not RunDir(run_dir).videos.exists()
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
