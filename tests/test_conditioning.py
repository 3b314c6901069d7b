"""The return-conditioning curve: a sweep of target returns evaluated, kept in the run directory
as a record and a PNG, and drawn for DT and Primal-DT side by side by the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import train_args
from matplotlib.text import Text

from primal_dt.cli import main
from primal_dt.common.errors import ConfigError
from primal_dt.evaluation.conditioning import curve_points, read_curve, targets_between
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot

PNG = b"\x89PNG\r\n\x1a\n"


def test_target_sweeps_parse_and_refuse_nonsense() -> None:
    assert targets_between("0:3000:4") == [0.0, 1000.0, 2000.0, 3000.0]
    for bad in ("0:3000", "3000:0:4", "0:3000:1", "a:b:c", "0:inf:3"):
        with pytest.raises(ConfigError, match="--target-sweep"):
            targets_between(bad)


def test_target_sweep_curve_and_report(
    minari_root, tmp_path, capsys, saved_figures: list[tuple[Path, Any]]
) -> None:
    runs = tmp_path / "runs"
    for config in ("dt", "primal-dt"):
        run_dir = runs / "hopper-medium" / f"{config}-s0"
        assert main(train_args(run_dir, 10, config=config)) == 0
        sweep = [
            "eval",
            "--ckpt",
            str(run_dir / "checkpoints" / "step_00000010.pt"),
            "--target-sweep",
            "0:3000:3",
            "--episodes",
            "2",
            "--device",
            "cpu",
        ]
        saved_figures.clear()
        assert main(sweep) == 0
        out, err = capsys.readouterr()
        assert len([row for row in out.splitlines() if "step_00000010.pt" in row]) == 3
        # Kept in the run directory, not in checkpoints/: the record and its figure.
        data, picture = RunDir(run_dir).return_curve(10)
        assert f"return-conditioning curve: {picture}" in err
        assert picture.read_bytes()[:8] == PNG and picture.stat().st_size > 10_000
        assert len(saved_figures) == 1  # the run's own curve
        texts = [text.get_text() for text in saved_figures[0][1].findobj(Text)]
        assert [text for text in texts if "hopper-medium" in text] == ["hopper-medium"]  # once
        assert "step 10" in texts  # the panel: which checkpoint
        record = read_curve(RunDir(run_dir))
        assert record is not None and json.loads(data.read_text())["step"] == 10
        assert [s.target for s in record.results] == [0.0, 1500.0, 3000.0]
        assert all(s.episodes == 2 for s in record.results)
        best = read_snapshot(run_dir).task.dataset_best_return
        assert best is not None and record.dataset_best_return == best > 1000  # SAC Hopper data
        targets, achieved, spread, best_normalised = curve_points(record)
        reference = record.reference
        assert targets[2] == pytest.approx(
            100 * (3000 - reference.random) / (reference.expert - reference.random)
        )
        assert achieved[0] == pytest.approx(record.results[0].normalized_mean)
        assert best_normalised == pytest.approx(float(reference.normalize(best)))

    assert main(["report", str(runs)]) == 0
    figure = runs / "report" / "return_curve_hopper-medium.png"
    assert figure.read_bytes()[:8] == PNG and figure.stat().st_size > 10_000
    assert (
        "![return_curve_hopper-medium](return_curve_hopper-medium.png)"
        in (runs / "report" / "report.md").read_text()
    )
    assert main(["eval", "--ckpt", str(runs), "--target-sweep", "1:0:3"]) == 2
