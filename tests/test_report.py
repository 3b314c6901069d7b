"""primal-dt report: runs are grouped by the task, config name and seed their config.json records
(never by folder names), a second run of the same (task, config, seed) is named in the notes and
counted once, and the report's figures keep every text inside the figure."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import train_args
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from primal_dt.cli import main
from primal_dt.evaluation import plots


@pytest.fixture(scope="module")
def trained(minari_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny dt run of hopper-medium, seed 0, 10 steps, with a return-conditioning curve."""
    run = tmp_path_factory.mktemp("trained") / "run"
    extra = ("eval.final_episodes=1", "eval.targets=[1800.0]", "train.seed=0")
    assert main(train_args(run, 10, *extra, config="dt")) == 0
    sweep = ["eval", "--ckpt", str(run / "checkpoints" / "step_00000010.pt"),
             "--target-sweep", "0:3000:2", "--episodes", "1", "--device", "cpu"]  # fmt: skip
    assert main(sweep) == 0
    return run


def place(run: Path, folder: Path, config: str | None = None, seed: int | None = None) -> None:
    """A copy of run in folder, recorded in its config.json as this config name and seed."""
    shutil.copytree(run, folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    if config is not None:
        data["config_name"] = config
    if seed is not None:
        data["train"]["seed"] = seed
    path.write_text(json.dumps(data))


def outside(figure: Any) -> list[str]:
    """What of figure is drawn (partly) outside it: its texts (the title) and each axes with all
    it draws (title, labels, tick labels in view, legend), as matplotlib's renderer measures them."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    parts = [(repr(t.get_text()), t.get_window_extent(renderer)) for t in figure.texts]
    parts += [(f"axes {ax.get_title()!r}", ax.get_tightbbox(renderer)) for ax in figure.axes]
    box = figure.bbox
    return [
        f"{name} at {extent.bounds} in {box.bounds}"
        for name, extent in parts
        if extent.x0 < box.x0 - 0.5
        or extent.y0 < box.y0 - 0.5
        or extent.x1 > box.x1 + 0.5
        or extent.y1 > box.y1 + 0.5
    ]


def test_report_groups_by_recorded_task_config_and_seed(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    runs = tmp_path / "runs"
    place(trained, runs / "a")  # dt, seed 0, as trained
    place(trained, runs / "b", seed=1)
    place(trained, runs / "x-y", seed=2)
    place(trained, runs / "primal-dt-s7", config="dt", seed=3)  # the folder's name is wrong
    place(trained, runs / "deep" / "c", config="primal-dt", seed=0)
    for curve in (runs / "deep" / "c").glob("return_curve_*"):
        curve.unlink()  # the return-conditioning figure has a single panel (dt): a narrow one
    place(trained, runs / "zz-again")  # dt, seed 0 again: a duplicate of a/
    saved: list[tuple[Path, Any]] = []
    save = plots.save

    def keep(figure: Any, path: Path) -> Path:
        saved.append((path, figure))
        return save(figure, path)

    monkeypatch.setattr(plots, "save", keep)

    assert main(["report", str(runs)]) == 0
    table = capsys.readouterr().out
    report = runs / "report"
    rows = {(r["task"], r["config"]): r for r in csv.DictReader((report / "report.csv").open())}
    assert list(rows) == [("hopper-medium", "dt"), ("hopper-medium", "primal-dt"),
                          ("average", "dt"), ("average", "primal-dt")]  # fmt: skip
    dt, primal = rows["hopper-medium", "dt"], rows["hopper-medium", "primal-dt"]
    assert dt["seeds"] == "0 1 2 3" and dt["n_final"] == "4" and dt["n_best"] == "4"
    assert primal["seeds"] == "0" and primal["n_final"] == "1"
    assert (
        "| hopper-medium | dt | 0,1,2,3 |" in table and "| hopper-medium | primal-dt | 0 |" in table
    )
    assert " seeds)" not in table  # every seed has its scores: no "(k of n seeds)"
    # The copies score alike, so a mean over any number of them is the run's own score.
    final = json.loads((trained / "eval.jsonl").read_text().splitlines()[-1])["score"]
    assert float(dt["final_mean"]) == pytest.approx(final, abs=1e-4)

    text = (report / "report.md").read_text()
    assert "5 runs" in text and "1 duplicate" in text
    notes = text.split("## Notes")[1]
    duplicate = [line for line in notes.splitlines() if "zz-again" in line]
    assert len(duplicate) == 1 and str(runs / "a") in duplicate[0], notes
    assert "hopper-medium/dt-s0" in duplicate[0]

    # Every figure the report wrote, the return-conditioning curve included, keeps its texts inside.
    names = sorted(path.name for path, _ in saved)
    assert names == ["curves_hopper-medium.png", "return_curve_hopper-medium.png",
                     "spectrum_hopper-medium.png"]  # fmt: skip
    for path, figure in saved:
        assert outside(figure) == [], path.name
    figures = {path.name: figure for path, figure in saved}
    assert len(figures["return_curve_hopper-medium.png"].axes) == 1
    curves = figures["curves_hopper-medium.png"]
    texts = [t.get_text() for t in curves.findobj(Text)]
    titles = [text for text in texts if "hopper-medium" in text]
    assert titles == ["hopper-medium"], titles  # said once, in the suptitle
    legend = [text for text in texts if "seeds)" in text]
    assert legend == ["dt (4 seeds)"] and "primal-dt (1 seed)" in texts


def test_long_titles_fit_in_narrow_figures() -> None:
    task = "halfcheetah-medium-replay"
    rng = np.random.default_rng(0)
    targets = np.linspace(0.0, 120.0, 4)
    points = (targets, targets * 0.5, np.full(4, 3.0), 90.0)
    title = f"{task}: return conditioning (achieved against target)"
    one_panel = plots.conditioning_figure({"primal-dt": [points]}, title, reference=object())
    curve = np.cumsum(rng.random(8))
    one_block = plots.spectra_figure(task, [("block 0", {"dt (softmax)": [curve / curve[-1]]})])
    series = [[(0, 1.0), (5, 2.0), (10, 3.0)]]
    curves = plots.curves_figure(task, {"dt": series}, {"dt": series}, "normalised score")
    for figure in (one_panel, one_block, curves):
        assert outside(figure) == []
        # The whole title is still there (wrapped, not shortened away).
        assert task in " ".join(figure.get_suptitle().split())
