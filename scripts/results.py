"""The results page (docs/results.md) and the README's two-line summary, made by the pipeline
itself: record the datasets from the behaviour policies in tests/policies, `primal-dt sweep` the
matched comparison (configs/matched.toml with each attention in its last block, nothing else
different) over seeds, `primal-dt report`, and write its tables and figures into the docs.

    python scripts/results.py                          # matched DT against Primal-DT, 3 medium datasets, 5 seeds
        # (and matched-bc, DT without return conditioning: behaviour cloning; --no-bc leaves it out)
    python scripts/results.py --write-docs             # and write docs/results.md and the README's summary
    python scripts/results.py --replay --write-docs    # the same on the medium-replay datasets
        # (trains SAC again to record them: 55k to 120k steps, 12 to 32 minutes of a core each)
    python scripts/results.py --medium-expert --write-docs   # ... on the medium-expert datasets
        # (the medium episodes and as many steps of the TQC expert's, as D4RL combined them)
    python scripts/results.py --medium-expert --tasks hopper-medium-expert --section results-expert-hopper
        # one task apart, into a section of its own (results-expert-<env>), as time allows
    python scripts/results.py --medium-expert --combine --write-docs
        # the runs of those sections read together: what they say over the tasks; trains nothing
    python scripts/results.py --attentions all --no-bc --tasks halfcheetah-medium
        # all seven attentions of the paper's table, on one dataset
    python scripts/results.py --compare-init --write-docs
        # matched-primal with each initialisation of We and Wr (model.attention_settings.primal.init), side by side
    python scripts/results.py --paper --tasks halfcheetah-medium,... --device cuda --seeds 0,1,2
        # the papers' own configs at their budget (100k steps): the reproduction, on a GPU

At the CPU budget this compares attentions under one matched setting on datasets recorded here; it
does not reproduce the paper's numbers, which came from D4RL v2 datasets at 100k steps.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from bench_common import primal_dt
from doc_tables import write_section

from primal_dt.common.loading import named_config_path
from primal_dt.method.attention import PRIMAL_INITS
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.runconfig import RunConfig, read_run_config
from primal_dt.store.rundir import EVAL_EVENTS_SUFFIX, RunDir
from primal_dt.store.snapshots import read_snapshot
from primal_dt.tools.corl import CorlScores, corl_scores
from primal_dt.tools.flatness import FLAT
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.report_comparisons import (
    LAST_QUARTER_HEADING,
    LAST_QUARTER_OVER_TASKS_HEADING,
    OVER_TASKS_HEADING,
)
from primal_dt.tools.report_tables import PAPER_HEADING, paper_table

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "tests" / "policies"
FIGURES = ROOT / "scripts" / "figures"
RESULTS_PAGE = ROOT / "docs" / "results.md"
# The environments recorded here, with the seed of the SAC run that made each medium policy
# (tests/policies/README.md: how, and what each reached). <env>-medium: episodes of that policy;
# <env>-medium-replay: every transition of that SAC run, trained again with the same seed, budget
# and one thread, as D4RL made its medium-replay data; <env>-expert: episodes of the TQC expert in
# tests/policies/tqc; <env>-medium-expert: the medium and expert datasets in one, equal in steps, as
# D4RL's (a million steps of each).
RECORDED = {
    "halfcheetah": ("HalfCheetah-v5", 0),
    "hopper": ("Hopper-v5", 1),
    "walker2d": ("Walker2d-v5", 0),
}
SAC_BUDGET = 120000  # SAC steps at most, as for the medium policies
# The results page's section for a study on the datasets of one quality (docs/results.md).
SECTIONS = {
    "medium": "results",
    "medium-replay": "results-replay",
    "medium-expert": "results-expert",
}
# Studies of their own, said apart in the README's summary and not counted among its datasets.
STUDIES_APART = {
    "results-attentions": (
        "The seven attentions of the paper's table, in the matched config's last block,"
    ),
    "results-init": "Primal's two initialisations of We and Wr,",
}


def recorded_tasks(quality: str) -> list[str]:
    return [f"{name}-{quality}" for name in RECORDED]


def make_arguments(task: str, root: Path, steps: int) -> list[str] | None:
    """The `primal-dt datasets make` arguments that record task, or None for a task this script
    does not record (it must then be in the Minari root already)."""
    name, _, quality = task.partition("-")
    if name not in RECORDED or quality not in ("medium", "expert", *SECTIONS):
        return None
    gym_id, sac_seed = RECORDED[name]
    common = [
        "--env",
        name,
        "--expert-policy",
        str(POLICIES / "tqc" / f"{gym_id}.zip"),
        "--no-progress",
    ]
    if quality in ("medium", "expert"):
        policy = POLICIES / ("medium" if quality == "medium" else "tqc") / f"{gym_id}.zip"
        return [
            *common,
            "--recipe",
            "policy",
            "--name",
            quality,
            "--steps",
            str(steps),
            "--policy",
            str(policy),
        ]
    if quality == "medium-expert":
        return [*common, "--recipe", "medium-expert", "--offline"]
    return [
        *common,
        "--recipe",
        "medium-replay",
        "--seed",
        str(sac_seed),
        "--max-steps",
        str(SAC_BUDGET),
        "--policy-out",
        str(root.parent / "replay-policies" / f"{gym_id}.zip"),
    ]


def recording_stages(tasks: list[str]) -> list[list[str]]:
    """The datasets to record for tasks, in two stages: first every single dataset (a
    combination's parts among them), then the combinations (medium-expert), which read them."""
    combined = [task for task in tasks if task.endswith("-medium-expert")]
    parts = [
        task.replace("-medium-expert", f"-{part}")
        for task in combined
        for part in ("medium", "expert")
    ]
    single = [task for task in tasks if task not in combined]
    return [list(dict.fromkeys([*single, *parts])), combined]


def record(root: Path, tasks: list[str], steps: int, env: dict[str, str], parallel: int) -> None:
    """The datasets of tasks that this script records and root lacks, recorded there with
    measured reference scores (recording_stages' order), `parallel` at once, each on one thread
    (the same bits however many run beside it)."""
    one_thread = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for stage in recording_stages(tasks):
        missing = []
        for task in stage:
            name, _, quality = task.partition("-")
            arguments = make_arguments(task, root, steps)
            if arguments is not None and not (root / "primal-dt" / name / f"{quality}-v0").exists():
                print(f"recording {task}", flush=True)
                missing.append(arguments)
        with ThreadPoolExecutor(max(1, parallel)) as pool:
            list(
                pool.map(
                    lambda arguments: primal_dt("datasets", "make", *arguments, env=one_thread),
                    missing,
                )
            )


def matched_config(out: Path, kind: str) -> Path:
    """configs/matched.toml with `kind` in the last block, as a config of its own name
    (matched-<kind>), so that the report sets the kinds side by side."""
    text = named_config_path("matched").read_text()
    text = re.sub(r"(?m)^attention = .*$", f'attention = ["softmax", "softmax", "{kind}"]', text)
    # Only the last kind's own settings: a table for a kind no block uses is refused.
    text = re.sub(
        r"(?ms)^\[model\.attention_settings\.([\w-]+)\]\n.*?(?=^\[|\Z)",
        lambda table: table[0] if table[1] == kind else "",
        text,
    )
    path = out / "configs" / f"matched-{kind}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def bc_config(out: Path) -> Path:
    """The matched config with softmax in its last block and without return conditioning
    (model.return_conditioning = false), as a config of its own name (matched-bc): behaviour
    cloning with the same network, budget and data, so that the table says what sequence
    modelling with returns adds."""
    text = matched_config(out, "softmax").read_text()
    text, count = re.subn(r"(?m)^\[model\]\n", "[model]\nreturn_conditioning = false\n", text)
    assert count == 1, "configs/matched.toml has one [model] table"
    path = out / "configs" / "matched-bc.toml"
    path.write_text(text)
    return path


def init_config(out: Path, init: str) -> Path:
    """The matched config with Primal in its last block (matched-primal) and its init setting
    (model.attention_settings.primal.init) = init, as a config of its own name
    (matched-primal-<init>-init), so that the report sets the two side by side with nothing else
    different."""
    text = matched_config(out, "primal").read_text()
    text, count = re.subn(r"(?m)^init = .*$", f'init = "{init}"', text)
    assert count == 1, "configs/matched.toml sets Primal's init once"
    path = out / "configs" / f"matched-primal-{init}-init.toml"
    path.write_text(text)
    return path


def comparison(
    args: argparse.Namespace, out: Path, tasks: list[str]
) -> tuple[str, str, str, list[str]]:
    """(configs for the sweep, docs section, what is compared, extra settings): the matched
    comparison on medium-replay data has a section of its own."""
    if args.compare_init:
        configs = [str(init_config(out, init)) for init in PRIMAL_INITS]
        return ",".join(configs), "results-init", "matched-primal with each initialisation", []
    if args.paper:
        return "dt,primal-dt", "results-paper", "the papers' DT and Primal.+DT configs", []
    kinds = list(ATTENTIONS) if args.attentions == "all" else args.attentions.split(",")
    configs = ",".join(str(matched_config(out, kind)) for kind in kinds)
    if args.bc:
        configs += f",{bc_config(out)}"
    qualities = {task.partition("-")[2] for task in tasks}
    quality = qualities.pop() if len(qualities) == 1 else "medium"
    section = "results-attentions" if len(kinds) > 2 else SECTIONS.get(quality, "results")
    compared = f"the matched config with {', '.join(kinds)} in its last block"
    return configs, section, compared + (", and matched-bc" if args.bc else ""), []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps per run (the config's)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds (0,1,2,3,4)")
    parser.add_argument(
        "--dataset-steps",
        type=int,
        default=1_000_000,
        help="steps recorded per medium or expert dataset (1,000,000: D4RL's)",
    )
    parser.add_argument("--tasks", help="tasks instead of the recorded medium ones")
    datasets = parser.add_mutually_exclusive_group()
    datasets.add_argument(
        "--replay",
        action="store_true",
        help="the recorded medium-replay datasets instead (trains SAC to make them)",
    )
    datasets.add_argument(
        "--medium-expert",
        action="store_true",
        help="the recorded medium-expert datasets instead (records the expert's)",
    )
    parser.add_argument(
        "--attentions",
        default="softmax,primal",
        help="kinds in the matched config's last block, or 'all' (softmax,primal)",
    )
    parser.add_argument(
        "--bc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also matched-bc: softmax without return conditioning (on)",
    )
    parser.add_argument("--episodes", type=int, help="final episodes per target (the config's)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="results", help="where datasets and runs go (results)")
    parser.add_argument("--paper", action="store_true", help="the papers' configs at their budget")
    parser.add_argument(
        "--compare-init",
        action="store_true",
        help="Primal-DT with each initialisation of We and Wr (model.attention_settings.primal.init)",
    )
    parser.add_argument(
        "--section",
        help="the docs section to write (default: the study's quality's; "
        "<that>-<env> for some of its tasks apart, counted in the summary)",
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--record-only",
        action="store_true",
        help="record the datasets the study needs, and train nothing",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="read the runs of the tasks' sections made apart (<section>-<env>) "
        "together, and train nothing",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    env = {**os.environ, "MINARI_DATASETS_PATH": str(out / "minari")}
    quality = (
        "medium-replay" if args.replay else "medium-expert" if args.medium_expert else "medium"
    )
    tasks = args.tasks.split(",") if args.tasks else recorded_tasks(quality)
    if args.combine:
        combine(args, out, quality, tasks, env)
        return
    record(out / "minari", tasks, args.dataset_steps, env, args.parallel)
    if args.record_only:
        return
    configs, section, compared, settings = comparison(args, out, tasks)
    section = args.section or section
    if args.episodes is not None:
        settings = [*settings, f"eval.final_episodes={args.episodes}"]
    steps = ["--steps", str(args.steps)] if args.steps else []
    # Each section's runs and report apart: the report covers every run below its folder.
    runs, reported = out / f"{section}-runs", out / f"{section}-report"
    primal_dt(
        "sweep",
        "--tasks",
        ",".join(tasks),
        "--seeds",
        args.seeds,
        "--configs",
        configs,
        "--runs-dir",
        str(runs),
        *steps,
        "--device",
        args.device,
        "--parallel",
        str(args.parallel),
        "--offline",
        *[a for s in settings for a in ("--set", s)],
        env=env,
    )
    primal_dt("report", str(runs), "--out", str(reported), env=env)
    minutes, records = study_minutes(runs), recorded(runs)
    pace = f"{study_steps(runs) / (minutes / 60):,.0f}" if minutes else "no recorded session's"
    report = (reported / "report.md").read_text()
    # The docs show copies of the figures; a study that writes no docs writes nothing outside --out.
    pictures = (
        copy_figures(reported, section)
        if args.write_docs
        else [(picture.name, picture) for picture in sorted(reported.glob("*.png"))]
    )
    seeds = len(args.seeds.split(","))
    text = "\n".join(
        [
            f"Made by `python scripts/results.py` ({section}) on {date.today()}, on "
            f"{study_machines(records)}, trained in {study_precision(records)}, "
            f"{minutes:.0f} minutes of training (each session of each run from its start to its "
            f"final evaluation, overlaps counted once; {pace} training steps "
            f"an hour of the study, evaluations included): {len(tasks)} "
            f"task{'s' * (len(tasks) > 1)} ({', '.join(tasks)}) x {compared} x {seeds} seeds.",
            "",
            section_of(report),
            "",
            *[f"![{name}]({figure_link(path)})\n" for name, path in pictures],
        ]
    )
    print(text)
    if args.write_docs:
        write_section(section, text)
        if section == "results":  # the matched study on the medium datasets: the page's first
            batch = max(record.config.train.batch_size for record in records)
            write_section("results-first", first_paragraph(report, corl_scores(), batch))
        write_section("paper-table", paper_section())
        write_section("results-summary", summary(RESULTS_PAGE.read_text()))


def combine(
    args: argparse.Namespace, out: Path, quality: str, tasks: list[str], env: dict[str, str]
) -> None:
    """The quality's section (or --section) from the runs of its tasks' sections made apart
    (<section>-<env>-runs, one per task), reported together: what they say over the tasks (the
    paired differences over tasks, at the final evaluation and over the last quarter, and the
    aggregates), which no one task's section can say. Trains nothing: a study made a task at a
    time, as the 2 cores allow, is read whole without training it again into <section>-runs."""
    section = args.section or SECTIONS[quality]
    parts = {task: out / f"{section}-{task.partition('-')[0]}-runs" for task in tasks}
    missing = [f"{task} in {runs}" for task, runs in parts.items() if not runs.is_dir()]
    if missing:
        raise SystemExit(
            f"results.py --combine: no runs of {'; '.join(missing)}; make each task's first: "
            f"python scripts/results.py --tasks TASK --section {section}-ENV (with the same "
            f"dataset flag and --out)"
        )
    reported = out / f"{section}-report"
    primal_dt("report", *map(str, parts.values()), "--out", str(reported), env=env)
    records = [record for runs in parts.values() for record in recorded(runs)]
    text, pictures = over_tasks_of((reported / "report.md").read_text())
    for name in pictures:  # the docs show copies of the figures, as for a study
        target = FIGURES / f"{section}_{name}" if args.write_docs else reported / name
        if args.write_docs:
            shutil.copy(reported / name, target)
        text = text.replace(f"]({name})", f"]({figure_link(target)})")
    flag = {"medium-replay": " --replay", "medium-expert": " --medium-expert"}.get(quality, "")
    configs = sorted({record.config_name for record in records})
    seeds = len({record.config.train.seed for record in records})
    names = ", ".join(f"{section}-{task.partition('-')[0]}" for task in tasks)
    text = "\n".join(
        [
            f"Made by `python scripts/results.py{flag} --combine` ({section}) on {date.today()}, "
            f"from the runs of the sections made apart below ({names}), read together; on "
            f"{study_machines(records)}, trained in {study_precision(records)}: {len(tasks)} "
            f"task{'s' * (len(tasks) > 1)} ({', '.join(tasks)}) x {', '.join(configs)} x {seeds} "
            f"seeds. Here, what they say over the tasks; each task's scores, comparisons, curves "
            f"and spectra are in its own section.",
            "",
            text,
        ]
    )
    print(text)
    if args.write_docs:
        write_section(section, text)
        write_section("results-summary", summary(RESULTS_PAGE.read_text()))


def over_tasks_of(report: str) -> tuple[str, list[str]]:
    """(the report's sections over tasks, headings one level down; the pictures they show): the
    paired differences over tasks, at the final evaluation and over the last quarter, and the
    aggregates, or a line saying the report has none (fewer than two tasks pair)."""
    over = (OVER_TASKS_HEADING, LAST_QUARTER_OVER_TASKS_HEADING, "## Aggregates over tasks")
    kept = _report_lines(report, lambda heading: heading in over, before_headings=False)
    if not kept:
        return "The report has no comparison over tasks: no config pairs on two tasks.", []
    return "\n".join(kept).strip(), re.findall(r"(?m)^!\[[^]]*\]\(([^)]+)\)", "\n".join(kept))


def first_paragraph(report: str, corl: CorlScores, batch_size: int) -> str:
    """The results page's first paragraph, from the matched study's report and its runs' batch
    size: its budget against DT's own at CORL's (steps, windows seen, model), what it can detect
    (the paired difference over tasks of matched-primal against matched-softmax, and per task),
    which curves are flat, and what fraction of CORL's DT score the baseline reaches at this
    budget (the report's side table)."""
    over = [
        s
        for s in _sentences(report, OVER_TASKS_HEADING.removeprefix("## "))
        if s.startswith("matched-primal − matched-softmax")
    ]
    per_task = [
        float(n)
        for s in _sentences(report, "Comparisons per task")
        if s.startswith("matched-primal − matched-softmax")
        for n in re.findall(r"could detect ([\d.]+) points", s)
    ]
    side = re.findall(
        r"(?m)^\| ([\w.-]+) \| ([\d,]+) steps, ([\d,]+) parameters \| ([\d.-]+) .*"
        r"\| ([\d.]+) \|$",
        report,
    )
    if not side:
        return "The matched study's report has no side table against CORL's DT: nothing to say."
    steps, parameters = int(side[0][1].replace(",", "")), side[0][2]
    fractions = ", ".join(f"{task} {float(fraction):.2f}" for task, *_, fraction in side)
    detect = (
        f"Over the tasks, {over[0]}"
        if over
        else "No difference over tasks was computed (it needs the same seeds on several tasks)."
    )
    if per_task:
        detect += (
            f" Per task, the smallest difference it could detect at 80% power ranges from "
            f"{min(per_task):.1f} to {max(per_task):.1f} points."
        )
    if curves := _sentences(report, "Are the curves flat?"):
        detect += " " + flatness_sentence(curves)
    windows = steps * batch_size
    return (
        f"**What this study can answer.** Each run trains {steps:,} steps of a model of "
        f"{parameters} parameters (matched-softmax; configs/matched.toml): {steps / corl.steps:.0%} of the "
        f"{corl.steps:,} steps at which CORL trains DT, and, at batch {batch_size}, "
        f"{windows / (corl.steps * corl.batch_size):.2%} of the windows it sees ({windows:,} "
        f"against {corl.steps * corl.batch_size:,}); CORL's DT is a model of {corl.model}. "
        f"At this budget "
        f"DT (matched-softmax) reaches, as a fraction of CORL's published DT score on D4RL's "
        f"data of the same name (a side table, not a comparison of methods: other data and "
        f"environment versions): {fractions}. {detect}"
    )


def flatness_sentence(curves: list[str]) -> str:
    """How many of the report's curves are flat, the widest interval among them (a flat verdict
    from a wide interval cannot rule out a change that large), and the ones that are not."""
    flat = [s for s in curves if s.endswith(f"{FLAT}.")]
    others = [
        f"{s.split(':')[0]} ({s.rsplit(': ', 1)[1].rstrip('.')})" for s in curves if s not in flat
    ]
    sentence = (
        f"Over the last quarter of training, {len(flat)} of the {len(curves)} curves (task "
        f"and config) are flat within the seeds' spread"
    )
    widths = [
        (float(high) - float(low)) / 2
        for s in flat
        for low, high in re.findall(r"\[([-+\d.]+), ([-+\d.]+)\]", s)
    ]
    if widths:
        sentence += (
            f", though their intervals on the change reach ±{max(widths):.1f} points, so "
            f"a change up to that size may go undetected"
        )
    return sentence + (f"; not flat: {'; '.join(others)}." if others else ".")


def summary(page: str) -> str:
    """The README's two lines, from the sentences of the results page's matched DT-against-
    Primal-DT sections (one per quality of dataset): on how many datasets the scores differ, and
    on how many the Primal block's rank_90 is below the same block's with softmax. A replication
    (a results-replication* section: new seeds, chosen after a study) is said apart, not counted.
    """
    qualities, envs = "|".join(SECTIONS.values()), "|".join(RECORDED)
    # One section per quality, and <section>-<env>...: some tasks of a quality, made apart.
    studies = _sections_named(page, rf"(?:{qualities})(?:-(?:{envs})[\w-]*)?")
    sentences = _primal_sentences(studies, "Comparisons per task")
    seeds = sorted({int(n) for text in studies for n in re.findall(r" x (\d+) seeds\.", text)})
    late = _primal_sentences(studies, LAST_QUARTER_HEADING.removeprefix("## "))
    late_over = LAST_QUARTER_OVER_TASKS_HEADING.removeprefix("## ")
    verdict = _verdict(sentences, late)
    power = "".join(  # with what the study could detect, and the same over the last quarter
        f" Over {_tasks_of(text)}: {_with_last_quarter(s, _primal_sentences([text], late_over))}"
        for text in studies
        for s in _primal_sentences([text], OVER_TASKS_HEADING.removeprefix("## "))
    )
    # Replications (sections results-replication*): new seeds, decided after a study, apart.
    again = _sections_named(page, r"results-replication[\w-]*")
    replicated = "".join(
        f" Again with new seeds: {s}" for s in _primal_sentences(again, "Comparisons per task")
    )
    matched = [s for s in _primal_sentences(studies, "Attention spectrum") if ", block " in s]
    lower = [s for s in matched if "(Primal) has a lower rank_90 than" in s]
    spectra = (
        f" The Primal block's attention output has a lower rank_90 than the same block's with "
        f"softmax on {len(lower)} of the {len(matched)} (beyond the spread over seeds)."
        if matched
        else ""
    )
    apart = "".join(_said_apart(page, name, label) for name, label in STUDIES_APART.items())
    return (
        f"Matched DT against Primal-DT (only the last block's attention differs) on "
        f"{len(sentences)} of the datasets recorded here{_overlap(sentences)}, "
        f"{' or '.join(map(str, seeds))} seeds "
        f"each, at a CPU budget: {verdict}.{replicated}{power}{spectra}{apart} "
        "Per-task scores, intervals and the paper's table: [Results](docs/results.md)."
    )


def _verdict(sentences: list[str], late: list[str]) -> str:
    """On how many of the comparisons' sentences a difference is claimed, each claimed one with
    the same pair's over the last quarter (late) beside it; or why none is."""
    found = [s for s in sentences if " scores above " in s or " scores below " in s]
    if not found:
        why = _why_none(sentences)
        return f"no difference in score detected on any of the {len(sentences)} ({why})"
    return (
        f"a difference on {len(found)} of {len(sentences)}{_by_chance(len(sentences))}: "
        + " ".join(_with_last_quarter(s, late) for s in found).removesuffix(".")
    )


def _said_apart(page: str, name: str, label: str) -> str:
    """A study of its own (section name, not counted among the datasets): each config against its
    baseline, with the range of what its comparisons could detect; "" until it is made."""
    text = _section(page, name)
    sentences = _primal_sentences([text], "Comparisons per task")
    if not sentences:
        return ""
    late = _primal_sentences([text], LAST_QUARTER_HEADING.removeprefix("## "))
    seeds = re.search(r" x (\d+) seeds\.", text)
    baseline = re.search(r" − ([\w.-]+) on ", sentences[0])
    detectable = sorted(
        float(d) for d in re.findall(r"could detect ([\d.]+) points", " ".join(sentences))
    )
    power = ""
    if detectable:
        low, high = detectable[0], detectable[-1]
        span = f"{low:.1f}" if low == high else f"{low:.1f} to {high:.1f}"
        power = f"; the comparisons could detect {span} points at 80% power"
    return (
        f" {label} on {_tasks_of(text)}, {seeds[1] if seeds else 'its'} seeds, each against "
        f"{baseline[1] if baseline else 'its baseline'}: {_verdict(sentences, late)}{power}."
    )


def _sections_named(page: str, pattern: str) -> list[str]:
    """The texts of the page's non-empty sections whose whole name matches pattern, in order."""
    names = re.findall(rf"<!-- ({pattern}):start -->", page)
    return [text for name in names if (text := _section(page, name))]


def _primal_sentences(studies: list[str], heading: str) -> list[str]:
    """The studies' sentences under heading, DT against Primal-DT alone (matched-bc's left out)."""
    return [s for text in studies for s in _sentences(text, heading) if "matched-bc" not in s]


def _with_last_quarter(claimed: str, late: list[str]) -> str:
    """A claimed difference's sentence with the same pair's over the runs' last-quarter
    evaluations (where its section has them): whether it holds before the final evaluation."""
    head = claimed.split(": ", 1)[0] + ": "  # "config − baseline on task: " (or "over n tasks")
    same = [s.removeprefix(head).split("; the study")[0] for s in late if s.startswith(head)]
    if not same:
        return claimed
    return f"{claimed.removesuffix('.')}; over each run's last-quarter evaluations: {same[0]}."


def _by_chance(comparisons: int) -> str:
    """How often, with no true difference on any task, at least one of several independent 95%
    intervals excludes 0 (1 − 0.95^n): what one claimed difference among them is worth."""
    if comparisons < 2:
        return ""
    chance = 1 - 0.95**comparisons
    return (
        f" (with no true difference on any, at least one of {comparisons} intervals at 95% "
        f"would exclude 0 in {chance:.0%} of studies)"
    )


def _tasks_of(study: str) -> str:
    """The tasks a study's first line names ("3 tasks (a, b, c) x ..."), or "tasks"."""
    found = re.search(r" \d+ tasks? \(([^)]*)\) x ", study)
    return found[1] if found else "tasks"


def _why_none(sentences: list[str]) -> str:
    """Why no difference was claimed: paired sentences' intervals on the difference hold 0;
    unpaired ones' intervals of the two configs overlap."""
    if all(" paired seeds" in s for s in sentences):
        return "each paired difference's 95% interval holds 0"
    return "95% intervals overlap"


def _overlap(sentences: list[str]) -> str:
    """Where the count holds a medium-expert dataset and its medium one: the first contains the
    second (D4RL's way), so they are not independent, and the count says so."""
    tasks = {found[1] for s in sentences if (found := re.search(r" on ([\w.-]+?)(?=[: ]|$)", s))}
    both = sorted(
        t for t in tasks if t.endswith("-medium-expert") and t.removesuffix("-expert") in tasks
    )
    if not both:
        return ""
    return (
        f" ({len(both)} of them medium-expert ones that hold a medium one of the count too: "
        f"{', '.join(both)}; not independent of it)"
    )


def _section(page: str, name: str) -> str:
    """The text between the page's markers of section name, or "" where it has none."""
    found = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", page, re.S)
    return found.group(1) if found else ""


def _sentences(text: str, heading: str) -> list[str]:
    """The bullet sentences under the heading (of any level) named heading."""
    found = re.search(rf"(?m)^#+ {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    return (
        [line[2:] for line in found.group(1).splitlines() if line.startswith("- ")] if found else []
    )


def copy_figures(reported: Path, section: str) -> list[tuple[str, Path]]:
    """The report's figures, copied to scripts/figures/<section>_<name> for the docs."""
    copied = []
    for picture in sorted(reported.glob("*.png")):
        target = FIGURES / f"{section}_{picture.name}"
        shutil.copy(picture, target)
        copied.append((picture.name, target))
    return copied


def figure_link(path: Path) -> str:
    """A figure as the docs link it (from docs/), or its own path where it is not in the checkout."""
    return f"../{path.relative_to(ROOT)}" if path.is_relative_to(ROOT) else str(path)


def run_folders(runs: Path) -> list[Path]:
    """Every run under runs: the folders holding a config.json (train writes it first)."""
    return sorted(path.parent for path in runs.rglob("config.json"))


def recorded(runs: Path) -> list[RunConfig]:
    """Every run's config.json under runs, read once for the study's line (the helpers below)."""
    return [read_run_config(RunDir(folder)) for folder in run_folders(runs)]


def study_steps(runs: Path) -> int:
    """The steps every run of the study trained: its checkpoint's, not its config.json's
    train.steps, which an extended run (--resume --steps) keeps from its first session."""
    checkpoints = [RunDir(folder).checkpoint for folder in run_folders(runs)]
    return sum(read_snapshot(path).step for path in checkpoints if path.exists())


def section_of(report: str) -> str:
    """The report's Markdown after its title, headings one level down, without its pictures
    (which live beside report.md; the docs show copies of them, after the section), without its
    Figures section (only pictures) and without the paper's table (the page has it once, in a
    section of its own: paper_section)."""
    kept = _report_lines(report, lambda heading: heading not in (PAPER_HEADING, "## Figures"))
    return "\n".join(line for line in kept if not line.startswith("![")).strip()


def _report_lines(
    report: str, keep: Callable[[str], bool], before_headings: bool = True
) -> list[str]:
    """The report's lines after its title under the `## ` headings that keep accepts (and those
    before its first heading where before_headings), headings one level down for the page."""
    kept, keeping = [], before_headings
    for line in report.splitlines()[1:]:
        if line.startswith("## "):
            keeping = keep(line)
        if keeping:
            kept.append("#" + line if line.startswith("## ") else line)
    return kept


def paper_section() -> str:
    """The paper's table as the report renders it, without its heading (the page has one)."""
    return paper_table(paper_scores()).removeprefix(PAPER_HEADING).strip()


def study_machines(records: list[RunConfig]) -> str:
    """The machines the runs trained on, as each recorded them (config.json's machines: another
    CPU gives other bits, so a study made on two says so)."""
    found = {machine for record in records for machine in record.machines}
    return " and ".join(sorted(found)) or "an unrecorded machine"


def study_precision(records: list[RunConfig]) -> str:
    """The precision the runs trained in, as each recorded it (train.precision resolved: auto
    picks bf16 only on hardware with a bf16 unit, so a study's numbers depend on it)."""
    found = {record.config.train.precision for record in records}
    return " and ".join(sorted(found)) or "no recorded precision"


# TensorBoard names each event file after the time its writer opened (torch's EventFileWriter:
# events.out.tfevents.<seconds>.<host>.<pid>.<n><suffix>); the trainer opens one writer without
# a suffix each session, the evaluation service one with EVAL_EVENTS_SUFFIX; other suffixes (a
# sweep's ".by_task" copies) are no session's.
EVENT_FILE = re.compile(
    rf"events\.out\.tfevents\.(\d+)\..*\.\d+\.\d+({re.escape(EVAL_EVENTS_SUFFIX)})?"
)


def training_sessions(folder: Path) -> list[tuple[float, float]]:
    """Each session of a run (one `train` command, the first or a --resume) as its span in
    seconds: from its trainer's event file's opening (the name's clock) to the last write of that
    file or of the evaluation files opened after it (the final evaluation ends the session; the
    file's mtime, so a copy must keep mtimes), so an extended run's idle time between its sessions
    is not counted. An external evaluator (eval.service="external") started long after its
    session would stretch that session: the studies evaluate beside training."""
    opened = sorted(
        (float(found[1]), bool(found[2]), path.stat().st_mtime)
        for path in folder.glob("events.out.tfevents.*")
        if (found := EVENT_FILE.fullmatch(path.name))
    )
    sessions: list[tuple[float, float]] = []
    for start, is_eval, written in opened:
        if not is_eval:
            sessions.append((start, written))
        elif sessions:  # an evaluation file belongs to the session that opened last before it
            sessions[-1] = (sessions[-1][0], max(sessions[-1][1], written))
    return sessions


def study_minutes(runs: Path) -> float:
    """Minutes during which some run was training: the union of every session of every run
    (training_sessions), read from the run folders, so the same figure when the report is made
    again, and no idle hours counted where a study was run in parts or extended."""
    spans = sorted(span for folder in run_folders(runs) for span in training_sessions(folder))
    total, reached = 0.0, float("-inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total / 60


if __name__ == "__main__":
    main()
