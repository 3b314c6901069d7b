"""`primal-dt report RUNS_DIR`: the paper's table and pictures from a directory of runs.

Every run directory under RUNS_DIR (a folder with config.json) is read: config.json for the task,
the config's name and its settings, eval.jsonl for scores, TensorBoard events for the KSVD loss,
ckpt.pt for the dataset, reference scores and the attention spectrum. Runs are grouped by the
(task, config name) their config.json records, never by folder names, and a group's seeds are the
train.seed each run's config.json records; a second run of the same (task, config, seed) is counted
once (the one trained furthest) and named in the notes. Per group, over seeds:

- final: the score of the final evaluation (eval.final_episodes episodes per target);
- best: the best score of any evaluation during training (a max over evaluations: optimistic).

A score is the best target's normalised score, 100 (R - R_random) / (R_expert - R_random), or its
return where no reference scores are known (marked). Missing pieces are marked, never fatal.
Writes report.md, report.csv, curves_<task>.png, spectrum_<task>.png and, for runs with a target
sweep, return_curve_<task>.png.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import PrimalDTError
from primal_dt.data.episodes import ReferenceScores
from primal_dt.evaluation.conditioning import curve_points, read_curve
from primal_dt.store.dashboards import copy_run, read_scalars, write_layout
from primal_dt.store.results import EvalRecord, read_results
from primal_dt.store.rundir import (
    RunDir,
    find_runs,
    read_run_config,
    read_snapshot,
    run_dir_name,
    safe_name,
)


class ReportError(PrimalDTError):
    """Nothing to report on."""


@dataclass
class RunSummary:
    """What the report needs from one run directory."""

    path: Path
    task: str
    config: str
    seed: int
    steps: int  # configured train.steps
    primal_blocks: list[int]
    step: int | None = None  # its checkpoint's
    final: float | None = None
    best: float | None = None
    normalized: bool = True  # scores are normalised (reference scores known)
    reference: str | None = None
    dataset_ids: list[str] = field(default_factory=list)
    scores: list[tuple[int, float]] = field(default_factory=list)  # (step, score) per evaluation
    ksvd: list[tuple[int, float]] = field(default_factory=list)
    spectra: list[np.ndarray] | None = None
    curve: EvalRecord | None = None  # the latest return-conditioning curve (conditioning.py)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(run_dir_name(self.task, self.config, self.seed))


def read_run(path: Path, spectra: bool = True) -> RunSummary:
    """The summary of one run directory; whatever is missing or broken becomes a note."""
    run_dir = RunDir(path)
    started = read_run_config(run_dir)
    summary = RunSummary(
        path=path,
        task=started.task,
        config=started.config_name,
        seed=started.config.train.seed,
        steps=started.config.train.steps,
        primal_blocks=started.config.model.primal_indices(),
    )
    records = read_results(run_dir)
    good = [r for r in records if r.error is None]
    for record in records:
        if record.error is not None:
            summary.notes.append(f"evaluation at step {record.step} failed: {record.error}")
    summary.scores = [(r.step, r.score) for r in good if r.score is not None]
    finals = [r for r in good if r.final]
    if finals:
        summary.final = finals[-1].score
    else:
        summary.notes.append("no final evaluation")
    summary.best = max((score for _, score in summary.scores), default=None)
    if good:
        _describe_task(summary, good[-1].reference, good[-1].dataset_ids)
    ksvd = read_scalars(path).get("train/ksvd_loss", [])
    summary.ksvd = [(step, value) for step, value, _ in ksvd]
    summary.curve = read_curve(run_dir)
    if not run_dir.checkpoint.exists():
        summary.notes.append("no checkpoint")
        return summary
    try:
        snapshot = read_snapshot(run_dir.checkpoint)
    except PrimalDTError as err:
        summary.notes.append(str(err))
        return summary
    summary.step = snapshot.step
    if finals and finals[-1].step != summary.step:
        summary.notes.append(
            f"final evaluation at step {finals[-1].step}, checkpoint at {summary.step}"
        )
    _describe_task(summary, snapshot.task.reference, list(snapshot.task.dataset_ids))
    if spectra:
        from primal_dt.evaluation.spectrum import checkpoint_spectra

        try:
            summary.spectra = checkpoint_spectra(run_dir, snapshot)
        except (PrimalDTError, OSError, RuntimeError, KeyError) as err:
            summary.notes.append(f"no attention spectrum: {type(err).__name__}: {err}")
    return summary


def _describe_task(summary: RunSummary, reference: ReferenceScores | None, ids: list[str]) -> None:
    summary.normalized = reference is not None
    summary.reference = reference.source if reference else None
    summary.dataset_ids = list(ids)


def collect(runs_dir: Path, skip: Path | None = None, spectra: bool = True) -> list[RunSummary]:
    """Every run under runs_dir (folders holding config.json), except those under skip."""
    if not runs_dir.is_dir():
        raise ReportError(
            f"{runs_dir} is not a directory; give the folder a sweep wrote its runs to"
        )
    folders = [
        path
        for path in find_runs(runs_dir)
        if skip is None or skip.resolve() not in [path.resolve(), *path.resolve().parents]
    ]
    if not folders:
        raise ReportError(
            f"no runs under {runs_dir} (no run directory with a "
            f"{RunDir(runs_dir).config_file.name}); train some with "
            f"primal-dt sweep --runs-dir {runs_dir} first"
        )
    summaries = []
    for folder in folders:
        try:
            summaries.append(read_run(folder, spectra))
        except PrimalDTError as err:  # not a primal-dt run after all
            print(f"skipping {folder}: {err}", file=sys.stderr)
    return summaries


def distinct(summaries: list[RunSummary]) -> tuple[list[RunSummary], list[RunSummary]]:
    """(the runs to count, the duplicates left out): of the runs of one (task, config, seed), the
    one trained furthest (its checkpoint's step, then a final evaluation) is counted, the first by
    path among equals; it gets a note naming the folders of the others."""
    same: dict[tuple[str, str, int], list[RunSummary]] = {}
    for summary in sorted(summaries, key=lambda r: r.path):
        same.setdefault((summary.task, summary.config, summary.seed), []).append(summary)
    kept, left_out = [], []
    for members in same.values():
        best = max(members, key=lambda r: (r.step or 0, r.final is not None))
        others = [r for r in members if r is not best]
        if others:
            folders = ", ".join(str(r.path) for r in others)
            best.notes.append(f"same task, config and seed as {folders}: counted once, as this run")
        kept.append(best)
        left_out += others
    return kept, left_out


@dataclass
class Row:
    """One line of the table: a (task, config) group, or a config's average over tasks."""

    task: str
    config: str
    seeds: list[int]
    final: list[float]
    best: list[float]
    steps: list[int]
    normalized: bool
    references: list[str]
    datasets: list[str]
    average_of: int = 0  # tasks averaged (average rows only)


def _unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def group(summaries: list[RunSummary]) -> list[Row]:
    """A row per (task, config) in task then config order, then an average row per config: the mean
    over tasks of each task's mean over seeds (the paper's "average")."""
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        groups.setdefault((summary.task, summary.config), []).append(summary)
    rows = []
    for (task, config), members in groups.items():
        rows.append(
            Row(
                task=task,
                config=config,
                seeds=[r.seed for r in members],
                final=[r.final for r in members if r.final is not None],
                best=[r.best for r in members if r.best is not None],
                steps=_unique([r.step if r.step is not None else r.steps for r in members]),
                normalized=all(r.normalized for r in members),
                references=_unique([r.reference for r in members if r.reference]),
                datasets=_unique([" + ".join(r.dataset_ids) for r in members if r.dataset_ids]),
            )
        )
    for config in _unique([row.config for row in rows]):
        mine = [row for row in rows if row.config == config and row.normalized]
        rows.append(
            Row(
                task="average",
                config=config,
                seeds=[],
                final=[float(np.mean(row.final)) for row in mine if row.final],
                best=[float(np.mean(row.best)) for row in mine if row.best],
                steps=[],
                normalized=True,
                references=[],
                datasets=[],
                average_of=len(mine),
            )
        )
    return rows


def _cell(values: list[float], expected: int, average: bool) -> str:
    if not values:
        return "n/a"
    if average:
        text = f"{np.mean(values):.1f}"
        return text if len(values) == expected else f"{text} ({len(values)} of {expected} tasks)"
    text = f"{np.mean(values):.1f} ± {np.std(values):.1f}"
    return text if len(values) == expected else f"{text} ({len(values)} of {expected} seeds)"


def markdown_table(rows: list[Row]) -> str:
    """The table, with each distinct reference-score source as a numbered note below it."""
    header = ["task", "config", "seeds", "final", "best", "steps", "reference scores", "dataset"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources: list[str] = []
    for row in rows:
        average = row.task == "average"
        expected = row.average_of if average else len(row.seeds)
        final, best = _cell(row.final, expected, average), _cell(row.best, expected, average)
        if not row.normalized:
            final, best = f"{final} (return)", f"{best} (return)"
        sources += [source for source in row.references if source not in sources]
        notes = " ".join(f"[{sources.index(source) + 1}]" for source in row.references)
        cells = [
            f"**{row.task}**" if average else row.task,
            row.config,
            ",".join(map(str, row.seeds)),
            final,
            best,
            ",".join(map(str, row.steps)),
            notes or ("" if average else "none"),
            "; ".join(row.datasets),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] {source}  " for i, source in enumerate(sources, 1)]
    return "\n".join(lines).rstrip()


def _stats(values: list[float], average: bool) -> list[Any]:
    """n, mean and std for the CSV; an average row's std is left empty (it is not over seeds)."""
    if not values:
        return [0, "", ""]
    return [len(values), f"{np.mean(values):.4f}", "" if average else f"{np.std(values):.4f}"]


def write_csv(rows: list[Row], path: Path) -> Path:
    """The table as CSV; for average rows n_final and n_best count tasks, not seeds."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([
            "task", "config", "seeds", "n_final", "final_mean", "final_std", "n_best", "best_mean",
            "best_std", "normalized", "steps", "reference_source", "dataset_ids",
        ])  # fmt: skip
        for row in rows:
            average = row.task == "average"
            writer.writerow([
                row.task, row.config, " ".join(map(str, row.seeds)), *_stats(row.final, average),
                *_stats(row.best, average), row.normalized, " ".join(map(str, row.steps)),
                "; ".join(row.references), "; ".join(row.datasets),
            ])  # fmt: skip
    return path


def spectrum_table(summaries: list[RunSummary]) -> str:
    """Per task, config and block: how many singular values hold 90% of their sum."""
    from primal_dt.evaluation.spectrum import rank_at

    groups: dict[tuple[str, str, int], list[int]] = {}
    kinds: dict[tuple[str, str, int], str] = {}
    sizes: dict[tuple[str, str, int], int] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        for block, curve in enumerate(summary.spectra or []):
            key = (summary.task, summary.config, block)
            groups.setdefault(key, []).append(rank_at(curve))
            kinds[key] = "Primal" if block in summary.primal_blocks else "softmax"
            sizes[key] = len(curve)
    lines = [
        "| task | config | block | attention | singular values for 90% (mean ± std) | of |",
        "|---|---|---|---|---|---|",
    ]
    for key, ranks in groups.items():
        task, config, block = key
        lines.append(
            f"| {task} | {config} | {block} | {kinds[key]} | {np.mean(ranks):.1f} ± "
            f"{np.std(ranks):.1f} | {sizes[key]} |"
        )
    return "\n".join(lines)


def figures(summaries: list[RunSummary], out: Path) -> list[Path]:
    """curves_<task>.png, return_curve_<task>.png (where runs have a target sweep) and
    spectrum_<task>.png for every task."""
    from primal_dt.evaluation.plots import conditioning_figure, curves_figure, save, spectra_figure

    written = []
    for task in _unique(sorted(r.task for r in summaries)):
        mine = sorted((r for r in summaries if r.task == task), key=lambda r: (r.config, r.seed))
        configs = _unique([r.config for r in mine])
        scores = {c: [r.scores for r in mine if r.config == c] for c in configs}
        ksvd = {c: [r.ksvd for r in mine if r.config == c and r.primal_blocks] for c in configs}
        label = "normalised score" if all(r.normalized for r in mine) else "score (return)"
        figure = curves_figure(task, scores, ksvd, label)
        written.append(save(figure, out / f"curves_{safe_name(task)}.png"))
        with_curves = [r for r in mine if r.curve is not None]
        if with_curves:
            panels = {c: [curve_points(r.curve) for r in with_curves if r.config == c]
                      for c in configs if any(r.config == c for r in with_curves)}  # fmt: skip
            reference = with_curves[0].curve.reference
            title = f"{task}: achieved against target return"
            figure = conditioning_figure(panels, title, reference)
            written.append(save(figure, out / f"return_curve_{safe_name(task)}.png"))
        with_spectra = [r for r in mine if r.spectra]
        if not with_spectra:
            continue
        blocks = []
        for block in range(max(len(r.spectra) for r in with_spectra)):
            curves = {}
            for config in configs:
                here = [r for r in with_spectra if r.config == config and block < len(r.spectra)]
                if here:
                    kind = "Primal" if block in here[0].primal_blocks else "softmax"
                    curves[f"{config} ({kind})"] = [r.spectra[block] for r in here]
            blocks.append((f"block {block}", curves))
        written.append(save(spectra_figure(task, blocks), out / f"spectrum_{safe_name(task)}.png"))
    return written


def write_report(runs_dir: Path, out: Path | None = None) -> tuple[str, list[Path]]:
    """Write the report's files into out (default RUNS_DIR/report); returns report.md's text and
    the paths written. Also refreshes RUNS_DIR's TensorBoard dashboards (dashboards.py)."""
    out = out or runs_dir / "report"
    found = collect(runs_dir, skip=out)
    counted_once, left_out = distinct(found)
    out.mkdir(parents=True, exist_ok=True)
    rows = group(counted_once)
    written = [write_csv(rows, out / "report.csv"), *figures(counted_once, out)]
    notes = [f"- {r.name} ({r.path}): {note}" for r in counted_once for note in r.notes]
    counted = f"{len(counted_once)} runs"
    if left_out:
        counted += f" ({len(left_out)} duplicate{'s' * (len(left_out) > 1)} left out, see Notes)"
    images = [f"![{p.stem}]({p.name})" for p in written if p.suffix == ".png"]
    text = "\n\n".join(
        [
            f"# primal-dt report: {runs_dir}",
            f"{counted}. Score: the normalised score of the best evaluation target, "
            f"100 (R - R_random) / (R_expert - R_random); mean ± std over seeds (numpy, ddof 0). "
            f"**final**: the final evaluation; **best**: the best evaluation during training (a "
            f"max over evaluations, so optimistic). **average**: the mean over tasks of each "
            f"task's mean.",
            markdown_table(rows),
            "## Attention spectrum\n\nNormalised cumulative singular values of each block's "
            "attention output on fixed windows of the task's dataset (the same windows for every "
            "run of a task; see primal_dt/evaluation/spectrum.py), from each run's last checkpoint: the "
            "fewer singular values hold 90% of the sum, the lower the rank.",
            spectrum_table(counted_once),
            "## Figures\n\n" + "\n".join(images),
            "## Notes\n\n" + ("\n".join(notes) or "none"),
        ]
    )
    (out / "report.md").write_text(text + "\n")
    written.insert(0, out / "report.md")
    write_layout(runs_dir, [summary.task for summary in found])
    for summary in found:
        copy_run(summary.path, summary.task)
    return markdown_table(rows), written
