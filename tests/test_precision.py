"""train.precision = "auto": bf16 where the CPU (or GPU) multiplies it in hardware, float32
elsewhere; what a run resolved it to is recorded everywhere, printed once, and kept on resume;
checkpoints from before the rule keep their old meaning."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import train_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from primal_dt.cli import main
from primal_dt.common.device import autocast_dtype, cpu_bf16_unit, resolve_precision
from primal_dt.store.integrity import DIGEST_KEY
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot

CPU = torch.device("cpu")


def pretend_cpu(monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool) -> None:
    """What torch reports about this CPU's bf16 units."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "unit", "expected"),
    [
        (True, True, "AMX", "bf16"),
        (False, True, "AVX-512 BF16", "bf16"),
        (False, False, None, "fp32"),
    ],
)
def test_auto_is_bf16_exactly_where_the_cpu_has_a_bf16_unit(
    monkeypatch, amx, avx512_bf16, unit, expected
) -> None:
    pretend_cpu(monkeypatch, amx, avx512_bf16)
    assert cpu_bf16_unit() == unit
    assert resolve_precision("auto", CPU) == expected
    dtype = autocast_dtype(resolve_precision("auto", CPU))
    assert dtype == (torch.bfloat16 if expected == "bf16" else None)
    for forced in ("bf16", "fp32"):  # forcing one ignores the hardware
        assert resolve_precision(forced, CPU) == forced
    # Resolved once: what reads a run's precision takes the resolved value alone.
    with pytest.raises(ValueError, match='a resolved precision is "bf16" or "fp32"'):
        autocast_dtype("auto")  # type: ignore[arg-type]


def hparam(run_dir, name: str) -> str:
    """A run's setting as TensorBoard's HPARAMS tab shows it."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return start.hparams[name].string_value


def recorded(run_dir) -> tuple[str, str, str, list[str]]:
    """The precision in config.json, the checkpoint, TensorBoard's hparams, each eval record."""
    config = json.loads((run_dir / "config.json").read_text())["train"]["precision"]
    checkpoint = read_snapshot(run_dir).config.train.precision
    records = [record.precision for record in read_results(RunDir(run_dir))]
    return config, checkpoint, hparam(run_dir, "train.precision"), records


def cpu_run(run_dir, steps: int, *extra: str) -> list[str]:
    return [*train_args(run_dir, steps, "eval.final_episodes=1", *extra), "--device", "cpu"]


@pytest.mark.parametrize(("bf16_unit", "expected"), [(True, "bf16"), (False, "fp32")])
def test_a_run_records_and_prints_what_auto_resolved_to(
    minari_root, tmp_path, capsys, monkeypatch, bf16_unit, expected
) -> None:
    pretend_cpu(monkeypatch, False, bf16_unit)
    run_dir = tmp_path / "run"
    assert main(cpu_run(run_dir, 5)) == 0
    err = capsys.readouterr().err
    assert err.count(f"precision {expected} (auto: this CPU has ") == 1, err
    assert recorded(run_dir) == (expected, expected, expected, [expected])


def test_a_resumed_run_keeps_its_precision_on_a_cpu_that_would_choose_another(
    minari_root, tmp_path, capsys, monkeypatch
) -> None:
    run_dir = tmp_path / "run"
    pretend_cpu(monkeypatch, False, True)
    assert main(cpu_run(run_dir, 5)) == 0
    pretend_cpu(monkeypatch, False, False)  # "moved" to a CPU without a bf16 unit
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "10", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "this run trains in bf16, as it started; this cpu has no bf16 unit" in err, err
    assert recorded(run_dir) == ("bf16", "bf16", "bf16", ["bf16", "bf16"])


def test_a_checkpoint_from_before_the_rule_keeps_the_old_meaning_of_auto(
    minari_root, tmp_path, capsys, monkeypatch
) -> None:
    """Checkpoints written before runs recorded the resolved precision say "auto", which then
    meant float32 on every CPU: they resume and evaluate in float32, on a bf16 CPU too."""
    pretend_cpu(monkeypatch, False, True)
    run_dir = tmp_path / "run"
    assert main(cpu_run(run_dir, 5, 'train.precision="fp32"')) == 0
    checkpoint = run_dir / "ckpt.pt"
    payload = torch.load(checkpoint, weights_only=True)
    payload["config"]["train"]["precision"] = "auto"
    del payload[DIGEST_KEY]  # such a checkpoint also predates digests
    torch.save(payload, checkpoint)
    capsys.readouterr()
    assert (
        main(["eval", "--ckpt", str(checkpoint), "--device", "cpu", "--episodes", "1", "--json"])
        == 0
    )
    (record,) = json.loads(capsys.readouterr().out)
    assert record["precision"] == "fp32"
    assert main(["train", "--resume", str(run_dir), "--steps", "10", "--no-progress"]) == 0
    assert (
        "this run trains in fp32, as it started; this cpu multiplies bf16"
        in capsys.readouterr().err
    )
    assert read_snapshot(run_dir).config.train.precision == "fp32"
    assert read_results(RunDir(run_dir))[-1].precision == "fp32"
