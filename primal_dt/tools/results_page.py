"""The results page's text for one study (docs/results.md, written by scripts/results.py), from the
study's report.json (report_data.py), never from report.md's text: the line that says what was
run, where and how long; the report's sections, headings one level down; what a study made a task
at a time says over its tasks; and the page's first paragraph (what the matched study can answer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import date

from primal_dt.tools.corl import CorlScores
from primal_dt.tools.flatness import FLAT_MARGIN
from primal_dt.tools.paired import PairedOverTasks, over_tasks_sentence
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.report_comparisons import (
    LAST_QUARTER_OVER_TASKS_HEADING,
    OVER_TASKS_HEADING,
)
from primal_dt.tools.report_data import FlatnessResult, ReportData, ReportSection, StudyFacts
from primal_dt.tools.report_tables import PAPER_HEADING, paper_table

FIGURES_HEADING = "Figures"
AGGREGATES_HEADING = "Aggregates over tasks"
OVER_TASKS = (
    OVER_TASKS_HEADING.removeprefix("## "),
    LAST_QUARTER_OVER_TASKS_HEADING.removeprefix("## "),
    AGGREGATES_HEADING,
)
# The matched study's comparison that the first paragraph is about: Primal.+DT against DT.
PRIMAL, DT = "matched-primal", "matched-softmax"

Link = Callable[[str], str]  # a figure's file name beside report.md -> its link on the page


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def machines(study: StudyFacts) -> str:
    """The machines the runs trained on, as each recorded them (another CPU gives other bits, so
    a study made on two says so)."""
    return " and ".join(study.machines) or "an unrecorded machine"


def precisions(study: StudyFacts) -> str:
    """The precision the runs trained in (auto picks bf16 only on hardware with a bf16 unit, so
    a study's numbers depend on it)."""
    return " and ".join(study.precisions) or "no recorded precision"


def study_line(command: str, section: str, study: StudyFacts, compared: str, seeds: int) -> str:
    """What was run, where, in what precision and how long, over which tasks."""
    if study.minutes:
        pace = f"{study.steps / (study.minutes / 60):,.0f}"
        time = (
            f"{plural(round(study.minutes), 'minute')} of training (each session of each run "
            f"from its start to its final evaluation, overlaps counted once; {pace} training "
            f"steps an hour of the study, evaluations included)"
        )
    else:
        time = "no recorded training time"
    tasks = study.tasks
    return (
        f"Made by `{command}` ({section}) on {date.today()}, on {machines(study)}, trained in "
        f"{precisions(study)}, {time}: {plural(len(tasks), 'task')} ({', '.join(tasks)}) x "
        f"{compared} x {seeds} seeds."
    )


def _shown(section: ReportSection, link: Link) -> str:
    """A section for the page: its heading one level down, its figures' links made the page's."""
    body = section.body
    for name in section.figures:
        body = body.replace(f"]({name})", f"]({link(name)})")
    return f"### {section.heading}\n\n{body}"


def section_text(data: ReportData, link: Link) -> str:
    """The report for the page: its lead and its sections, without the paper's table (the page
    has it once, paper_section) and without its Figures section, whose figures follow at the end
    (the others stay where their sections show them)."""
    left_out = (PAPER_HEADING.removeprefix("## "), FIGURES_HEADING)
    kept = [s for s in data.sections if s.heading not in left_out]
    figures = data.section(FIGURES_HEADING)
    pictures = (
        [f"![{name.removesuffix('.png')}]({link(name)})" for name in figures.figures]
        if figures
        else []
    )
    return "\n\n".join([data.lead, *(_shown(s, link) for s in kept), *pictures])


def over_tasks_text(data: ReportData, link: Link) -> str:
    """What the report says over tasks (the paired differences over tasks, at the final
    evaluation and over the last quarter, and the aggregates, with their figures), or a line
    saying the report has none (fewer than two tasks pair)."""
    kept = [s for s in data.sections if s.heading in OVER_TASKS]
    if not kept:
        return "The report has no comparison over tasks: no config pairs on two tasks."
    return "\n\n".join(_shown(s, link) for s in kept)


def paper_section() -> str:
    """The paper's table as the report renders it, without its heading (the page has one)."""
    return paper_table(paper_scores()).removeprefix(PAPER_HEADING).strip()


def flatness_sentence(curves: list[FlatnessResult]) -> str:
    """How many of the curves are flat (an equivalence test: flatness.py), and the others with
    their verdicts."""
    flat = [curve for curve in curves if curve.flat]
    others = [f"{c.config} on {c.task} ({c.verdict})" for c in curves if not c.flat]
    sentence = (
        f"Over the end of training, {len(flat)} of the {len(curves)} curves (task and config) "
        f"are flat within ±{FLAT_MARGIN:g} points per 1,000 steps (90% interval of the slope)"
    )
    return sentence + (f"; the others: {'; '.join(others)}." if others else ".")


def first_paragraph(data: ReportData, corl: CorlScores) -> str:
    """The results page's first paragraph, from the matched study's report.json: its budget
    against DT's own at CORL's (steps, windows seen, model), what it can detect (the paired
    difference over tasks of matched-primal against matched-softmax, and per task), which curves
    are flat, and what fraction of CORL's DT score the baseline reaches at this budget."""
    if not data.corl or data.study is None:
        return "The matched study's report has no side table against CORL's DT: nothing to say."
    over = [o for o in data.over_tasks if (o.config, o.baseline) == (PRIMAL, DT)]
    per_task = [
        p.detectable
        for p in data.paired
        if (p.config, p.baseline) == (PRIMAL, DT) and p.detectable is not None
    ]
    detect = (
        f"Over the tasks, {over_tasks_sentence(PairedOverTasks(**dataclasses.asdict(over[0])))}"
        if over
        else "No difference over tasks was computed (it needs the same seeds on several tasks)."
    )
    if per_task:
        detect += (
            f" Per task, the smallest difference it could detect at 80% power ranges from "
            f"{min(per_task):.1f} to {max(per_task):.1f} points."
        )
    if data.flatness:
        detect += " " + flatness_sentence(data.flatness)
    side = data.corl[0]
    steps, batch = side.steps[0], max(data.study.batch_sizes)
    parameters = ", ".join(f"{count:,}" for count in side.parameters) or "unknown"
    fractions = ", ".join(f"{row.task} {row.fraction:.2f}" for row in data.corl)
    windows, theirs = steps * batch, corl.steps * corl.batch_size
    return (
        f"**What this study can answer.** Each run trains {steps:,} steps of a model of "
        f"{parameters} parameters ({DT}; configs/matched.toml): {steps / corl.steps:.0%} of the "
        f"{corl.steps:,} steps at which CORL trains DT, and, at batch {batch}, "
        f"{windows / theirs:.2%} of the windows it sees ({windows:,} against {theirs:,}); CORL's "
        f"DT is a model of {corl.model}. At this budget DT ({DT}) reaches, as a fraction of "
        f"CORL's published DT score on D4RL's data of the same name, both on D4RL's reference "
        f"scores (a side table, not a comparison of methods: other data and environment "
        f"versions): {fractions}. {detect}"
    )
