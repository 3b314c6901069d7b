"""What the CUDA path meets, checked where it shows on a CPU: resuming across device types, the
CUDA generator states, and what bf16 must not round."""

from __future__ import annotations

import json

import torch
from conftest import DEVICE, train_args

from primal_dt.cli import main
from primal_dt.common.device import machine_name
from primal_dt.store.integrity import seal
from primal_dt.store.runconfig import read_run_config
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot
from primal_dt.training import launch
from primal_dt.training.trainer import action_loss


def test_a_run_resumes_on_another_device_type(minari_root, tmp_path, capsys) -> None:
    """A checkpoint saved on CUDA (its sampler's generator state is a CUDA one, 16 bytes, and it
    holds a CUDA generator state) resumes on a CPU, saying it cannot be bit-identical; a CPU run
    never initialises CUDA to read or restore CUDA states."""
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 10)) == 0
    ckpt = run_dir / "ckpt.pt"
    payload = torch.load(ckpt, weights_only=True)
    on_cpu = DEVICE == "cpu"
    assert payload["sampler"]["device"] == ("cpu" if on_cpu else "cuda")
    assert (payload["rng"]["cuda"] == []) == on_cpu  # only the training device's CUDA state
    # The other device type's generator state: a CUDA one is 16 bytes, a CPU one 5,056.
    other = torch.zeros(16, dtype=torch.uint8) if on_cpu else torch.Generator().get_state()
    payload["sampler"] = {"generator": other, "device": "cuda" if on_cpu else "cpu"}
    payload["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)] if on_cpu else []
    torch.save(seal(payload), ckpt)  # its digests made again: a checkpoint as CUDA writes it
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "15", "--no-progress"]) == 0
    assert "saved on another device type" in capsys.readouterr().err
    assert read_snapshot(run_dir).step == 15
    if on_cpu:
        assert not torch.cuda.is_initialized()


def test_a_run_records_each_machine_it_trained_on(minari_root, tmp_path, capsys, monkeypatch):
    """config.json lists the machines in the order the run trained on them, and a resume on
    another says that the results are of both; one from before the record reads as none."""
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 4)) == 0
    here = machine_name(torch.device(DEVICE))
    assert read_run_config(RunDir(run_dir)).machines == [here]
    assert main(["train", "--resume", str(run_dir), "--steps", "6", "--no-progress"]) == 0
    assert read_run_config(RunDir(run_dir)).machines == [here]  # the same machine: no new entry
    monkeypatch.setattr(launch, "machine_name", lambda device: "Another CPU, 64 cores")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "8", "--no-progress"]) == 0
    assert (
        f"this run trained on {here} and goes on on Another CPU, 64 cores: its results are of "
        "both" in capsys.readouterr().err
    )
    assert read_run_config(RunDir(run_dir)).machines == [here, "Another CPU, 64 cores"]
    record = RunDir(run_dir).config_file
    data = json.loads(record.read_text())
    del data["machines"]
    record.write_text(json.dumps(data))
    assert read_run_config(RunDir(run_dir)).machines == []


def test_the_action_loss_counts_real_entries_in_float32() -> None:
    """Under bf16 autocast the prediction is bf16; the count of real entries (1279 here) must not
    round with it (bf16 holds 1280), or the loss is off by 1/1279."""
    torch.manual_seed(0)
    predicted = torch.rand(1, 1280, 1).to(torch.bfloat16)
    target = torch.rand(1, 1280, 1)
    mask = torch.ones(1, 1280, dtype=torch.bool)
    mask[0, 0] = False
    direct = ((predicted.double() - target.double()) ** 2)[0, 1:].mean()
    loss = action_loss(predicted, target, mask)
    assert abs(loss.double() - direct) / direct < 1e-6
