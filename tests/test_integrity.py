"""Checkpoints that prove their integrity (store/integrity.py), files that are no checkpoint at
all, several checkpoints of which some are bad, and rolling a run back to a kept checkpoint."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import scalars, train_args

from primal_dt.cli import main
from primal_dt.store.integrity import DIGEST_KEY
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot

KEEPING = ("train.ckpt_every=5", "train.keep_checkpoints=4", "eval.final_episodes=1")


@pytest.fixture(scope="module")
def run(minari_root, tmp_path_factory) -> Path:
    """A finished 10-step run with checkpoints at steps 5 and 10 kept."""
    run_dir = tmp_path_factory.mktemp("integrity") / "run"
    assert main(train_args(run_dir, 10, *KEEPING)) == 0
    return run_dir


def copy_of_run(run: Path, tmp_path: Path) -> Path:
    """The fixture's run directory, copied, so that a test may damage it."""
    copy = tmp_path / "run"
    for path in run.rglob("*"):
        if path.is_file():
            target = copy / path.relative_to(run)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    return copy


def flip_at(path: Path, start: int, length: int) -> None:
    """Flip one bit in the middle of the `length` bytes at `start` of the file."""
    data = bytearray(path.read_bytes())
    data[start + length // 2] ^= 0x01
    path.write_bytes(bytes(data))


def storage_in_file(path: Path, tensor: torch.Tensor) -> tuple[int, int]:
    """Where a tensor's bytes lie in a torch.save file: each storage is one uncompressed zip record.
    Found by record, not by searching the file, since a short one (a CUDA generator's state is 16
    bytes) may occur elsewhere too."""
    content = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    with zipfile.ZipFile(path) as archive:
        records = [r for r in archive.infolist() if "/data/" in r.filename]
        found = [r for r in records if archive.read(r) == content]
    assert len(found) == 1, f"{len(found)} records hold the tensor's bytes"
    header = path.read_bytes()[found[0].header_offset :][:30]  # the zip local file header
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return found[0].header_offset + 30 + name_length + extra_length, len(content)


def parts_to_damage(path: Path) -> dict[str, tuple[int, int]]:
    """Where each part of a checkpoint file lies (start, length), with the words its error uses."""
    payload = torch.load(path, weights_only=True)
    weight = next(t for name, t in payload["model"].items() if name.endswith("attn.proj.weight"))
    lr = struct.pack(">d", payload["config"]["train"]["lr"])  # pickle's BINFLOAT
    return {
        "the weights": storage_in_file(path, weight),
        "the optimizer state": storage_in_file(path, payload["optimizer"]["state"][0]["exp_avg"]),
        "the sampler state": storage_in_file(path, payload["sampler"]["generator"]),
        "the settings": (path.read_bytes().index(lr), len(lr)),
    }


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "weights_only" not in err[0]  # never the advice to load an untrusted file unsafely
    return err[0]


@pytest.mark.parametrize(
    "part", ["the weights", "the optimizer state", "the sampler state", "the settings"]
)
def test_a_flipped_byte_in_any_part_is_refused_naming_the_part(run, tmp_path, capsys, part) -> None:
    run_dir = copy_of_run(run, tmp_path)
    ckpt = run_dir / "ckpt.pt"
    flip_at(ckpt, *parts_to_damage(ckpt)[part])
    damaged = ckpt.read_bytes()
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(ckpt), "--episodes", "1"]) == 2
    line = one_line(capsys)
    assert f"{ckpt} fails its integrity check: {part} no longer matches the digest" in line, line
    assert str(run_dir / "checkpoints" / "step_00000005.pt") in line  # where the others are
    assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 2
    line = one_line(capsys)
    assert "fails its integrity check" in line and "--from" in line, line
    assert ckpt.read_bytes() == damaged  # nothing was written
    assert read_snapshot(run_dir / "checkpoints" / "step_00000010.pt").step == 10


def test_a_checkpoint_written_before_digests_loads_with_a_note(run, tmp_path, capsys) -> None:
    run_dir = copy_of_run(run, tmp_path)
    ckpt = run_dir / "ckpt.pt"
    payload = torch.load(ckpt, weights_only=True)
    del payload[DIGEST_KEY]
    torch.save(payload, ckpt)
    assert not read_snapshot(ckpt).sealed and read_snapshot(run).sealed
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(ckpt), "--episodes", "1"]) == 0
    assert "was written before primal-dt checkpoints carried a digest" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 0
    assert "carried a digest" in capsys.readouterr().err
    assert read_snapshot(ckpt).sealed  # saved again, with its digest


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (bytes(range(256)) * 40, "it starts with b'\\x00\\x01\\x02\\x03', not a zip archive"),
        (b"epoch,loss\n1,0.5\n", "it starts with b'epoc', not a zip archive"),
        (b"", "it is empty"),
    ],
    ids=["random bytes", "text file", "empty"],
)
def test_a_file_that_is_no_checkpoint_says_so_in_words(tmp_path, capsys, content, said) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    assert main(["eval", "--ckpt", str(path)]) == 2
    line = one_line(capsys)
    assert f"{path} is not a checkpoint at all" in line and said in line, line


def test_several_checkpoints_report_every_good_one_and_each_bad_one(run, tmp_path, capsys) -> None:
    good = run / "ckpt.pt"
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:2000])
    missing = tmp_path / "missing.pt"
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(good), str(truncated), str(missing), "--episodes", "1"]) == 2
    captured = capsys.readouterr()
    assert str(good) in captured.out and "3600.0" in captured.out  # the good one's rows
    errors = captured.err.strip().splitlines()[-2:]
    assert f"{truncated} is damaged (truncated or corrupt" in errors[0], errors
    assert f"checkpoint {missing} does not exist" in errors[1], errors
    assert main(["eval", "--ckpt", str(good), str(truncated), "--episodes", "1", "--json"]) == 2
    records = json.loads(capsys.readouterr().out)
    assert records[0]["checkpoint"] == str(good) and records[0]["results"]
    assert records[1]["checkpoint"] == str(truncated) and "damaged" in records[1]["error"]


def test_resume_of_a_checkpoint_file_says_how_to_roll_back_to_it(run, capsys) -> None:
    kept = run / "checkpoints" / "step_00000005.pt"
    capsys.readouterr()
    assert main(["train", "--resume", str(kept), "--no-progress"]) == 2
    line = one_line(capsys)
    assert f"primal-dt train --resume {run} --from {kept}" in line, line
    assert main(["train", "--resume", str(run), "--from", str(run / "best.pt")]) == 2
    assert "--from takes one of" in one_line(capsys)


def test_rolling_back_to_a_kept_checkpoint_continues_bit_identical(run, tmp_path, capsys) -> None:
    """Back to step 5 of the 10-step run, then on to 10: the same weights and logs as the run
    trained straight through, with what the first run did after step 5 dropped."""
    run_dir = copy_of_run(run, tmp_path)
    rollback = run_dir / "checkpoints" / "step_00000005.pt"
    capsys.readouterr()
    args = ["train", "--resume", str(run_dir), "--from", str(rollback), "--no-progress"]
    assert main([*args, "--steps", "10"]) == 0
    assert "rolled back to step 5" in capsys.readouterr().err
    a, b = read_snapshot(run), read_snapshot(run_dir)
    assert b.step == 10
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name
    timing = "train/steps_per_sec"
    logged = {tag: points for tag, points in scalars(run_dir).items() if tag != timing}
    assert logged == {tag: points for tag, points in scalars(run).items() if tag != timing}
    assert [r.step for r in read_results(RunDir(run_dir))] == [10]  # one final evaluation
