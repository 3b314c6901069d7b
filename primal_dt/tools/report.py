"""`primal-dt report RUNS_DIR [RUNS_DIR ...]`: report.md, report.csv and the figures of the runs
in one directory of runs, or in several read together (a study made in parts, one task at a time).

This module assembles the report from its sections (report_tables.py, report_comparisons.py) and
writes its figures as data (report_data.py); it only renders: which runs count and what their
scores are is decided in runs.py, every number and interval in statistics.py and paired.py, so a
table cannot print what was not computed there. report.md holds, in order: the scores per task (each seed's, their mean and Student's t interval,
the best evaluation where there were evaluations during training, the dataset's own score); a
sentence per config and task against the baseline config, and over tasks; whether the curves are
flat, and the same comparisons over the last quarter's evaluations; the aggregates over tasks
(only at MIN_SEEDS_FOR_AGGREGATES seeds, with their simulated coverage); the attention spectrum
with its sentences; the Primal-Attention paper's table, apart from ours (it is not comparable); figures
and notes.

Writes report.md, report.json, report.csv, curves_<task>.png, spectrum_<task>.png, for runs with a target
sweep return_curve_<task>.png, and with aggregates aggregates.png and performance_profile.png; and
runs/, a copy of every run's records from which `primal-dt report runs/` makes the same report
without the checkpoints (export_runs).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from primal_dt.common.errors import check_folder
from primal_dt.evaluation.conditioning import curve_points
from primal_dt.method.registry import attention_label
from primal_dt.store.dashboards import copy_run, remove_root_layout
from primal_dt.store.run_facts import RunFacts, write_facts
from primal_dt.store.rundir import RunDir, safe_name
from primal_dt.tools.corl import corl_scores, corl_table
from primal_dt.tools.flatness import flatness_section
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.report_comparisons import (
    aggregates_with_figures,
    comparisons_section,
    last_quarter_section,
)
from primal_dt.tools.report_data import ReportSection, report_data, write_report_data
from primal_dt.tools.report_tables import (
    markdown_table,
    paper_table,
    scores_text,
    spectrum_section,
    write_csv,
)
from primal_dt.tools.runs import (
    Behaviour,
    ReportError,
    Row,
    RunSummary,
    baseline_config,
    behaviour_scores,
    collect,
    count_once,
    group,
    task_datasets,
    task_references,
    unique,
)
from primal_dt.tools.same_data import SameData, same_data

# ---- figures ----------------------------------------------------------------------------------


def figures(summaries: list[RunSummary], out: Path) -> list[Path]:
    """curves_<task>.png, return_curve_<task>.png (where runs have a target sweep) and
    spectrum_<task>.png for every task."""
    from primal_dt.evaluation.plots import (
        Series,
        conditioning_figure,
        curves_figure,
        save,
        spectra_figure,
    )

    written = []
    for task in unique(sorted(r.task for r in summaries)):
        mine = sorted((r for r in summaries if r.task == task), key=lambda r: (r.config, r.seed))
        configs = unique([r.config for r in mine])
        scores: dict[str, list[Series]] = {
            c: [r.scores for r in mine if r.config == c] for c in configs
        }
        aux: dict[str, list[Series]] = {
            c: [r.aux_loss for r in mine if r.config == c and r.aux_loss_name] for c in configs
        }
        names = sorted({f"train/{r.aux_loss_name}" for r in mine if r.aux_loss_name})
        label = "normalised score" if all(r.normalized for r in mine) else "score (return)"
        figure = curves_figure(task, scores, aux, label, ", ".join(names))
        written.append(save(figure, out / f"curves_{safe_name(task)}.png"))
        # (config, curve) pairs, so that the curves are known not to be None
        with_curves = [(r.config, r.curve) for r in mine if r.curve is not None]
        if with_curves:
            panels = {
                c: [curve_points(curve) for name, curve in with_curves if name == c]
                for c in configs
                if any(name == c for name, _ in with_curves)
            }
            reference = with_curves[0][1].reference
            title = f"{task}: achieved against target return"
            figure = conditioning_figure(panels, title, reference)
            written.append(save(figure, out / f"return_curve_{safe_name(task)}.png"))
        # (run, spectra) pairs, so that the spectra are known not to be None
        with_spectra = [(r, r.spectra) for r in mine if r.spectra]
        if not with_spectra:
            continue
        blocks = []
        for block in range(max(len(spectra) for _, spectra in with_spectra)):
            curves = {}
            for config in configs:
                here = [
                    (r, spectra)
                    for r, spectra in with_spectra
                    if r.config == config and block < len(spectra)
                ]
                if here:
                    kind = attention_label(here[0][0].block_kinds[block])
                    curves[f"{config} ({kind})"] = [spectra[block] for _, spectra in here]
            blocks.append((f"block {block}", curves))
        written.append(save(spectra_figure(task, blocks), out / f"spectrum_{safe_name(task)}.png"))
    return written


# ---- the report -------------------------------------------------------------------------------


def _notes(counted: list[RunSummary], rows: list[Row], same: Sequence[SameData]) -> list[str]:
    notes = [f"- {r.name} ({r.path}): {note}" for r in counted for note in r.notes]
    notes += [
        f"- {s.task} and {s.same_as}: their datasets are the same data ({s.how}); the aggregates "
        f"and average rows count it once, as {s.same_as}"
        for s in same
    ]
    notes += [
        f"- {row.task} ({row.config}): its runs' first targets differ ("
        + ", ".join(f"{t:g}" for t in row.targets)
        + "): their scores are at different targets"
        for row in rows
        if len(row.targets) > 1
    ]
    return notes


def _sections(text: str, pictures: list[str]) -> list[ReportSection]:
    """A builder's text ("## heading", a blank line, its body; some builders write two sections)
    as its sections, each with the figures its body shows."""
    assert text.startswith("## "), "every section of report.md starts with its heading"
    found = []
    for part in text.removeprefix("## ").split("\n\n## "):
        heading, _, body = part.partition("\n\n")
        found.append(ReportSection(heading, body, [n for n in pictures if f"]({n})" in body]))
    return found


def export_runs(summaries: list[RunSummary], folder: Path, behaviour: dict[str, Behaviour]) -> Path:
    """A copy of each run's records (RunDir.small_files) and its checkpoint's facts (facts.json,
    with its task's dataset score from behaviour, behaviour_scores's for every task) under
    folder/<task>/<config>-s<seed>, from which `primal-dt report folder` makes the same
    report without the checkpoints: the results page's data. Made beside the folder, then put in
    place of its last copy."""
    staging = folder.with_name(f".{folder.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    for summary in summaries:
        copy = RunDir(staging / summary.name)  # unique: the runs are counted once
        copy.path.mkdir(parents=True)
        for path in RunDir(summary.path).small_files():
            shutil.copy2(path, copy.path / path.name)
        if summary.step is not None and summary.parameters is not None:
            spectra = None if summary.spectra is None else [s.tolist() for s in summary.spectra]
            data = behaviour[summary.task]  # behaviour_scores: every task's, found or not
            facts = RunFacts(
                summary.step,
                summary.steps,
                summary.parameters,
                spectra,
                behaviour=data.value,
                behaviour_normalized=data.normalized,
                behaviour_episodes=data.episodes,
            )
            write_facts(copy, facts)
    staging.mkdir(exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def _check_copy_place(folder: Path, dirs: list[Path], found: list[RunSummary]) -> None:
    """The report's copy of the runs replaces whatever is at folder: refused where that holds a
    runs directory it reads or a run, before anything is written."""
    target = folder.resolve()
    inputs = [*(d.resolve() for d in dirs), *(s.path.resolve() for s in found)]
    if any(path == target or target in path.parents for path in inputs):
        raise ReportError(
            f"--out {folder.parent}: the report writes its copy of the runs to {folder}, which "
            f"holds runs it reads; give --out a folder of its own"
        )


class Found(NamedTuple):
    """What a report reads, checked before anything is written."""

    out: Path  # where it writes (default: the first RUNS_DIR/report)
    dirs: list[Path]
    runs: list[RunSummary]  # every run found
    counted_once: list[RunSummary]
    left_out: list[RunSummary]  # duplicates


def _find(runs_dirs: Path | Sequence[Path], out: Path | None) -> Found:
    dirs = [runs_dirs] if isinstance(runs_dirs, Path) else list(runs_dirs)
    out = out or dirs[0] / "report"
    check_folder(out, "--out")
    found = [summary for runs_dir in dirs for summary in collect(runs_dir, skip=out)]
    _check_copy_place(out / "runs", dirs, found)
    return Found(out, dirs, found, *count_once(found))


def write_runs_data(runs_dirs: Path | Sequence[Path], out: Path | None = None) -> Path:
    """Only the report's copy of the runs (export_runs) into out/runs, from which `primal-dt
    report` makes the report elsewhere: no statistics, tables or figures, so that a machine without
    the report extra (a lent GPU's) can send back its runs' data. Returns the copy's folder."""
    found = _find(runs_dirs, out)
    found.out.mkdir(parents=True, exist_ok=True)
    counted = found.counted_once
    return export_runs(counted, found.out / "runs", behaviour_scores(counted))


def write_report(
    runs_dirs: Path | Sequence[Path], out: Path | None = None, baseline: str | None = None
) -> tuple[str, list[Path]]:
    """Write the report's files into out (default: the first RUNS_DIR/report): report.md, its
    figures as data in report.json (report_data.py), report.csv and the figures; from the runs of
    every directory together, every config compared with baseline (default:
    runs.baseline_config's choice); returns the per-task table's text and the paths written.
    Also refreshes each RUNS_DIR's TensorBoard dashboards (dashboards.py)."""
    out, dirs, found, counted_once, left_out = _find(runs_dirs, out)
    baseline = baseline_config(counted_once, baseline)  # a wrong --baseline: before any write
    out.mkdir(parents=True, exist_ok=True)
    same = same_data(task_datasets(counted_once))
    rows = group(counted_once, {s.task for s in same})
    behaviour = behaviour_scores(counted_once)
    written = [write_csv(rows, out / "report.csv", behaviour), *figures(counted_once, out)]
    images = [f"![{p.stem}]({p.name})" for p in written if p.suffix == ".png"]
    section, summed, drawn = aggregates_with_figures(rows, baseline, same, out)
    written += drawn
    counted = f"{len(counted_once)} runs"
    if left_out:
        counted += f" ({len(left_out)} duplicate{'s' * (len(left_out) > 1)} left out, see Notes)"
    lead = f"{counted}, grouped by the task, config name and seed each run recorded."
    table = markdown_table(rows, behaviour)
    parts = [
        f"{scores_text(rows)}\n\n{table}",
        comparisons_section(rows, baseline),
        flatness_section(counted_once),
        last_quarter_section(counted_once, baseline),
        section,
        spectrum_section(counted_once),
        paper_table(paper_scores(), [row.task for row in rows if row.task != "average"]),
        corl_table(rows, baseline, corl_scores(), task_references(counted_once)),
        "## Figures\n\n" + "\n".join(images),
        "## Notes\n\n" + ("\n".join(_notes(counted_once, rows, same)) or "none"),
    ]
    pictures = [path.name for path in written if path.suffix == ".png"]
    sections = [s for part in parts if part for s in _sections(part, pictures)]  # none: none
    title = f"# primal-dt report: {', '.join(map(str, dirs))}"
    text = "\n\n".join([title, lead, *(f"## {s.heading}\n\n{s.body}" for s in sections)])
    (out / "report.md").write_text(text + "\n")
    data = report_data(dirs, rows, counted_once, baseline, summed)
    data.lead, data.sections = lead, sections
    written[:0] = [out / "report.md", write_report_data(data, out / "report.json")]
    written.append(export_runs(counted_once, out / "runs", behaviour))
    for runs_dir in dirs:
        remove_root_layout(runs_dir)
    for summary in found:
        if not RunDir(summary.path).facts.exists():  # a run, not a report's copy of one
            copy_run(summary.path, summary.task)
    return table, written
