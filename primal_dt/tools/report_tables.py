"""report.md's tables and their cells: the scores per task (and report.csv, the same rows as
data), the attention spectrum's table and sentences, and the Primal-Attention paper's table. Every
number comes from runs.py and statistics.py (report.py says what the report holds)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from primal_dt.method.registry import attention_label
from primal_dt.tools.paper import PaperScores
from primal_dt.tools.runs import (
    Behaviour,
    Row,
    RunSummary,
    unique,
)
from primal_dt.tools.statistics import (
    CONFIDENCE,
    compare_ranks,
    sample_std,
    t_interval,
)

NO_INTERVAL = "none: 1 seed (an interval needs at least 2)"
NO_TRAINING_EVALUATIONS = "no evaluations during training"


# ---- scores per task --------------------------------------------------------------------------


def _with_best(rows: list[Row]) -> bool:
    """Whether the report has a best column: some run was evaluated during training."""
    return any(row.evaluated_during_training for row in rows)


def _mean_cell(values: list[float], expected: int, average: bool) -> str:
    if not values:
        return "n/a"
    text = f"{np.mean(values):.1f}"
    unit = "tasks" if average else "seeds"
    return text if len(values) == expected else f"{text} ({len(values)} of {expected} {unit})"


def _per_seed_cell(row: Row) -> str:
    return ", ".join("n/a" if score is None else f"{score:.1f}" for score in row.per_seed)


def _interval_cell(row: Row) -> str:
    if row.task == "average":
        return "none (a mean over tasks)"
    interval = t_interval(row.final)
    if interval is None:
        return NO_INTERVAL if len(row.final) == 1 else "none: no final score"
    return f"[{interval[0]:.1f}, {interval[1]:.1f}]"


def _best_cell(row: Row) -> str:
    if not row.evaluated_during_training:
        return NO_TRAINING_EVALUATIONS
    return _mean_cell(row.best, row.average_of or len(row.seeds), row.task == "average")


def _behaviour_of(row: Row, behaviour: dict[str, Behaviour]) -> Behaviour:
    """A task's behaviour score; for an average row, the mean over the tasks it averages (where
    every one of them has its own)."""
    if row.task != "average":
        return behaviour.get(row.task, Behaviour(None, False, why="n/a"))
    found = [behaviour.get(task) for task in row.averaged]
    values = [b.value for b in found if b is not None and b.value is not None and b.normalized]
    if not values or len(values) != row.average_of:
        return Behaviour(None, False, why="n/a")
    return Behaviour(float(np.mean(values)), True)


def _behaviour_cell(found: Behaviour) -> str:
    if found.value is None:
        return found.why
    return f"{found.value:.1f}" + ("" if found.normalized else " (return)")


def markdown_table(rows: list[Row], behaviour: dict[str, Behaviour] | None = None) -> str:
    """The per-task table, with each distinct reference-score source as a numbered note below
    it; behaviour: the datasets' own scores (behaviour_scores), "n/a" without."""
    behaviour = behaviour or {}
    best = _with_best(rows)
    header = ["task", "config", "seeds", "final, per seed", "final mean"]
    header += [f"final {CONFIDENCE:.0%} interval (Student's t)"]
    header += ["best (max over evaluations)"] * best
    header += ["dataset (behaviour)", "target", "steps", "parameters", "reference scores"]
    header += ["dataset"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources: list[str] = []
    for row in rows:
        average = row.task == "average"
        expected = row.average_of if average else len(row.seeds)
        final = _mean_cell(row.final, expected, average)
        if not row.normalized:
            final = f"{final} (return)"
        sources += [source for source in row.references if source not in sources]
        notes = " ".join(f"[{sources.index(source) + 1}]" for source in row.references)
        cells = [
            f"**{row.task}**" if average else row.task,
            row.config,
            ",".join(map(str, row.seeds)),
            _per_seed_cell(row),
            final,
            _interval_cell(row),
            *([_best_cell(row)] if best else []),
            _behaviour_cell(_behaviour_of(row, behaviour)),
            ", ".join(f"{target:g}" for target in row.targets),
            ",".join(map(str, row.steps)),
            ", ".join(f"{count:,}" for count in row.parameters),
            notes or ("" if average else "none"),
            "; ".join(row.datasets),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] {source}  " for i, source in enumerate(sources, 1)]
    return "\n".join(lines).rstrip()


def scores_text(rows: list[Row]) -> str:
    best = (
        "**best**: the mean over seeds of each run's best evaluation, the final one included (a "
        "max over evaluations, so optimistic); a group none of whose runs was evaluated during "
        f"training says {NO_TRAINING_EVALUATIONS}. "
        if _with_best(rows)
        else "No best column: no run was evaluated during training (train.eval_every = 0), only "
        "at its end. "
    )
    return (
        "## Scores per task\n\n"
        "A run's score is its final evaluation's normalised return at its first target return, "
        "100 (R - R_random) / (R_expert - R_random): the first of its eval.targets, else of its "
        "environment's eval_targets (envs/<env>.toml: the Decision Transformer paper's target "
        "for the task), so that the target is chosen before any score is seen; **target** names "
        "it. Where no reference scores are known, the return itself, marked (return). "
        "**final, per seed**: each seed's score, in the order of **seeds**; **final mean**: "
        f"their mean; **final {CONFIDENCE:.0%} interval**: Student's t interval of the mean over "
        "seeds, mean ± t(0.975, n − 1) · s / √n with s the std over seeds (ddof 1), none with "
        "one seed. It covers the variation over seeds (training again with another seed on these "
        f"datasets, at this budget), not over other datasets or environments. {best}"
        "**dataset (behaviour)**: the mean normalised return of the dataset's own episodes, with "
        "the reference scores of the task's scores: what the behaviour policy scored, the "
        "baseline that says whether sequence modelling added anything. **average**: the mean "
        "over tasks of each task's mean (the paper's average row), without the tasks whose data "
        "an earlier task has (see Notes)."
    )


def write_csv(rows: list[Row], path: Path, behaviour: dict[str, Behaviour] | None = None) -> Path:
    """The table as CSV; for average rows n_final (and n_best) count tasks, not seeds.
    final_scores: each seed's score in the order of seeds ("nan" for a run without one);
    final_std_ddof1: their std (ddof 1); final_t95_*: the Student's t 95% interval of their mean
    (empty under 2 seeds and for average rows); best_* only where some run was evaluated during
    training; dataset_behaviour: the dataset's own mean normalised return (empty where unknown)."""
    behaviour = behaviour or {}
    best = _with_best(rows)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            [
                "task",
                "config",
                "seeds",
                "n_final",
                "final_scores",
                "final_mean",
                "final_std_ddof1",
                "final_t95_low",
                "final_t95_high",
                *(["n_best", "best_mean"] if best else []),
                "dataset_behaviour",
                "target",
                "normalized",
                "steps",
                "parameters",
                "reference_source",
                "dataset_ids",
            ]
        )
        writer.writerows(_csv_cells(row, best, _behaviour_of(row, behaviour)) for row in rows)
    return path


def _csv_cells(row: Row, best: bool, found: Behaviour) -> list[object]:
    """One row of write_csv's table, in its header's order."""
    average = row.task == "average"
    ci = None if average else t_interval(row.final)
    std = None if average else sample_std(row.final)
    return [
        row.task,
        row.config,
        " ".join(map(str, row.seeds)),
        len(row.final),
        " ".join("nan" if s is None else f"{s:.4f}" for s in row.per_seed),
        f"{np.mean(row.final):.4f}" if row.final else "",
        "" if std is None else f"{std:.4f}",
        *(["", ""] if ci is None else [f"{ci[0]:.4f}", f"{ci[1]:.4f}"]),
        *([len(row.best), f"{np.mean(row.best):.4f}" if row.best else ""] if best else []),
        "" if found.value is None else f"{found.value:.4f}",
        " ".join(f"{t:g}" for t in row.targets),
        row.normalized,
        " ".join(map(str, row.steps)),
        " ".join(map(str, row.parameters)),
        "; ".join(row.references),
        "; ".join(row.datasets),
    ]


# ---- attention spectrum -----------------------------------------------------------------------


def _ranks(summaries: list[RunSummary]) -> dict[tuple[str, str, int], tuple[str, list[int], int]]:
    """(task, config, block) -> (its attention kind, rank_90 per seed, singular values)."""
    from primal_dt.evaluation.spectrum import rank_at

    found: dict[tuple[str, str, int], tuple[str, list[int], int]] = {}
    for summary in sorted(summaries, key=lambda r: (r.task, r.config, r.seed)):
        for block, curve in enumerate(summary.spectra or []):
            key = (summary.task, summary.config, block)
            kind = summary.block_kinds[block]
            found.setdefault(key, (kind, [], len(curve)))[1].append(rank_at(curve))
    return found


def spectrum_table(summaries: list[RunSummary]) -> str:
    """Per task, config and block: how many singular values hold 90% of their sum (rank_90)."""
    lines = [
        "| task | config | block | attention | rank_90: singular values for 90% (mean ± std, "
        "ddof 1) | of |",
        "|---|---|---|---|---|---|",
    ]
    for (task, config, block), (kind, ranks, size) in _ranks(summaries).items():
        std = sample_std(ranks)
        spread = (
            f"{np.mean(ranks):.1f} (1 seed)" if std is None else f"{np.mean(ranks):.1f} ± {std:.1f}"
        )
        lines.append(
            f"| {task} | {config} | {block} | {attention_label(kind)} | {spread} | {size} |"
        )
    return "\n".join(lines)


def spectrum_section(summaries: list[RunSummary]) -> str:
    """The report's attention spectrum section: its rank_90 table and the sentences it allows."""
    sentences = "\n".join(f"- {s}" for s in spectrum_sentences(summaries))
    return (
        "## Attention spectrum\n\nNormalised cumulative singular values of each block's "
        "attention output on fixed windows of the task's dataset (the same windows for every "
        "run of a task; see primal_dt/evaluation/spectrum.py), from each run's last "
        "checkpoint: rank_90, the fewer singular values hold 90% of the sum, the lower the "
        "rank. A block is said to have the lower rank_90 only where the difference of the "
        "means exceeds the sum of the stds over seeds. The sentences compare every other "
        "attention with softmax: first the same block of two configs of a task (where one "
        "has softmax there), then a block of another kind with the softmax blocks of its own "
        "model.\n\n"
        f"{spectrum_table(summaries)}\n\n"
        f"{sentences or 'No study here has a softmax block beside a block of another kind.'}"
    )


def spectrum_sentences(summaries: list[RunSummary]) -> list[str]:
    """The sentences the rank_90 table allows (compare_ranks), for every attention kind a study
    holds against softmax: first the matched ones, a block of another kind against the same
    block of a config of the same task where it is softmax (the study's one change); then,
    within a config, each block of another kind against each of its softmax blocks."""
    ranks = _ranks(summaries)
    sentences = []
    for (task, config, block), (kind, kind_ranks, _) in ranks.items():
        for (t, other, b), (other_kind, softmax_ranks, _) in ranks.items():
            if kind != "softmax" and other_kind == "softmax" and (t, b) == (task, block):
                sentences.append(
                    compare_ranks(
                        f"{task}, block {block}",
                        _block(f"{config} ({attention_label(kind)})", kind_ranks),
                        _block(f"{other} (softmax)", softmax_ranks),
                    )
                )
    for task, config in unique([(task, config) for task, config, _ in ranks]):
        blocks = {b: v for (t, c, b), v in ranks.items() if (t, c) == (task, config)}
        others = [b for b, (kind, _, _) in blocks.items() if kind != "softmax"]
        softmax = [b for b, (kind, _, _) in blocks.items() if kind == "softmax"]
        sentences += [
            compare_ranks(
                f"{task} ({config})",
                _block(f"{attention_label(blocks[o][0])} block {o}", blocks[o][1]),
                _block(f"softmax block {s}", blocks[s][1]),
            )
            for o in others
            for s in softmax
        ]
    return sentences


def _block(name: str, ranks: list[int]) -> tuple[str, float, float | None]:
    return name, float(np.mean(ranks)), sample_std(ranks)


# ---- the paper's table ------------------------------------------------------------------------

PAPER_HEADING = "## The paper's table"


def paper_table(paper: PaperScores, ours: Sequence[str] = ()) -> str:
    """The paper's table as it printed it, in a section of its own; then, for the tasks of ours
    (task names) that it has, its row in words, so a reader finds the counterpart."""
    columns = list(paper.columns.values())
    lines = [
        PAPER_HEADING,
        "",
        "Not ours, and not directly comparable with ours: the Primal-Attention paper's D4RL "
        f"table ({paper.source}), with the ± as printed. Measured on D4RL v2 datasets of a "
        "million steps each, in gym v3 environments, normalised with D4RL's reference scores; "
        "ours are trained on the Minari datasets named in the per-task table, evaluated in "
        f"gymnasium v5 environments and normalised with the reference scores named there. "
        f"{paper.dt_column} Its columns are these configs: "
        + ", ".join(f"{column} = {config}" for config, column in paper.columns.items())
        + ".",
        "",
        "| task (D4RL v2) | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for task in paper.tasks():
        cells = [f"{paper.scores[task][c]:.1f} ± {paper.spread[task][c]:.1f}" for c in columns]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    cells = [f"{paper.average[c]:.1f} ± {paper.average_spread[c]:.1f}" for c in columns]
    lines.append("| **average** | " + " | ".join(cells) + " |")
    here = [task for task in unique(list(ours)) if task in paper.scores]
    if here:
        lines += ["", "Its rows for the tasks of this report (the names match; the data do not):"]
        lines += [f"- {task}: {paper.cell(task, '')}" for task in here]
    return "\n".join(lines)
