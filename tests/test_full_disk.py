"""A full disk, for real: a small tmpfs mounted for each test (skipped only where this machine
does not permit mounting), filled up between writes. What must hold: the command fails with one
line, and what was written before (the previous checkpoint, the earlier results) stays intact."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import train_args

from primal_dt.cli import main
from primal_dt.store.results import EvalResult, append_result, read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot

DISK_SIZE = "16m"
NOT_PERMITTED = ("permission denied", "operation not permitted", "only root", "must be superuser")


@pytest.fixture
def disk(tmp_path: Path):
    """A fresh tmpfs of DISK_SIZE on a temporary directory, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root, and these tests do not run as root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if any(words in done.stderr.lower() for words in NOT_PERMITTED):
            pytest.skip(f"this machine does not permit mounting a tmpfs: {done.stderr.strip()}")
        pytest.fail(f"mount -t tmpfs failed: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Take all but about `leave` bytes of the disk's free space with a filler file."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    size = shutil.disk_usage(disk).free - leave
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        if size > 0:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return filler


def error_line(stderr: str) -> str:
    """The command's error: its last line of output and its only `primal-dt:` line, with no
    traceback anywhere."""
    lines = stderr.splitlines()
    assert "Traceback" not in stderr, stderr
    assert [line for line in lines if line.startswith("primal-dt:")] == lines[-1:], stderr
    return lines[-1]


def test_a_checkpoint_on_a_full_disk_fails_in_one_line_and_keeps_the_previous(
    minari_root, disk, capsys
) -> None:
    run_dir = disk / "run"
    assert main(train_args(run_dir, 10, "train.ckpt_every=5")) == 0
    before = read_snapshot(run_dir)
    assert before.step == 10
    saved = (run_dir / "ckpt.pt").read_bytes()
    # Less room than one checkpoint, but enough for the small writes before it (the lock file,
    # TensorBoard's events): the resumed run's checkpoint at step 15 is what meets the full disk.
    fill(disk, leave=len(saved) // 2)
    capsys.readouterr()

    code = main(["train", "--resume", str(run_dir), "--steps", "20", "--no-progress"])

    line = error_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith("primal-dt: error: no space left on the disk: "), line
    assert "ckpt.pt" in line and "free some space" in line, line
    assert (run_dir / "ckpt.pt").read_bytes() == saved  # the previous checkpoint, untouched
    after = read_snapshot(run_dir)
    assert after.step == 10 and after.training is not None
    for name, tensor in before.weights.items():
        assert after.weights[name].equal(tensor), name
    assert [p.name for p in RunDir(run_dir).saved_checkpoints()] == [
        RunDir(run_dir).step_checkpoint(step).name for step in (5, 10)
    ]
    assert read_snapshot(RunDir(run_dir).step_checkpoint(10)).step == 10
    assert list(run_dir.rglob(".*.tmp")) == []  # no .ckpt.pt.*.tmp left behind


def record(step: int, name: str = "run") -> EvalResult:
    return EvalResult(step, name, error=f"evaluation {step} of {name}")


def test_an_eval_result_on_a_full_disk_raises_and_leaves_no_partial_line(disk) -> None:
    run = RunDir(disk / "run")
    run.path.mkdir()
    earlier = [record(5), record(10)]
    for each in earlier:
        append_result(run, each)
    size = run.eval_log.stat().st_size
    filler = fill(disk)
    # Longer than what is left of eval.jsonl's last page: some of it would fit, not all.
    big = record(15, "x" * 3 * 4096)
    with pytest.raises(OSError) as raised:
        append_result(run, big)
    assert raised.value.errno == errno.ENOSPC
    assert run.eval_log.stat().st_size == size  # not a byte of the line left behind
    assert [r.to_dict() for r in read_results(run)] == [r.to_dict() for r in earlier]
    # With space again, the next record is a line of its own, not glued onto a partial one.
    filler.unlink()
    append_result(run, record(20))
    assert [r.step for r in read_results(run)] == [5, 10, 20]
    assert run.eval_log.read_text().count("\n") == 3


def test_eval_watch_on_a_disk_full_at_the_append_fails_in_one_line(
    minari_root, disk, capsys, monkeypatch
) -> None:
    run_dir = disk / "run"
    run = RunDir(run_dir)
    assert main(train_args(run_dir, 10, "train.ckpt_every=5")) == 0
    # Step 5 evaluated already, its line padded to end just short of a page: the watcher
    # evaluates step 10 only, and its line starts in that page's last bytes and needs another.
    page = os.statvfs(disk).f_bsize
    append_result(run, record(5))
    pad = page - 64 - run.eval_log.stat().st_size
    run.eval_log.unlink()
    append_result(run, EvalResult(5, "run", error="x" * (pad + len(record(5).error))))
    saved = run.eval_log.read_bytes()
    assert len(saved) == page - 64

    def append_on_a_full_disk(run: RunDir, record: EvalResult) -> None:
        fill(disk)
        append_result(run, record)
        raise KeyboardInterrupt  # it was written: stop watching (the test fails below)

    monkeypatch.setattr("primal_dt.evaluation.service.append_result", append_on_a_full_disk)
    capsys.readouterr()

    code = main(["eval", "--watch", str(run_dir), "--device", "cpu", "--episodes", "1"])

    line = error_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith("primal-dt: error: no space left on the disk: "), line
    assert str(run.eval_log) in line, line
    assert run.eval_log.read_bytes() == saved  # nothing of step 10's line
    assert [r.step for r in read_results(run)] == [5]
