"""primal-dt report: runs are grouped by the task, config name and seed their config.json records
(never by folder names), a second run of the same (task, config, seed) is named in the notes and
counted once; per task every seed's score, its mean and Student's t interval, the dataset's own
score beside it; aggregates only at enough seeds, each dataset counted once; the paper's numbers in
a table of their own; the report's figures keep every text inside the figure."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import scipy.stats
from conftest import train_args
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from scipy.stats import trim_mean

from primal_dt.cli import main
from primal_dt.common.resources import resource_dir
from primal_dt.data.episodes import ReferenceScores, open_dataset
from primal_dt.data.recording import random_policy, record_episodes, write_dataset
from primal_dt.evaluation import plots
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import read_snapshot, write_snapshot
from primal_dt.tools import study as study_module
from primal_dt.tools.corl import CORL_HEADING, corl_scores, corl_table
from primal_dt.tools.flatness import (
    FLAT,
    FLAT_MARGIN,
    FLATNESS_HEADING,
    flatness,
    quarter_change,
    quarter_slope,
)
from primal_dt.tools.paired import holm, seeds_for
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.report import write_report
from primal_dt.tools.report_data import read_report_data
from primal_dt.tools.report_tables import paper_table, spectrum_sentences
from primal_dt.tools.results_table import (
    NONE_KEPT,
    at_a_glance,
    glance,
    glance_figure,
    results_table,
)
from primal_dt.tools.runs import (
    ReportError,
    Row,
    RunSummary,
    baseline_config,
    collect,
    group,
)
from primal_dt.tools.same_data import data_identity, same_data
from primal_dt.tools.statistics import aggregates


@pytest.fixture(scope="module")
def trained(minari_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny dt run of hopper-medium, seed 0, 10 steps, with a return-conditioning curve."""
    run = tmp_path_factory.mktemp("trained") / "run"
    extra = ("eval.final_episodes=1", "eval.targets=[1800.0]", "train.seed=0")
    assert main(train_args(run, 10, *extra, config="dt")) == 0
    sweep = [
        "eval",
        "--ckpt",
        str(run / "checkpoints" / "step_00000010.pt"),
        "--target-sweep",
        "0:3000:2",
        "--episodes",
        "1",
        "--device",
        "cpu",
    ]
    assert main(sweep) == 0
    return run


def default_ids(task: str) -> list[str]:
    """The dataset ids a task name stands for here: a dataset id as it is, else the official one
    (hopper-medium: mujoco/hopper/medium-v0), so that every task of a test has data of its own."""
    if "/" in task:
        return [task]
    env, _, quality = task.partition("-")
    return [f"mujoco/{env}/{quality}-v0"]


def place(
    run: Path,
    folder: Path,
    config: str | None = None,
    seed: int | None = None,
    task: str | None = None,
    score: float | None = None,
    reference: bool = True,
    during: float | None = None,
    ids: list[str] | None = None,
) -> None:
    """A copy of run in folder, recorded in its config.json as this config name, seed and task;
    its evaluations at their first target scoring `score` where given; with an evaluation during
    training (step 5) scoring `during` where given; recording the dataset ids `ids` (default: the
    task's, default_ids); without reference scores (and without its checkpoint, which holds them
    too) where reference is False."""
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
    ids = ids or default_ids(data["task"])
    path = folder / "eval.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in records:
        first = record["results"][0]
        if score is not None:
            record["score"] = first["normalized_mean"] = first["return_mean"] = score
        if not reference:
            record["reference"] = first["normalized_mean"] = None
        record["dataset_ids"] = ids
    if during is not None:
        early = json.loads(json.dumps(records[0]))
        early.update(step=5, final=False)
        early["score"] = early["results"][0]["normalized_mean"] = during
        records.insert(0, early)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    checkpoint = folder / "ckpt.pt"
    if not reference:
        checkpoint.unlink()
    else:
        snapshot = read_snapshot(checkpoint)
        task_record = replace(snapshot.task, name=data["task"], dataset_ids=tuple(ids))
        write_snapshot(checkpoint, replace(snapshot, task=task_record))


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


def cells(table: str, start: str) -> list[str]:
    """The cells of the table's line that starts with `start`."""
    line = next(line for line in table.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def table_rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The per-task table of report.md (or of markdown_table's text): (task, config) -> column ->
    cell."""
    table = text.split("## Comparisons")[0]
    header = cells(table, "| task |")
    found = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith(("| task |", "|---")):
            row = dict(zip(header, [c.strip() for c in line.strip("|").split("|")], strict=True))
            found[row["task"].strip("*"), row["config"]] = row
    return found


def interval(text: str) -> tuple[float, float, float]:
    """(point, low, high) of "point [low, high]"."""
    found = re.fullmatch(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", text)
    assert found, text
    point, low, high = map(float, found.groups())
    assert low <= point <= high, text
    return point, low, high


def section(text: str, title: str) -> str:
    """The text of report.md's section `## title`, up to the next section."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


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
    assert list(rows) == [
        ("hopper-medium", "dt"),
        ("hopper-medium", "primal-dt"),
        ("average", "dt"),
        ("average", "primal-dt"),
    ]
    dt, primal = rows["hopper-medium", "dt"], rows["hopper-medium", "primal-dt"]
    assert dt["seeds"] == "0 1 2 3" and dt["n_final"] == "4"
    assert primal["seeds"] == "0" and primal["n_final"] == "1"
    assert (
        "| hopper-medium | dt | 0,1,2,3 |" in table and "| hopper-medium | primal-dt | 0 |" in table
    )
    assert " seeds)" not in table  # every seed has its scores: no "(k of n seeds)"
    # The copies score alike, so a mean over any number of them is the run's own score, at the
    # run's first (here its only) target.
    record = json.loads((trained / "eval.jsonl").read_text().splitlines()[-1])
    final = record["results"][0]["normalized_mean"]
    assert float(dt["final_mean"]) == pytest.approx(final, abs=1e-4)
    assert dt["final_scores"] == " ".join([f"{final:.4f}"] * 4) and dt["target"] == "1800"
    # No run was evaluated during training: no best column, in the table or the CSV.
    assert "n_best" not in dt and "best (max" not in table
    text = (report / "report.md").read_text()
    assert "No best column: no run was evaluated during training" in text

    # The dataset's own normalised return, from its episodes and the runs' reference scores.
    episodes = open_dataset("mujoco/hopper/medium-v0", download=False).iterate_episodes()
    returns = [float(np.sum(episode.rewards)) for episode in episodes]
    behaviour = ReferenceScores(**record["reference"]).normalize(np.array(returns)).mean()
    assert float(dt["dataset_behaviour"]) == pytest.approx(behaviour, abs=1e-4)
    assert table_rows(table)["hopper-medium", "dt"]["dataset (behaviour)"] == f"{behaviour:.1f}"
    # The parameter count of the model the checkpoint holds, so a comparison shows its sizes.
    model = read_snapshot(RunDir(trained).checkpoint).build_model()
    count = sum(p.numel() for p in model.parameters())
    assert dt["parameters"] == str(count)
    assert table_rows(table)["hopper-medium", "dt"]["parameters"] == f"{count:,}"

    assert "5 runs" in text and "1 duplicate" in text
    notes = text.split("## Notes")[1]
    duplicate = [line for line in notes.splitlines() if "zz-again" in line]
    assert len(duplicate) == 1 and str(runs / "a") in duplicate[0], notes
    assert "hopper-medium/dt-s0" in duplicate[0]

    # Every figure the report wrote, the return-conditioning curve included, keeps its texts inside.
    names = sorted(path.name for path, _ in saved)
    assert names == [
        "curves_hopper-medium.png",
        "return_curve_hopper-medium.png",
        "spectrum_hopper-medium.png",
    ]
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
    # Every seed's last score is a dot beside the mean and band (here two seeds, one far off).
    two = plots.curves_figure(task, {"dt": [*series, [(0, 1.0), (10, 9.0)]]}, {}, "score")
    (dots,) = [line for line in two.axes[0].get_lines() if line.get_marker() == "o"]
    assert sorted(dots.get_ydata()) == [3.0, 9.0] and list(dots.get_xdata()) == [10.0, 10.0]
    for figure in (one_panel, one_block, curves):
        assert outside(figure) == []
        # The whole title is still there (wrapped, not shortened away).
        assert task in " ".join(figure.get_suptitle().split())


# Final scores per (task, config), one per seed 0, 1, 2: on hopper-medium overlapping between the
# configs, on walker2d-medium apart.
SCORES = {
    ("hopper-medium", "dt"): [40.0, 55.0, 47.0],
    ("hopper-medium", "primal-dt"): [52.0, 44.0, 61.0],
    ("walker2d-medium", "dt"): [70.0, 81.0, 64.0],
    ("walker2d-medium", "primal-dt"): [110.0, 112.0, 114.0],
}
NO_REFERENCE = "test/hopper/random-v0"  # a dataset-id task: no reference scores
# Five seeds (0-4) per (task, config): enough for the aggregates.
SCORES5 = {
    ("hopper-medium", "dt"): [40.0, 55.0, 47.0, 51.0, 44.0],
    ("hopper-medium", "primal-dt"): [52.0, 44.0, 61.0, 58.0, 49.0],
    ("walker2d-medium", "dt"): [70.0, 81.0, 64.0, 75.0, 68.0],
    ("walker2d-medium", "primal-dt"): [77.0, 90.0, 120.0, 85.0, 95.0],  # one above 100: clipped
}


def t95(values: list[float]) -> tuple[float, float]:
    """Student's t 95% interval of the mean, by scipy's own t.interval."""
    low, high = scipy.stats.t.interval(
        0.95, len(values) - 1, loc=np.mean(values), scale=scipy.stats.sem(values)
    )
    return float(low), float(high)


def test_per_task_scores_intervals_comparisons_and_the_papers_table(
    trained: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for (task, config), scores in SCORES.items():
        for seed, score in enumerate(scores):
            during = score + 5.0 if config == "primal-dt" else None  # evaluated during training
            place(
                trained, runs / f"{task}-{config}-{seed}", config, seed, task, score, True, during
            )
    for seed in (0, 1):
        place(trained, runs / f"none-{seed}", "dt", seed, NO_REFERENCE, reference=False)
    text, _ = write_report(runs)
    report = runs / "report"
    md = (report / "report.md").read_text()
    table = table_rows(md)
    assert table == table_rows(text)  # write_report returns the per-task table
    corl = md[md.index(CORL_HEADING) : md.index("## Figures")]  # after the paper's table
    assert FLATNESS_HEADING in md and "nothing to say" in md.split(FLATNESS_HEADING)[1][:600]
    assert md.index("## The paper's table") < md.index(CORL_HEADING)
    assert "| hopper-medium | 10 steps, " in corl and "| 65.1 ± 1.6 | 69.4 ± 3.6 |" in corl

    # Per task and config: every seed's score, their mean, their Student's t 95% interval.
    row = table["hopper-medium", "dt"]
    assert row["final, per seed"] == "40.0, 55.0, 47.0"
    assert row["final mean"] == "47.3" and "±" not in row["final mean"]
    low, high = t95(SCORES["hopper-medium", "dt"])
    assert row["final 95% interval (Student's t)"] == f"[{low:.1f}, {high:.1f}]"
    assert "t(0.975, n − 1) · s / √n" in md and "(ddof 1)" in md
    assert "not over other datasets" in md
    csv_rows = {(r["task"], r["config"]): r for r in csv.DictReader((report / "report.csv").open())}
    hopper = csv_rows["hopper-medium", "dt"]
    assert float(hopper["final_t95_low"]) == pytest.approx(low, abs=1e-4)
    assert float(hopper["final_t95_high"]) == pytest.approx(high, abs=1e-4)
    assert float(hopper["final_std_ddof1"]) == pytest.approx(
        np.std(SCORES["hopper-medium", "dt"], ddof=1), abs=1e-4
    )
    assert hopper["final_scores"] == "40.0000 55.0000 47.0000"
    assert "paper" not in hopper and "final_ci_low" not in hopper
    # A task without reference scores keeps its return, marked.
    assert table[NO_REFERENCE, "dt"]["final mean"].endswith("(return)")
    assert table[NO_REFERENCE, "dt"]["dataset (behaviour)"].endswith("(return)")
    # The dataset's own score: hopper-medium's is here, walker2d-medium's is not.
    assert re.fullmatch(r"-?\d+\.\d", table["hopper-medium", "dt"]["dataset (behaviour)"])
    assert table["walker2d-medium", "dt"]["dataset (behaviour)"] == "n/a (dataset not here)"
    assert csv_rows["walker2d-medium", "dt"]["dataset_behaviour"] == ""
    assert all(r["target"] == "1800" for key, r in table.items() if key[0] != "average")

    # best: where a group's runs were evaluated during training, its max over evaluations.
    best = "best (max over evaluations)"
    assert table["hopper-medium", "primal-dt"][best] == f"{np.mean([57.0, 49.0, 66.0]):.1f}"
    assert table["hopper-medium", "dt"][best] == "no evaluations during training"
    assert "a max over evaluations, so optimistic" in md
    assert csv_rows["hopper-medium", "primal-dt"]["best_mean"] == f"{np.mean([57, 49, 66]):.4f}"

    # Sentences from the paired differences (the same seeds): their interval includes 0 on
    # hopper-medium, not on walker2d-medium; with the power there.
    # The two per-task tests are one family: Holm's adjusted p beside each uncorrected one.
    comparisons = section(md, "Comparisons per task")
    tested = {
        task: scipy.stats.ttest_rel(SCORES[task, "primal-dt"], SCORES[task, "dt"])
        for task in ("hopper-medium", "walker2d-medium")
    }
    adjusted = dict(zip(tested, holm([found.pvalue for found in tested.values()]), strict=True))
    for task, claim in (
        ("hopper-medium", "no difference detected"),
        ("walker2d-medium", "primal-dt scores above dt"),
    ):
        mine, base = SCORES[task, "primal-dt"], SCORES[task, "dt"]
        low, high = tested[task].confidence_interval(0.95)
        mean = np.mean(mine) - np.mean(base)
        assert (
            f"primal-dt − dt on {task}: {mean:+.1f} [{low:+.1f}, {high:+.1f}] over 3 paired "
            f"seeds (p = {tested[task].pvalue:.3f}, Holm-adjusted over the 2 per-task tests "
            f"{adjusted[task]:.3f}): {claim}; the study could detect "
        ) in comparisons

    # Three seeds per task: no aggregates, and one sentence says what is missing and why.
    aggregated = section(md, "Aggregates over tasks")
    assert "| config | tasks |" not in aggregated and not (report / "aggregates.png").exists()
    assert (
        "No aggregates over tasks and no probability of improvement: they need at least 5 seeds "
        "of each config on each of at least 2 tasks (with fewer, a stratified bootstrap interval "
        "covers the true value much less often than its nominal 95%), and these runs have dt: 3 "
        "final scores on hopper-medium, 3 on walker2d-medium; primal-dt: 3 final scores on "
        "hopper-medium, 3 on walker2d-medium." in aggregated
    )
    assert f"{NO_REFERENCE} (dt): no reference scores" in aggregated  # left out, said so

    # The paper's numbers: never in our table, in a table of their own.
    assert all("DT 64.2" not in cell for row in table.values() for cell in row.values())
    paper = section(md, "The paper's table")
    assert "not directly comparable" in paper and "a million steps" in paper
    assert "Flowformer reproduction of DT" in paper and "gym v3" in paper
    assert "- hopper-medium: DT 64.2 ± 1.1 / Linear 58.7 ± 0.4" in paper
    assert "| hopper-medium | 64.2 ± 1.1 | 58.7 ± 0.4 |" in paper


def test_aggregates_with_enough_seeds_and_the_same_numbers_twice(
    trained: Path, tmp_path: Path, saved_figures: list[tuple[Path, Any]]
) -> None:
    runs = tmp_path / "runs"
    for (task, config), scores in SCORES5.items():
        for seed, score in enumerate(scores):
            place(trained, runs / f"{task}-{config}-{seed}", config, seed, task, score)
    for task in ("hopper-medium", "walker2d-medium"):  # a third config, of 3 seeds only
        for seed, score in enumerate([20.0, 22.0, 21.0]):
            place(trained, runs / f"{task}-linear-{seed}", "linear-dt", seed, task, score)
    assert main(["report", str(runs)]) == 0
    saved = {path.name: figure for path, figure in saved_figures}
    report = runs / "report"
    text = (report / "report.md").read_text()
    aggregated = section(text, "Aggregates over tasks")

    # Across tasks, per config: IQM, mean and optimality gap with their intervals, and the
    # intervals' simulated coverage at this report's shape.
    for config in ("dt", "primal-dt"):
        found = cells(aggregated, f"| {config} | hopper-medium, walker2d-medium |")
        assert found[2] == "10 runs (5 seeds × 2 tasks)"
        scores = np.array([SCORES5["hopper-medium", config], SCORES5["walker2d-medium", config]])
        iqm, mean, gap = (interval(cell)[0] for cell in found[3:6])
        assert iqm == pytest.approx(trim_mean(scores.ravel(), 0.25), abs=0.05)
        assert mean == pytest.approx(scores.mean(), abs=0.05)
        assert gap == pytest.approx(100 - np.minimum(scores, 100).mean(), abs=0.05)
        assert re.fullmatch(
            r"nominal 95%; \d+% in a simulation of normal scores at 5 seeds × 2 tasks", found[6]
        ), found[6]
    assert "not other datasets, tasks or environments" in aggregated
    # The config of 3 seeds: no aggregates and no probability of improvement, said why.
    assert "| linear-dt |" not in aggregated
    assert (
        "- linear-dt: no aggregates over tasks: they need at least 5 seeds of each config on "
        "each of at least 2 tasks (with fewer, a stratified bootstrap interval covers the true "
        "value much less often than its nominal 95%), and it has 3 final scores on "
        "hopper-medium, 3 on walker2d-medium." in aggregated
    )
    assert (
        "No probability of improvement P(linear-dt > dt): they need at least 5 seeds of each "
        "config on each of at least 2 tasks" in aggregated
    )
    assert "and these runs have linear-dt: 3 final scores on hopper-medium" in aggregated
    # Every config against dt, on every task: linear-dt's 3 seeds lie below dt's.
    comparisons = section(text, "Comparisons per task")
    assert "linear-dt − dt on hopper-medium: " in comparisons
    found, _ = aggregates(group(collect(runs, skip=report, spectra=False)))
    primal = next(agg for agg in found if agg.config == "primal-dt")
    flat = np.array(SCORES5["hopper-medium", "primal-dt"] + SCORES5["walker2d-medium", "primal-dt"])
    assert primal.points[0] == pytest.approx(trim_mean(flat, 0.25))

    # Primal-DT against DT: P(a primal-dt run beats a dt run on the same task), ties count half.
    found_p = re.search(
        r"P\(primal-dt > dt\).* the 2 tasks both ran .*: (\S+ \[\S+, \S+\])\.", aggregated
    )
    assert found_p, aggregated
    point, low, high = interval(found_p.group(1))
    by_hand = []
    for task in ("hopper-medium", "walker2d-medium"):
        x = np.array(SCORES5[task, "primal-dt"])[:, None]
        y = np.array(SCORES5[task, "dt"])[None, :]
        by_hand.append((x > y).mean() + 0.5 * (x == y).mean())
    assert point == pytest.approx(np.mean(by_hand), abs=0.005) and low < high

    # The figures, each with a caption that counts its runs; their texts stay inside them.
    counts = (
        "from 20 runs (dt: 10 runs (5 seeds × 2 tasks); primal-dt: 10 runs (5 seeds × 2 tasks))"
    )
    for name in ("aggregates.png", "performance_profile.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name[:-4]}]({name})" in aggregated
        caption = next(line for line in aggregated.splitlines() if line.startswith(f"*{name}*"))
        assert counts in caption and "2000 resamples, seed 0" in caption, caption
        assert outside(saved[name]) == [], name

    # report.json: the figures the text shows, as data, read back by their names.
    data = read_report_data(report / "report.json")
    assert data.baseline == "dt" and data.runs == 26 and data.dirs == [str(runs)]
    by_name = {(p.task, p.config): p for p in data.paired}
    assert set(by_name) == {
        (t, c) for t in ("hopper-medium", "walker2d-medium") for c in ("primal-dt", "linear-dt")
    }
    for (task, config), paired in by_name.items():
        mine = SCORES5[task, config] if config == "primal-dt" else [20.0, 22.0, 21.0]
        differences = [a - b for a, b in zip(mine, SCORES5[task, "dt"], strict=False)]
        assert paired.differences == pytest.approx(differences)
        low, high = paired.interval
        said = f"{config} − dt on {task}: {paired.mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        assert said in comparisons, said
        assert f"could detect {paired.detectable:.1f} points" in comparisons
    (over,) = [o for o in data.over_tasks if o.config == "primal-dt"]
    assert over.tasks == ["hopper-medium", "walker2d-medium"] and over.pairs == 5
    assert f"could detect {over.detectable:.1f} points" in text
    (aggregate,) = [a for a in data.aggregates if a.config == "primal-dt"]
    assert aggregate.points["IQM"] == pytest.approx(primal.points[0])
    assert aggregate.seeds == 5 and aggregate.intervals["IQM"][0] <= aggregate.points["IQM"]
    # report.md is its sections, each by its heading, with the figures it shows.
    rendered = [f"## {s.heading}\n\n{s.body}" for s in data.sections]
    assert text == "\n\n".join([text.split("\n\n")[0], data.lead, *rendered]) + "\n"
    shown = data.section("Aggregates over tasks")
    assert shown is not None and shown.figures == ["aggregates.png", "performance_profile.png"]
    assert data.section("Comparisons per task") is not None and data.section("nothing") is None
    over_section = data.section("Paired differences over tasks")  # written by the same builder
    assert over_section is not None and "primal-dt − dt over 2 tasks" in over_section.body
    assert data.study is not None and data.study.seeds == [0, 1, 2, 3, 4]
    assert data.study.configs == ["dt", "linear-dt", "primal-dt"]
    assert data.study.tasks == ["hopper-medium", "walker2d-medium"]

    # The same runs give the same numbers: the bootstrap's seed is fixed.
    np.random.seed(123)  # whatever the global generator's state, it is not used
    again, _ = write_report(runs, tmp_path / "again")
    assert (tmp_path / "again" / "report.md").read_text() == text
    assert (tmp_path / "again" / "report.json").read_text() == (report / "report.json").read_text()
    assert (tmp_path / "again" / "report.csv").read_text() == (report / "report.csv").read_text()
    assert again in text
    # The same runs made in two parts (a task in each folder), read together: the same report.
    for folder in runs.iterdir():
        if folder.name != "report":
            part = tmp_path / ("walker" if folder.name.startswith("walker2d") else "hopper")
            shutil.copytree(folder, part / folder.name)
    together = tmp_path / "together"
    command = ["report", str(tmp_path / "hopper"), str(tmp_path / "walker"), "--out", str(together)]
    assert main(command) == 0
    title, body = (together / "report.md").read_text().split("\n", 1)
    assert title == f"# primal-dt report: {tmp_path / 'hopper'}, {tmp_path / 'walker'}"
    assert body == text.split("\n", 1)[1]
    # The report's copy of the runs (small text, no checkpoint): the same report again, from it
    # alone, as the results page's data in the repository makes it.
    exported = report / "runs"
    assert not list(exported.rglob("*.pt")) and len(list(exported.rglob("facts.json"))) == 26
    size = sum(path.stat().st_size for path in exported.rglob("*") if path.is_file())
    assert size < 26 * 50_000, size
    assert main(["report", str(exported), "--out", str(tmp_path / "from_data")]) == 0
    again_text = (tmp_path / "from_data" / "report.md").read_text()
    assert again_text.split("\n", 1)[1] == text.split("\n", 1)[1]
    from_data = read_report_data(tmp_path / "from_data" / "report.json")
    assert dataclasses.replace(from_data, dirs=data.dirs) == data
    # A report whose copy of the runs would replace the runs it reads is refused, nothing lost.
    assert main(["report", str(exported), "--out", str(report)]) == 2
    assert len(list(exported.rglob("facts.json"))) == 26
    assert main(["report", str(runs), "--out", str(runs.parent)]) == 2  # out/runs is the input
    assert len(list(runs.rglob("ckpt.pt"))) == 26


def test_one_seed_or_one_task_says_what_cannot_be_computed(trained: Path, tmp_path: Path) -> None:
    one_task = tmp_path / "one_task"
    for config in ("dt", "primal-dt"):
        for seed, score in enumerate(SCORES5["hopper-medium", config]):
            place(trained, one_task / f"{config}-{seed}", config, seed, score=score)
    write_report(one_task)
    report = (one_task / "report" / "report.md").read_text()
    assert (
        "No aggregates over tasks and no probability of improvement: they need at least 5 seeds "
        "of each config on each of at least 2 tasks" in report
    )
    assert (
        "and these runs have dt: normalised final scores on 1 task; primal-dt: normalised final "
        "scores on 1 task." in report
    )
    assert "| config | tasks |" not in report and "No aggregate figures" in report
    assert not (one_task / "report" / "aggregates.png").exists()

    one_seed = tmp_path / "one_seed"
    for (task, config), scores in SCORES.items():
        place(trained, one_seed / f"{task}-{config}", config, 0, task, scores[0])
    text, _ = write_report(one_seed)
    report = (one_seed / "report" / "report.md").read_text()
    row = table_rows(text)["hopper-medium", "dt"]
    assert row["final, per seed"] == "40.0" and row["final mean"] == "40.0"
    assert row["final 95% interval (Student's t)"] == "none: 1 seed (an interval needs at least 2)"
    assert (
        "primal-dt against dt on hopper-medium: no comparison, primal-dt and dt have fewer than "
        "2 seeds (no interval)." in report
    )
    assert "| config | tasks |" not in report
    assert "dt: 1 final score on hopper-medium, 1 on walker2d-medium;" in report


def test_a_dataset_is_counted_once(trained: Path, tmp_path: Path, minari_root: Path) -> None:
    """Two datasets recorded alike (the same recipe, policy file and seed) under two ids are the
    same data: the second task of them is named in the notes and left out of the averages."""
    hopper = "Hopper-v5"
    made = {
        "recipe": "policy",
        "env_id": hopper,
        "seed": 7,
        "episodes": 2,
        "policy": {"file": "a.zip", "sha256": "ab" * 32, "algorithm": "SAC"},
    }
    for name in ("twin-a", "twin-b"):
        episodes = record_episodes(hopper, random_policy(gym.make(hopper).action_space, 7), 2, 7)
        write_dataset(f"test/hopper/{name}-v0", hopper, episodes, provenance=made)
    runs = tmp_path / "runs"
    place(trained, runs / "medium")
    for name in ("twin-a", "twin-b"):
        place(trained, runs / name, task=f"hopper-{name}", ids=[f"test/hopper/{name}-v0"])
    text, _ = write_report(runs)
    report = (runs / "report" / "report.md").read_text()
    notes = section(report, "Notes")
    assert (
        "- hopper-twin-b and hopper-twin-a: their datasets are the same data (recipe policy on "
        "Hopper-v5, policy sha256 abababababab, seed 7); the aggregates and average rows count "
        "it once, as hopper-twin-a" in notes
    )
    assert "hopper-twin-b is left out of the aggregates and the average rows" in report
    rows = {
        (r["task"], r["config"]): r for r in csv.DictReader((runs / "report" / "report.csv").open())
    }
    assert rows["average", "dt"]["n_final"] == "2"  # hopper-medium and hopper-twin-a
    assert "(2 of" not in table_rows(text)["average", "dt"]["final mean"]


def test_same_data_by_provenance_or_ids() -> None:
    recorded = {"recipe": "random", "env_id": "Hopper-v5", "seed": 0, "policy": "uniform-random"}
    combined = {
        "recipe": "medium-expert",
        "env_id": "Hopper-v5",
        "seed": 0,
        "sources": [
            {"id": "mujoco/hopper/medium-v0", "provenance": None},
            {"id": "mujoco/hopper/expert-v0", "provenance": None},
        ],
    }
    provenance = {
        "local/a-v0": recorded,
        "local/b-v0": {**recorded, "created": "later"},
        "local/c-v0": {**recorded, "seed": 1},
        "local/me-v0": combined,
    }
    datasets = {
        "hopper-a": ["local/a-v0"],
        "hopper-b": ["local/b-v0"],  # a's recipe, environment and seed: the same data
        "hopper-c": ["local/c-v0"],  # another seed: other data
        "hopper-medium-expert": ["mujoco/hopper/medium-v0", "mujoco/hopper/expert-v0"],
        "hopper-me": ["local/me-v0"],  # the same two parts, combined into one dataset
        "hopper-medium": ["mujoco/hopper/medium-v0"],  # a part only: not the same data
        "mujoco/hopper/medium-v0": ["mujoco/hopper/medium-v0"],  # its dataset under its id
    }
    found = same_data(datasets, provenance.get)
    assert [(s.task, s.same_as) for s in found] == [
        ("hopper-b", "hopper-a"),
        ("hopper-medium-expert", "hopper-me"),
        ("mujoco/hopper/medium-v0", "hopper-medium"),
    ]
    assert data_identity("x/y-v0", lambda _: None) == frozenset({("id", "x/y-v0")})


def test_the_papers_table_is_data_of_its_own() -> None:
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

    # Rendered: its 9 rows, environment by environment, then its average, every column with its
    # ± as printed; the tasks of ours it has, in words below it.
    text = paper_table(paper, ["hopper-medium", "ant-medium"])
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0] == "| task (D4RL v2) | " + " | ".join(columns) + " |"
    tasks = [line.split(" | ")[0].strip("| ") for line in lines[1:]]
    assert tasks == [
        f"{env}-{quality}"
        for env in ("halfcheetah", "hopper", "walker2d")
        for quality in ("medium", "medium-replay", "medium-expert")
    ] + ["**average**"]
    assert lines[-1] == (
        "| **average** | 72.2 ± 2.6 | 64.4 ± 6.5 | 63.9 ± 2.9 | 63.8 ± 7.6 | "
        "67.8 ± 7.6 | 73.5 ± 2.9 | 77.5 ± 6.0 |"
    )
    assert "| walker2d-medium-expert | 107.7 ± 0.6 | 67.2 ± 27.3 |" in text
    assert "D4RL v2 datasets of a million steps" in text and "D4RL's reference scores" in text
    assert "- hopper-medium: DT 64.2 ± 1.1" in text and "ant-medium" not in text


def test_a_curve_is_flat_only_where_its_slope_is_known_to_be_inside_the_margin() -> None:
    """The slope over the end of training, seed by seed, against a direct computation (the
    change between the last two quarters over the S/4 steps between their middles), and an
    equivalence test: seeds that barely move are flat, seeds that move both ways widely are not
    known to be flat (no longer "flat" for an interval that merely holds 0), rising seeds are
    still rising."""

    def run(config: str, seed: int, curve: list[float]) -> RunSummary:
        summary = RunSummary(Path(config), "hopper-medium", config, seed, 800, ["softmax"])
        summary.scores = [(100 * (i + 1), score) for i, score in enumerate(curve)]  # steps 100-800
        return summary

    # Steps 500 and 600 are the third quarter, 700 and 800 the last (the final evaluation).
    assert (
        quarter_change([(100, 9.0), (500, 10.0), (600, 12.0), (700, 15.0), (800, 17.0)], 800)
        == (15.0 + 17.0) / 2 - (10.0 + 12.0) / 2
    )
    assert quarter_change([(100, 9.0), (800, 17.0)], 800) is None
    rising = [run("up", seed, [0, 0, 0, 0, 10, 10, 14 + seed, 15]) for seed in range(3)]
    level = [
        run("level", s, [0, 0, 0, 0, 10, 10, 10 + d, 10 + d])
        for s, d in enumerate([-0.1, 0.1, 0.05])
    ]
    wide = [
        run("wide", s, [0, 0, 0, 0, 10, 10, 10 + d, 10 + d]) for s, d in enumerate([-2, 2, 0.5])
    ]
    alone = [run("alone", 0, [0] * 8)]
    slopes = [((14 + seed + 15) / 2 - 10) / 200 * 1000 for seed in range(3)]  # S/4 = 200 steps
    assert quarter_slope(rising[0].scores, 800) == pytest.approx(slopes[0])
    low, high = t95(slopes)
    found = {curve.config: curve for curve in flatness([*rising, *level, *wide, *alone])}
    assert sorted(found) == ["level", "up", "wide"]  # one seed: no interval, no verdict
    up = found["up"]
    assert up.slopes == pytest.approx(slopes) and up.interval == pytest.approx((low, high))
    assert up.sentence() == (
        f"up on hopper-medium: a slope of {np.mean(slopes):+.1f} [{low:+.1f}, {high:+.1f}] points "
        f"per 1,000 steps over 3 seeds (90%: [{up.equivalence[0]:+.1f}, "
        f"{up.equivalence[1]:+.1f}]): still rising."
    )
    assert found["level"].flat and found["level"].verdict == FLAT
    assert (
        -FLAT_MARGIN < found["level"].equivalence[0] < found["level"].equivalence[1] < FLAT_MARGIN
    )
    wide_interval = found["wide"].interval
    assert wide_interval[0] < 0 < wide_interval[1] and not found["wide"].flat
    assert found["wide"].verdict.startswith("not known to be flat")


def test_corl_side_table_sets_the_baseline_beside_corls_dt() -> None:
    """The baseline's mean and Student's t interval here beside CORL's published DT (the file's
    numbers, as its README printed them), the ratio of the means; other configs and tasks CORL
    lacks are left out, and nothing to set beside it is no section."""
    corl = corl_scores()
    assert corl.steps == 100000 and len(corl.last) == len(corl.best) == 9
    assert corl.last["halfcheetah-medium"] == (42.2, 0.26)
    assert corl.best["walker2d-medium-expert"] == (108.71, 0.34)

    def row(task: str, config: str, final: list[float]) -> Row:
        seeds = list(range(len(final)))
        return Row(task, config, seeds, final, [], [6000], True, [], [], [215000])

    rows = [
        row("halfcheetah-medium", "dt", [30.0, 34.0, 38.0]),
        row("hopper-medium", "bc", [9.0]),
        row("swimmer-medium", "dt", [20.0, 22.0]),
    ]
    text = corl_table(rows, "dt", corl)
    low, high = t95([30.0, 34.0, 38.0])
    assert text.startswith(CORL_HEADING)
    assert (
        f"| halfcheetah-medium | 6,000 steps, 215,000 parameters | 34.0 [{low:.1f}, {high:.1f}] "
        f"| n/a | 42.2 ± 0.3 | 42.7 ± 0.1 | {34.0 / 42.2:.2f} |"
    ) in text  # no reference scores given: the fraction on ours
    # With the task's reference scores: the same returns on D4RL's (envs/halfcheetah.toml), and
    # the fraction on that one scale.
    ours = ReferenceScores(-250.0, 11500.0, "measured here")
    returns = -250.0 + 34.0 / 100 * (11500.0 + 250.0)
    d4rl = 100 * (returns - (-280.178953)) / (12135.0 - (-280.178953))
    scaled = corl_table(rows, "dt", corl, {"halfcheetah-medium": ours})
    assert f"| {d4rl:.1f} | 42.2 ± 0.3 | 42.7 ± 0.1 | {d4rl / 42.2:.2f} |" in scaled
    assert "hopper-medium" not in text and "swimmer" not in text
    assert (
        "| hopper-medium | 6,000 steps, 215,000 parameters | 9.0 one seed | n/a | 65.1 ± 1.6 "
        in (corl_table(rows, "bc", corl))
    )
    assert corl_table(rows[2:], "dt", corl) == ""


def test_the_baseline_is_the_decision_transformer_whatever_its_name() -> None:
    """DT is found by what it is (softmax in every block, conditioned on returns), not by its
    config's name; behaviour cloning with the same network is not DT; --baseline chooses."""

    def run(config: str, kinds: list[str], conditioned: bool = True) -> RunSummary:
        return RunSummary(Path(config), "hopper-medium", config, 0, 10, kinds, conditioned)

    softmax, last_primal = ["softmax"] * 3, ["softmax", "softmax", "primal"]
    matched = [
        run("matched-primal", last_primal),
        run("matched-bc", softmax, False),
        run("matched-softmax", softmax),
        run("matched-linear", ["linear"] * 3),
    ]
    assert baseline_config(matched) == "matched-softmax"
    assert baseline_config([*matched, run("my-dt", softmax)]) == "matched-softmax"  # first by name
    assert baseline_config(matched[:2]) == "matched-bc"  # no DT: the first config by name
    assert baseline_config(matched, "matched-primal") == "matched-primal"
    assert baseline_config([]) is None
    with pytest.raises(
        ReportError,
        match=r"--baseline matched-primall: no run here has that "
        r"config \(did you mean 'matched-primal'\?\); the configs here: ",
    ):
        baseline_config(matched, "matched-primall")


def test_report_baseline_on_the_command_line(trained: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    for config in ("dt", "primal-dt"):
        for seed, score in enumerate(SCORES5["hopper-medium", config]):
            place(trained, runs / f"{config}-{seed}", config, seed, score=score)
    capsys.readouterr()
    assert main(["report", str(runs), "--baseline", "primal_dt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "primal-dt: error: --baseline primal_dt: no run here has that config (did you mean "
        "'primal-dt'?); the configs here: dt, primal-dt"
    ]
    assert not (runs / "report").exists()  # nothing written
    assert main(["report", str(runs), "--baseline", "primal-dt"]) == 0
    report = (runs / "report" / "report.md").read_text()
    assert "Every config against primal-dt (the baseline" in report
    assert "- dt − primal-dt on hopper-medium: " in report


BLOCKED = """import sys
class Blocked:  # a lent GPU's image: no report extra
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rliable", "scipy", "pandas", "tomli_w"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Blocked())
from primal_dt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_data_only_sends_what_a_report_reads_again_without_the_report_extra(
    trained: Path, tmp_path: Path
) -> None:
    """`report --data-only` on a machine without rliable, scipy or pandas writes only the runs'
    copy, from which the report made here is the one the runs themselves make."""
    runs = tmp_path / "runs"
    for config in ("dt", "primal-dt"):
        for seed, score in enumerate(SCORES5["hopper-medium", config]):
            place(trained, runs / f"{config}-{seed}", config, seed, score=score)
    sent = tmp_path / "sent"
    command = [
        sys.executable,
        "-c",
        BLOCKED,
        "report",
        str(runs),
        "--out",
        str(sent),
        "--data-only",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sent / "runs") and sorted(
        p.name for p in sent.iterdir()
    ) == ["runs"]
    write_report(runs, tmp_path / "direct")
    write_report(sent / "runs", tmp_path / "again")
    direct, again = (
        (tmp_path / name / "report.md").read_text().split("\n", 1)[1]
        for name in ("direct", "again")
    )
    assert again == direct
    assert main(["report", str(runs), "--data-only", "--baseline", "dt"]) == 2


def _spectrum_run(config: str, seed: int, kinds: list[str], ranks: list[int]) -> RunSummary:
    """A run whose block b's cumulative spectrum reaches 90% at exactly ranks[b] values."""
    curves = [np.where(np.arange(1, 61) < r, 0.5, 1.0) for r in ranks]
    return RunSummary(Path(config), "hopper-medium", config, seed, 100, kinds, spectra=curves)


def test_spectrum_sentences_compare_the_same_block_of_the_matched_configs_first() -> None:
    """The one change of the study (block 2: Primal against softmax) is judged first, from the
    spread over seeds; a difference within the stds' sum is no difference detected."""
    runs = [
        *[_spectrum_run("m-primal", s, ["softmax", "primal"], [11 + s, 3 + s]) for s in (0, 1)],
        *[_spectrum_run("m-softmax", s, ["softmax", "softmax"], [12 - s, 11 + s]) for s in (0, 1)],
    ]
    sentences = spectrum_sentences(runs)
    assert len(sentences) == 2
    assert sentences[0].startswith(
        "hopper-medium, block 1: m-primal (Primal) has a lower rank_90 than m-softmax (softmax)"
    )
    assert sentences[1].startswith(
        "hopper-medium (m-primal): Primal block 1 has a lower rank_90 than softmax block 0"
    )
    close = [_spectrum_run("m-softmax", s, ["softmax", "softmax"], [11, 4 + 2 * s]) for s in (0, 1)]
    assert "no difference detected" in spectrum_sentences(runs[:2] + close)[0]


def test_the_results_table_sets_dt_primal_and_bc_side_by_side_from_kept_runs(
    trained: Path, tmp_path: Path
) -> None:
    """results_table over the report's copy of a matched study: each config's mean and interval,
    the paired difference with its Holm-adjusted p over the table's datasets, what the study could
    detect, CORL's DT, and the mean over the datasets with the seeds the paper's gap would need."""
    scores = {
        ("hopper-medium", "matched-softmax"): [40.0, 55.0, 47.0],
        ("hopper-medium", "matched-primal"): [52.0, 44.0, 61.0],
        ("hopper-medium", "matched-bc"): [30.0, 31.0, 29.0],
        ("walker2d-medium", "matched-softmax"): [70.0, 81.0, 64.0],
        ("walker2d-medium", "matched-primal"): [110.0, 112.0, 114.0],
        ("walker2d-medium", "matched-bc"): [20.0, 25.0, 21.0],
    }
    runs = tmp_path / "runs"
    for (task, config), values in scores.items():
        for seed, score in enumerate(values):
            place(trained, runs / f"{task}-{config}-{seed}", config, seed, task, score)
    write_report(runs, tmp_path / "report")
    seen = glance([tmp_path / "report" / "runs"])
    table = results_table(seen)
    lines = table.splitlines()
    assert lines[0].startswith("| dataset | DT | Primal.+DT | BC | Primal.+DT − DT, p (Holm) |")
    tested = {
        task: scipy.stats.ttest_rel(scores[task, "matched-primal"], scores[task, "matched-softmax"])
        for task in ("hopper-medium", "walker2d-medium")
    }
    adjusted = dict(zip(tested, holm([found.pvalue for found in tested.values()]), strict=True))
    for task, found in tested.items():
        dt = scores[task, "matched-softmax"]
        low, high = t95(dt)
        difference = np.mean(scores[task, "matched-primal"]) - np.mean(dt)
        d_low, d_high = found.confidence_interval(0.95)
        row = next(line for line in lines if line.startswith(f"| {task} |"))
        assert row.startswith(f"| {task} | {np.mean(dt):.1f} [{low:.1f}, {high:.1f}] | "), row
        assert (
            f"| {difference:+.1f} [{d_low:+.1f}, {d_high:+.1f}], p = {adjusted[task]:.2f} |" in row
        )
        assert row.endswith(f"| {corl_scores().last[task][0]:.1f} |")
    seed_means = np.mean(
        [
            np.subtract(scores[task, "matched-primal"], scores[task, "matched-softmax"])
            for task in tested
        ],
        axis=0,
    )
    low, high = scipy.stats.ttest_1samp(seed_means, 0.0).confidence_interval(0.95)
    assert f"| mean over the 2 | | | | {seed_means.mean():+.1f} [{low:+.1f}, {high:+.1f}]" in table
    gap = paper_scores().average["Primal.+DT"] - paper_scores().average["DT"]
    needed = seeds_for(float(np.std(seed_means, ddof=1)), gap)
    assert f"the paper's {gap:.1f} points would need {needed} seeds per dataset" in table
    claimed = [task for task in tested if adjusted[task] < 0.05]
    assert f"differs at a family-wise 5% on {len(claimed)} of the 2 datasets" in table
    assert seen is not None
    for paired in seen.pairs:  # Bonferroni's over the 2: each at 97.5%
        found = scipy.stats.ttest_1samp(paired.differences, 0.0).confidence_interval(0.975)
        assert np.allclose(seen.simultaneous(paired), (found.low, found.high))
    shown = at_a_glance(seen, "f.png")
    assert shown.startswith(
        table.rpartition("\n\n")[0] + "\n\n![Primal.+DT − DT per dataset](f.png)\n\n"
    )
    assert glance_figure(seen, tmp_path / "f.png").stat().st_size > 10_000
    assert glance([]) is None and results_table(None) == NONE_KEPT == at_a_glance(None, "f.png")


def _kept(trained: Path, folder: Path, scores: dict[tuple[str, str], list[float]]) -> None:
    """A section's kept runs (the report's copy) in folder, scoring as given per seed."""
    runs = folder.parent / f"{folder.name}-runs"
    for (task, config), values in scores.items():
        for seed, score in enumerate(values):
            place(trained, runs / f"{task}-{config}-{seed}", config, seed, task, score)
    write_report(runs, folder.parent / f"{folder.name}-report")
    shutil.copytree(folder.parent / f"{folder.name}-report" / "runs", folder)


def test_the_papers_budget_leads_the_first_screen_and_the_cpus_is_one_readme_sentence(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the matched study has been made at the papers' budget (results-budget-<env>), its
    table and figure come first on the page, then the CPU budget's; the README shows that table
    and says the CPU budget's mean difference in one sentence. Without it, both show the CPU's."""
    data = tmp_path / "results-data"
    data.mkdir()
    monkeypatch.setattr(study_module, "RESULTS_DATA", data)
    dt, primal = "matched-softmax", "matched-primal"
    cpu_scores = {
        ("hopper-medium", dt): [40.0, 55.0, 47.0],
        ("hopper-medium", primal): [52.0, 44.0, 61.0],
        ("walker2d-medium", dt): [70.0, 81.0, 64.0],
        ("walker2d-medium", primal): [72.0, 80.0, 69.0],
    }
    for task in ("hopper-medium", "walker2d-medium"):
        env = task.partition("-")[0]
        part = {key: value for key, value in cpu_scores.items() if key[0] == task}
        _kept(trained, data / f"results-{env}", part)
    _kept(
        trained,
        data / "results-budget-hopper",
        {("hopper-medium", dt): [60.0, 62.0, 64.0], ("hopper-medium", primal): [70.0, 69.0, 75.0]},
    )
    assert [p.name for p in study_module.budget_sections()] == ["results-budget-hopper"]
    assert "results-budget-hopper" not in [p.name for p in study_module.matched_sections()]
    cpu, budget = glance(study_module.matched_sections()), glance(study_module.budget_sections())
    assert cpu is not None and budget is not None and cpu.over is not None
    page, readme = study_module.first_screens(cpu, budget)

    budget_table = at_a_glance(budget, "../scripts/figures/results_budget_at_a_glance.png")
    cpu_table = at_a_glance(cpu, "../scripts/figures/results_at_a_glance.png")
    assert page == (
        f"**At the papers' budget** (10 steps a run):\n\n{budget_table}\n\n"
        f"**At a CPU budget** (10 steps a run):\n\n{cpu_table}"
    )
    assert "| +9.3 [" in budget_table  # the budget's own difference: 71.3 − 62.0
    differences = np.subtract(
        [cpu_scores[t, primal] for t in ("hopper-medium", "walker2d-medium")],
        [cpu_scores[t, dt] for t in ("hopper-medium", "walker2d-medium")],
    ).mean(axis=0)
    low, high = scipy.stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    assert readme == (
        f"**At the papers' budget** (10 steps a run):\n\n"
        f"{at_a_glance(budget, 'scripts/figures/results_budget_at_a_glance.png')}\n\n"
        f"At a CPU budget (10 steps a run), Primal.+DT − DT over the 2 datasets is "
        f"{differences.mean():+.1f} [{low:+.1f}, {high:+.1f}] (it could detect "
        f"{cpu.over.detectable:.1f}); its table is on the results page."
    )
    page, readme = study_module.first_screens(cpu, None)
    assert page == f"**At a CPU budget** (10 steps a run):\n\n{cpu_table}"
    assert readme == page.replace("../scripts/", "scripts/")
