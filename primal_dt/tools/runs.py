"""What a report counts: the runs under a directory, grouped by what their config.json records.

Kept apart from the statistics (statistics.py) and the rendering (report.py) so that what a run's
score is (its first target's, chosen before the scores are seen), which runs count once, and which
datasets are the same data are decided in one place.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import PrimalDTError, did_you_mean
from primal_dt.data.episodes import ReferenceScores, load_task_data
from primal_dt.data.sources import find_dataset
from primal_dt.data.tasks import Task, load_envs
from primal_dt.evaluation.conditioning import read_curve
from primal_dt.method.registry import aux_loss_name
from primal_dt.store.results import EvalResult, read_results, target_score
from primal_dt.store.run_facts import read_facts
from primal_dt.store.runconfig import read_run_config
from primal_dt.store.rundir import RunDir, find_runs, run_dir_name
from primal_dt.store.snapshots import read_snapshot
from primal_dt.store.training_log import Span, curve, read_points, training_sessions


class ReportError(PrimalDTError):
    """Nothing to report on, or rliable missing."""


@dataclass
class RunSummary:
    """What the report needs from one run directory."""

    path: Path
    task: str
    config: str
    seed: int
    # train.steps as the run's last session set it: its checkpoint's (config.json keeps the
    # first session's, which an extended run, --resume --steps, outgrew); config.json's without one
    steps: int
    block_kinds: list[str]  # each block's attention (method/registry.py)
    return_conditioning: bool = True  # model.return_conditioning: False for behaviour cloning
    parameters: int | None = None  # the model's trainable parameters (from its checkpoint)
    step: int | None = None  # its checkpoint's
    final: float | None = None  # the final evaluation's score (target_score)
    best: float | None = None  # the best score of any evaluation, the final one included
    target: float | None = None  # the target return its scores are at: its first
    evaluations_during_training: int = 0  # evaluations other than the final one
    normalized: bool = True  # scores are normalised (reference scores known)
    reference: str | None = None  # the reference scores' source
    reference_scores: ReferenceScores | None = None
    dataset_ids: list[str] = field(default_factory=list)
    # its dataset's own score as the report's copy of it kept it (facts.json), for a report made
    # where the dataset is not (behaviour_scores reads the dataset where it is)
    behaviour: Behaviour | None = None
    scores: list[tuple[int, float]] = field(default_factory=list)  # (step, score) per evaluation
    # <aux_loss_name> as training.jsonl has it (registry.aux_loss_name: Primal's ksvd_loss), where
    # the run's kinds have an auxiliary loss
    aux_loss: list[tuple[int, float]] = field(default_factory=list)
    aux_loss_name: str | None = None
    sessions: list[Span] = field(default_factory=list)  # training_log.training_sessions
    machines: list[str] = field(default_factory=list)  # config.json's: where it trained
    precision: str = ""  # train.precision as config.json resolved it
    batch_size: int = 0  # train.batch_size
    spectra: list[np.ndarray] | None = None
    curve: EvalResult | None = None  # the latest return-conditioning curve (conditioning.py)
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
        block_kinds=started.config.model.block_kinds(),
        return_conditioning=started.config.model.return_conditioning,
        machines=list(started.machines),
        precision=started.config.train.precision,
        batch_size=started.config.train.batch_size,
    )
    records = read_results(run_dir)
    finals = _read_scores(summary, records)
    aux = aux_loss_name(summary.block_kinds)  # None: its kinds have no auxiliary loss
    points = read_points(run_dir.training_log)
    if not points:
        name = run_dir.training_log.name
        summary.notes.append(f"no {name} (a run made before it): no loss curve, no training time")
    summary.aux_loss = curve(points, aux) if aux else []
    summary.aux_loss_name = aux
    summary.sessions = training_sessions(points, records)
    summary.curve = read_curve(run_dir)
    if run_dir.checkpoint.exists():
        _read_checkpoint(summary, run_dir, finals, spectra)
    else:
        _read_facts(summary, run_dir, finals)
    return summary


def _read_scores(summary: RunSummary, records: list[EvalResult]) -> list[EvalResult]:
    """The run's scores from its evaluations (eval.jsonl): each one's, the final and the best,
    the first target, the task's references; returns the final evaluations."""
    good = [r for r in records if r.error is None]
    for record in records:
        if record.error is not None:
            summary.notes.append(f"evaluation at step {record.step} failed: {record.error}")
    scored = [(r, target_score(r)) for r in good]
    summary.scores = [(r.step, score) for r, score in scored if score is not None]
    summary.evaluations_during_training = sum(1 for r in good if not r.final)
    finals = [r for r in good if r.final]
    if finals:
        summary.final = target_score(finals[-1])
    else:
        summary.notes.append("no final evaluation")
    summary.best = max((score for _, score in summary.scores), default=None)
    latest = finals[-1] if finals else (good[-1] if good else None)
    if latest is not None and latest.results:
        summary.target = latest.results[0].target
        if len({r.results[0].target for r in good if r.results}) > 1:
            summary.notes.append("its evaluations were at different first targets")
    if good:
        _describe_task(summary, good[-1].reference, good[-1].dataset_ids)
    return finals


def _read_facts(summary: RunSummary, run_dir: RunDir, finals: list[EvalResult]) -> None:
    """What a report's copy of the run (report.export_runs) keeps of its checkpoint: facts.json."""
    facts = read_facts(run_dir)
    if facts is None:
        summary.notes.append("no checkpoint")
        return
    summary.step, summary.steps, summary.parameters = facts.step, facts.steps, facts.parameters
    summary.spectra = None if facts.spectra is None else [np.array(s) for s in facts.spectra]
    if facts.behaviour is not None:
        summary.behaviour = Behaviour(
            facts.behaviour, facts.behaviour_normalized, facts.behaviour_episodes
        )
    _final_at_checkpoint(summary, finals)


def _read_checkpoint(
    summary: RunSummary, run_dir: RunDir, finals: list[EvalResult], spectra: bool
) -> None:
    """The run's length, size, task and (with spectra) attention spectra from its checkpoint."""
    try:
        snapshot = read_snapshot(run_dir.checkpoint)
    except PrimalDTError as err:
        summary.notes.append(str(err))
        return
    summary.step, summary.steps = snapshot.step, snapshot.config.train.steps
    summary.parameters = sum(p.numel() for p in snapshot.build_model().parameters())
    _final_at_checkpoint(summary, finals)
    _describe_task(summary, snapshot.task.reference, list(snapshot.task.dataset_ids))
    if spectra:
        from primal_dt.evaluation.spectrum import checkpoint_spectra

        try:
            summary.spectra = checkpoint_spectra(run_dir, snapshot)
        except (PrimalDTError, OSError, RuntimeError, KeyError) as err:
            summary.notes.append(f"no attention spectrum: {type(err).__name__}: {err}")


def _final_at_checkpoint(summary: RunSummary, finals: list[EvalResult]) -> None:
    if finals and finals[-1].step != summary.step:
        summary.notes.append(
            f"final evaluation at step {finals[-1].step}, checkpoint at {summary.step}"
        )


def _describe_task(summary: RunSummary, reference: ReferenceScores | None, ids: list[str]) -> None:
    summary.normalized = reference is not None
    summary.reference = reference_note(summary.task, reference) if reference else None
    summary.reference_scores = reference
    summary.dataset_ids = list(ids)


def _in_a_report(folder: Path, runs_dir: Path) -> bool:
    """Whether a run folder lies in a report's folder below runs_dir (one holding report.json):
    that report's copy of its runs (report.export_runs), not runs of their own."""
    below = folder.relative_to(runs_dir).parents
    return any((runs_dir / parent / "report.json").exists() for parent in below if parent.parts)


def collect(runs_dir: Path, skip: Path | None = None, spectra: bool = True) -> list[RunSummary]:
    """Every run under runs_dir (folders holding config.json), except those under skip and the
    copies of runs in reports' folders below runs_dir (report.export_runs)."""
    if not runs_dir.is_dir():
        raise ReportError(
            f"{runs_dir} is not a directory; give the folder a sweep wrote its runs to"
        )
    folders = [
        path
        for path in find_runs(runs_dir)
        if (skip is None or skip.resolve() not in [path.resolve(), *path.resolve().parents])
        and not _in_a_report(path, runs_dir)
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


def count_once(summaries: list[RunSummary]) -> tuple[list[RunSummary], list[RunSummary]]:
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
    final: list[float]  # the final scores of the seeds that have one, in seed order
    best: list[float]
    steps: list[int]
    normalized: bool
    references: list[str]
    datasets: list[str]
    parameters: list[int] = field(default_factory=list)  # the runs' parameter counts, distinct
    per_seed: list[float | None] = field(default_factory=list)  # final score per seed in seeds
    targets: list[float] = field(default_factory=list)  # the first targets its runs used
    evaluated_during_training: bool = False  # some run of it has evaluations before the final
    average_of: int = 0  # tasks averaged (average rows only)
    averaged: list[str] = field(default_factory=list)  # the tasks with final scores averaged


def is_decision_transformer(summary: RunSummary) -> bool:
    """DT as its paper has it: softmax attention in every block, conditioned on returns."""
    return summary.return_conditioning and all(k == "softmax" for k in summary.block_kinds)


def baseline_config(summaries: Collection[RunSummary], chosen: str | None = None) -> str | None:
    """The config every other is compared with: `chosen` (`primal-dt report --baseline`) where
    given; else the Decision Transformer among them (is_decision_transformer: whatever the config
    is named), the first by name where several are; else the first config by name. None without
    runs."""
    configs = sorted({s.config for s in summaries})
    if chosen is not None:
        if chosen not in configs:
            raise ReportError(
                f"--baseline {chosen}: no run here has that config{did_you_mean(chosen, configs)}; "
                f"the configs here: {', '.join(configs) or 'none'}"
            )
        return chosen
    dts = sorted({s.config for s in summaries if is_decision_transformer(s)})
    return (dts or configs)[0] if configs else None


def unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def group(summaries: list[RunSummary], left_out_of_average: Collection[str] = ()) -> list[Row]:
    """A row per (task, config) in task then config order, then an average row per config: the mean
    over tasks of each task's mean over seeds (the paper's "average"), without the tasks in
    left_out_of_average (a dataset counted already, under another task)."""
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        groups.setdefault((summary.task, summary.config), []).append(summary)
    rows = []
    for (task, config), members in groups.items():
        during = any(r.evaluations_during_training for r in members)
        rows.append(
            Row(
                task=task,
                config=config,
                seeds=[r.seed for r in members],
                final=[r.final for r in members if r.final is not None],
                best=[r.best for r in members if r.best is not None] if during else [],
                steps=unique([r.step if r.step is not None else r.steps for r in members]),
                normalized=all(r.normalized for r in members),
                references=unique([r.reference for r in members if r.reference]),
                datasets=unique([" + ".join(r.dataset_ids) for r in members if r.dataset_ids]),
                parameters=unique([r.parameters for r in members if r.parameters is not None]),
                per_seed=[r.final for r in members],
                targets=unique([r.target for r in members if r.target is not None]),
                evaluated_during_training=during,
            )
        )
    for config in unique([row.config for row in rows]):
        mine = [
            row
            for row in rows
            if row.config == config and row.normalized and row.task not in left_out_of_average
        ]
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
                evaluated_during_training=any(row.evaluated_during_training for row in mine),
                average_of=len(mine),
                averaged=[row.task for row in mine if row.final],
            )
        )
    return rows


# ---- the datasets behind the tasks -------------------------------------------------------------


def task_datasets(summaries: list[RunSummary]) -> dict[str, list[str]]:
    """Each task's dataset ids, as its runs recorded them (the first run that did), by task."""
    found: dict[str, list[str]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        if summary.dataset_ids and summary.task not in found:
            found[summary.task] = list(summary.dataset_ids)
    return dict(sorted(found.items()))


def task_references(summaries: list[RunSummary]) -> dict[str, ReferenceScores]:
    """Each task's reference scores, as its runs recorded them (the first run that did)."""
    found: dict[str, ReferenceScores] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        if summary.reference_scores is not None:
            found.setdefault(summary.task, summary.reference_scores)
    return found


@dataclass(frozen=True)
class Behaviour:
    """The mean return of a task's dataset episodes (the behaviour policy's), normalised with the
    reference scores of the task's own scores; or why there is none."""

    value: float | None
    normalized: bool
    episodes: int = 0
    why: str = ""


def behaviour_scores(summaries: list[RunSummary]) -> dict[str, Behaviour]:
    """Per task, its datasets' own mean return, read with data/episodes.py's loader (the same
    episodes training saw); where a dataset is not on this machine, the value a report's copy of
    its runs kept (facts.json), else "dataset not here"."""
    ids, references = task_datasets(summaries), task_references(summaries)
    found = {}
    for task in unique(sorted(r.task for r in summaries)):
        found[task] = _behaviour(task, ids.get(task, []), references.get(task))
        kept = [s.behaviour for s in summaries if s.task == task and s.behaviour is not None]
        if found[task].value is None and kept:  # a report's copy, its dataset not here
            found[task] = kept[0]
    return found


def reference_note(task: str, reference: ReferenceScores) -> str:
    """The reference scores a task's normalised scores come from, their source, and where they
    are not D4RL's (envs/<env>.toml [reference]), D4RL's and the ratio of the two experts': a
    normalised score is comparable with D4RL's only as far as the references agree."""
    text = f"random {reference.random:,.2f}, expert {reference.expert:,.2f}: {reference.source}"
    env = load_envs().get(task.split("-", 1)[0])
    if env is None or (reference.random, reference.expert) == (env.ref_random, env.ref_expert):
        return text
    ratio = reference.expert / env.ref_expert
    return (
        f"{text} (D4RL's: random {env.ref_random:,.2f}, expert {env.ref_expert:,.2f}; this "
        f"expert is {ratio:.2f} of D4RL's, so a return here scores about {1 / ratio:.2f} times "
        f"its D4RL score)"
    )


def _behaviour(task: str, ids: list[str], reference: ReferenceScores | None) -> Behaviour:
    if not ids:
        return Behaviour(None, False, why="n/a (its runs record no dataset)")
    if any(find_dataset(dataset_id) is None for dataset_id in ids):
        return Behaviour(None, False, why="n/a (dataset not here)")
    try:
        data = load_task_data(Task(task, tuple(ids), None), download=False)
    except Exception as err:  # whatever Minari or the environment raise: marked, never fatal
        return Behaviour(None, False, why=f"n/a (dataset unreadable: {type(err).__name__}: {err})")
    returns = np.array([float(episode.rewards.sum()) for episode in data.episodes])
    value = returns.mean() if reference is None else reference.normalize(returns).mean()
    return Behaviour(float(value), reference is not None, len(returns))
