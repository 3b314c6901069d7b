"""primal-dt report: runs are grouped by the task, config name and seed their config.json records
(never by folder names), a second run of the same (task, config, seed) is named in the notes and
counted once, and the report's figures keep every text inside the figure."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import train_args
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from scipy.stats import trim_mean

from primal_dt.cli import main
from primal_dt.common.resources import resource_dir
from primal_dt.evaluation import plots
from primal_dt.tools.report import aggregates, collect, group, paper_scores, write_report


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


def place(
    run: Path,
    folder: Path,
    config: str | None = None,
    seed: int | None = None,
    task: str | None = None,
    score: float | None = None,
    reference: bool = True,
) -> None:
    """A copy of run in folder, recorded in its config.json as this config name, seed and task;
    every evaluation record scoring `score` where given; without reference scores (and without its
    checkpoint, which holds them too) where reference is False."""
    shutil.copytree(run, folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    if config is not None:
        data["config_name"] = config
    if seed is not None:
        data["train"]["seed"] = seed
    if task is not None:
        data["task"] = task
    path.write_text(json.dumps(data))
    path = folder / "eval.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in records:
        record["score"] = record["score"] if score is None else score
        record["reference"] = record["reference"] if reference else None
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    if not reference:
        (folder / "ckpt.pt").unlink()


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
    trained: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    saved_figures: list[tuple[Path, Any]],
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
    saved = saved_figures
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


# Final scores per (task, config), one per seed 0, 1, 2: varied, overlapping between configs.
SCORES = {
    ("hopper-medium", "dt"): [40.0, 55.0, 47.0],
    ("hopper-medium", "primal-dt"): [52.0, 44.0, 61.0],
    ("walker2d-medium", "dt"): [70.0, 81.0, 64.0],
    ("walker2d-medium", "primal-dt"): [77.0, 90.0, 120.0],  # one above 100: the gap clips it
}
NO_REFERENCE = "test/hopper/random-v0"  # a dataset-id task: no reference scores, no paper numbers


def cells(table: str, start: str) -> list[str]:
    """The cells of the table's line that starts with `start`."""
    line = next(line for line in table.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def interval(text: str) -> tuple[float, float, float]:
    """(point, low, high) of "point [low, high]"."""
    found = re.fullmatch(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", text)
    assert found, text
    point, low, high = map(float, found.groups())
    assert low <= point <= high, text
    return point, low, high


def test_aggregates_intervals_and_the_papers_numbers(
    trained: Path, tmp_path: Path, saved_figures: list[tuple[Path, Any]]
) -> None:
    runs = tmp_path / "runs"
    for (task, config), scores in SCORES.items():
        for seed, score in enumerate(scores):
            place(trained, runs / f"{task}-{config}-{seed}", config, seed, task, score)
    for seed in (0, 1):
        place(trained, runs / f"none-{seed}", "dt", seed, NO_REFERENCE, reference=False)
    assert main(["report", str(runs)]) == 0
    saved = {path.name: figure for path, figure in saved_figures}
    report = runs / "report"
    text = (report / "report.md").read_text()
    table, section = text.split("## Aggregates over tasks")
    section = section.split("## Attention spectrum")[0]

    # Per task and config: the final score's mean and its bootstrap CI over seeds.
    header = cells(table, "| task |")
    row = dict(zip(header, cells(table, "| hopper-medium | dt | 0,1,2 |"), strict=True))
    mean = float(row["final"].split(" ± ")[0])
    low, high = map(float, row["final 95% CI"].strip("[]").split(", "))
    assert low <= mean <= high and low < high and mean == pytest.approx(47.3, abs=0.05)
    csv_rows = {(r["task"], r["config"]): r for r in csv.DictReader((report / "report.csv").open())}
    hopper = csv_rows["hopper-medium", "dt"]
    assert float(hopper["final_ci_low"]) == pytest.approx(low, abs=0.05)
    assert float(hopper["final_ci_high"]) == pytest.approx(high, abs=0.05)

    # Across tasks, per config: IQM, mean and optimality gap with their intervals.
    for config in ("dt", "primal-dt"):
        found = cells(section, f"| {config} | hopper-medium, walker2d-medium |")
        assert found[2] == "6 runs (3 seeds × 2 tasks)"
        scores = np.array([SCORES["hopper-medium", config], SCORES["walker2d-medium", config]])
        iqm, mean, gap = (interval(cell)[0] for cell in found[3:])
        assert iqm == pytest.approx(trim_mean(scores.ravel(), 0.25), abs=0.05)
        assert mean == pytest.approx(scores.mean(), abs=0.05)
        assert gap == pytest.approx(100 - np.minimum(scores, 100).mean(), abs=0.05)
    found, _ = aggregates(group(collect(runs, skip=report, spectra=False)))
    primal = next(agg for agg in found if agg.config == "primal-dt")
    flat = np.array(SCORES["hopper-medium", "primal-dt"] + SCORES["walker2d-medium", "primal-dt"])
    assert primal.points[0] == pytest.approx(trim_mean(flat, 0.25))
    assert f"{NO_REFERENCE} (dt): no reference scores" in section  # left out, said so

    # Primal-DT against DT: P(a primal-dt run beats a dt run on the same task), ties count half.
    found = re.search(r"P\(primal-dt > dt\).* the 2 tasks both ran .*: (\S+ \[\S+, \S+\])\.",
                      section)  # fmt: skip
    assert found, section
    point, low, high = interval(found.group(1))
    by_hand = []
    for task in ("hopper-medium", "walker2d-medium"):
        x = np.array(SCORES[task, "primal-dt"])[:, None]
        y = np.array(SCORES[task, "dt"])[None, :]
        by_hand.append((x > y).mean() + 0.5 * (x == y).mean())
    assert point == pytest.approx(np.mean(by_hand), abs=0.005) and low < high

    # The paper's numbers beside ours, where the task has a counterpart there.
    column = "paper (D4RL v2, gym v3) [P]"
    assert column in header
    paper = {key: dict(zip(header, cells(table, f"| {key[0]} | {key[1]} |"), strict=True))[column]
             for key in [*SCORES, (NO_REFERENCE, "dt")]}  # fmt: skip
    assert paper == {
        ("hopper-medium", "dt"): "DT 64.2 ± 1.1",
        ("hopper-medium", "primal-dt"): "Primal.+DT 74.5 ± 0.6",
        ("walker2d-medium", "dt"): "DT 70.6 ± 3.2",
        ("walker2d-medium", "primal-dt"): "Primal.+DT 77.9 ± 7.8",
        (NO_REFERENCE, "dt"): "",
    }  # fmt: skip
    note = next(line for line in table.splitlines() if line.startswith("[P] "))
    assert "D4RL v2 datasets with gym v3 environments" in note and "3 seeds" in note
    assert "Flowformer reproduction of DT" in note and "Minari" in note
    assert csv_rows["hopper-medium", "primal-dt"]["paper"] == "Primal.+DT 74.5 ± 0.6"

    # The figures, each with a caption that counts its runs; their texts stay inside them.
    counts = "from 12 runs (dt: 6 runs (3 seeds × 2 tasks); primal-dt: 6 runs (3 seeds × 2 tasks))"
    for name in ("aggregates.png", "performance_profile.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name[:-4]}]({name})" in section
        caption = next(line for line in section.splitlines() if line.startswith(f"*{name}*"))
        assert counts in caption and "2000 resamples, seed 0" in caption, caption
        assert outside(saved[name]) == [], name

    # The same runs give the same numbers: the bootstrap's seed is fixed.
    np.random.seed(123)  # whatever the global generator's state, it is not used
    again, _ = write_report(runs, tmp_path / "again")
    assert (tmp_path / "again" / "report.md").read_text() == text
    assert (tmp_path / "again" / "report.csv").read_text() == (report / "report.csv").read_text()
    assert again in text


def test_one_seed_or_one_task_says_what_cannot_be_computed(trained: Path, tmp_path: Path) -> None:
    one_task = tmp_path / "one_task"
    for config in ("dt", "primal-dt"):
        for seed, score in enumerate(SCORES["hopper-medium", config]):
            place(trained, one_task / f"{config}-{seed}", config, seed, score=score)
    text, _ = write_report(one_task)
    report = (one_task / "report" / "report.md").read_text()
    for config in ("dt", "primal-dt"):
        assert (
            f"{config}: no aggregates: they need normalised final scores on at least 2 tasks, and "
            "it has them on 1" in report
        )
    assert "| config | tasks |" not in report and "No aggregate figures" in report
    assert not (one_task / "report" / "aggregates.png").exists()
    assert re.search(r"over the 1 task both ran .*: \S+ \[\S+, \S+\]\.", report)

    one_seed = tmp_path / "one_seed"
    for (task, config), scores in SCORES.items():
        place(trained, one_seed / f"{task}-{config}", config, 0, task, scores[0])
    text, _ = write_report(one_seed)
    report = (one_seed / "report" / "report.md").read_text()
    header = cells(text, "| task |")
    row = dict(zip(header, cells(text, "| hopper-medium | dt | 0 |"), strict=True))
    assert row["final 95% CI"] == "a confidence interval needs at least 2 seeds"
    found = cells(report, "| dt | hopper-medium, walker2d-medium |")
    assert found[2] == "2 runs (1 seed × 2 tasks)"
    assert found[3] == f"{trim_mean([40.0, 70.0], 0.25):.1f}"
    assert all("[" not in cell for cell in found)
    assert (
        "- dt: point estimates only: a confidence interval needs at least 2 seeds per task, and "
        "it has 1" in report
    )
    assert re.search(r"P\(primal-dt > dt\).*: 1\.00; a confidence interval needs at least 2 "
                     r"seeds of each config per task\.", report)  # fmt: skip
    caption = next(line for line in report.splitlines() if line.startswith("*aggregates.png*"))
    assert "from 4 runs (dt: 2 runs (1 seed × 2 tasks); primal-dt: 2 runs" in caption


def test_the_papers_table_is_data_beside_the_report() -> None:
    paper = paper_scores()
    columns = ["DT", "Linear", "Reformer", "Performer", "cosFormer", "Flowformer", "Primal.+DT"]
    assert list(paper.columns.values()) == columns  # one config per column (configs/)
    for config in paper.columns:
        assert (resource_dir("configs") / f"{config}.toml").is_file(), config
    assert len(paper.scores) == len(paper.spread) == 9 and paper.seeds == 3
    for task, row in paper.scores.items():
        assert list(row) == list(paper.spread[task]) == columns, task
    for column, average in paper.average.items():  # its average row is the mean of its rows
        assert np.mean([row[column] for row in paper.scores.values()]) == pytest.approx(
            average, abs=0.05
        )
    assert paper.average == dict(
        zip(columns, [72.2, 64.4, 63.9, 63.8, 67.8, 73.5, 77.5], strict=True)
    )
    assert paper.cell("hopper-medium-replay", "dt") == "DT 79.7 ± 7.4"
    assert paper.cell("walker2d-medium-expert", "linear-dt") == "Linear 67.2 ± 27.3"
    assert paper.cell("average", "flowformer-dt") == "Flowformer 73.5 ± 2.9"
    assert paper.cell("hopper-medium-replay", "other").startswith("DT 79.7 ± 7.4 / Linear 74.3")
    assert paper.cell("ant-medium", "dt") == ""
