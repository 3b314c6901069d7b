"""A study of the results page, run as scripts/results.py runs it: record the datasets the study
needs (study_datasets.py), `primal-dt sweep` its configs (study_configs.py) over seeds, `primal-dt
report`, and write the section of docs/results.md from the report's report.json (results_page.py).

Every step is a `primal-dt` command, run by the `Command` given (scripts/results.py's runs each as a
user would; the tests' stand in for them), so that a study is what a user could run by hand.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from primal_dt.common.loading import option_overrides
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.rundir import config_name_of
from primal_dt.tools.corl import corl_scores
from primal_dt.tools.report_data import ReportData, read_report_data
from primal_dt.tools.results_page import (
    first_paragraph,
    machines,
    over_tasks_text,
    paper_section,
    plural,
    precisions,
    section_text,
    study_line,
)
from primal_dt.tools.results_table import (
    Glance,
    first_screen,
    glance,
    glance_figure,
    readme_summary,
)
from primal_dt.tools.study_configs import bc_config, init_configs, matched_config
from primal_dt.tools.study_datasets import (
    RECORDED,
    dataset_folder,
    make_arguments,
    recording_stages,
)
from primal_dt.tools.study_reuse import Reused, gather, reusable, reuse_note

REPOSITORY = Path(__file__).resolve().parents[2]  # a clone's (the docs are not in a wheel)
FIGURES = REPOSITORY / "scripts" / "figures"
# Each section's runs as small text (the report's runs/ copy), from which `primal-dt report
# results-data/<section>` makes the section's report again without the checkpoints.
RESULTS_DATA = REPOSITORY / "results-data"
# The figures of the page's first screen and the README's summary: the CPU budget's and, where the
# matched study has been made at the papers' budget, that one's.
GLANCE_FIGURE = FIGURES / "results_at_a_glance.png"
BUDGET_GLANCE_FIGURE = FIGURES / "results_budget_at_a_glance.png"
# The results page's section for the matched study on the datasets of one quality; a task made apart
# is in <that>-<env>. The studies of their own (results-attentions, results-init, and replications
# with new seeds, results-replication*) are not the matched comparison, nor in its table.
SECTIONS = {
    "medium": "results",
    "medium-replay": "results-replay",
    "medium-expert": "results-expert",
}
# The matched study at the papers' budget (scripts/gpu_study.sh): <that>-<env>, a task at a time.
BUDGET_SECTION = "results-budget"
# The command line that made a section, for its first line, per dataset quality.
COMMAND = "python scripts/results.py"
QUALITY_FLAG = {"medium-replay": " --replay", "medium-expert": " --medium-expert"}

Command = Callable[..., str]  # runs `primal-dt *args` with env=..., returns its output
WriteSection = Callable[[str, str], None]  # puts text between a docs section's markers


@dataclass
class Study:
    """What scripts/results.py's options ask for."""

    out: Path  # where datasets, runs and reports go
    tasks: list[str]
    quality: str = "medium"  # the datasets' quality: study_datasets.QUALITIES
    seeds: str = "0,1,2,3,4"
    steps: int | None = None  # training steps per run (None: the config's)
    dataset_steps: int = 1_000_000  # steps recorded per medium or expert dataset
    attentions: str = "softmax,primal"  # the kinds in the matched config's last block, or "all"
    bc: bool = True  # also matched-bc
    episodes: int | None = None  # final episodes per target (None: the config's)
    parallel: int = 2  # runs (and recordings) at once
    device: str = "cpu"
    paper: bool = False  # the papers' own configs at their budget
    budget: bool = False  # the matched configs at the papers' budget (study_configs.PAPERS_BUDGET)
    compare_init: bool = False  # matched-primal with each initialisation
    section: str | None = None  # the docs section (None: the study's own)
    write_docs: bool = False
    part: bool = False  # these seeds' runs join the section's kept runs (join_part)
    reuse: bool = True  # read the matched sections' kept runs of a config (study_reuse.py)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "MINARI_DATASETS_PATH": str(self.out / "minari")}


def record(study: Study, run: Command) -> None:
    """The datasets of the study's tasks that are recorded here and missing from its Minari root,
    recorded there with their environment's reference scores (study_datasets.REFERENCES), in
    recording_stages' order, study.parallel at once, each on one thread (the same bits however
    many run beside it)."""
    root = study.out / "minari"
    one_thread = {**study.env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for stage in recording_stages(study.tasks):
        missing = []
        for task in stage:
            arguments = make_arguments(task, root, study.dataset_steps)
            if arguments is not None and not dataset_folder(root, task).exists():
                print(f"recording {task}", flush=True)
                missing.append(arguments)
        with ThreadPoolExecutor(max(1, study.parallel)) as pool:
            list(pool.map(lambda a: run("datasets", "make", *a, env=one_thread), missing))


def comparison(study: Study) -> tuple[str, str, str]:
    """(configs for the sweep, the docs section, what is compared)."""
    out = study.out
    if study.compare_init:
        inits = ",".join(str(config) for config in init_configs(out))
        return inits, "results-init", "matched-primal with each initialisation"
    if study.paper:
        return "dt,primal-dt", "results-paper", "the papers' DT and Primal.+DT configs"
    kinds = list(ATTENTIONS) if study.attentions == "all" else study.attentions.split(",")
    configs = ",".join(str(matched_config(out, kind, study.budget)) for kind in kinds)
    if study.bc:
        configs += f",{bc_config(out, study.budget)}"
    qualities = {task.partition("-")[2] for task in study.tasks}
    quality = qualities.pop() if len(qualities) == 1 else "medium"
    section = "results-attentions" if len(kinds) > 2 else SECTIONS.get(quality, "results")
    compared = f"the matched config with {', '.join(kinds)} in its last block"
    if study.budget:  # a task at a time: the page has a section per environment
        env = study.tasks[0].partition("-")[0] if len(study.tasks) == 1 else ""
        section = f"{BUDGET_SECTION}-{env}" if env else BUDGET_SECTION
        compared = f"{compared}, at the papers' budget"
    return configs, section, compared + (", and matched-bc" if study.bc else "")


def figure_link(path: Path) -> str:
    """A figure as the docs link it (from docs/), or its own path where it is not in the clone."""
    return f"../{path.relative_to(REPOSITORY)}" if path.is_relative_to(REPOSITORY) else str(path)


def _linker(reported: Path, section: str, copy: bool) -> Callable[[str], str]:
    """The page's link to a figure of the report: with copy (--write-docs), to its copy in
    scripts/figures/<section>_<name>, made here; else to the report's own file."""

    def link(name: str) -> str:
        if not copy:
            return figure_link(reported / name)
        target = FIGURES / f"{section}_{name}"
        shutil.copy(reported / name, target)
        return figure_link(target)

    return link


def run_study(study: Study, run: Command, write: WriteSection | None = None) -> str:
    """Sweep the study's configs over its tasks and seeds, report, and return its section of the
    results page; with write (--write-docs), also write that section, the page's first paragraph
    (for the matched medium study), the paper's table and the README's summary."""
    configs, section, compared = comparison(study)
    section = study.section or section
    if study.part:
        check_part(study.tasks, configs, section)
    settings = [f"eval.final_episodes={study.episodes}"] if study.episodes is not None else []
    steps = ["--steps", str(study.steps)] if study.steps else []
    reused = _reused(study, configs, section, settings)
    trained = [c for c in configs.split(",") if Path(c).stem not in {r.config for r in reused}]
    # Each section's runs and report apart: the report covers every run below its folder.
    runs, reported = study.out / f"{section}-runs", study.out / f"{section}-report"
    if trained:
        run(
            *("sweep", "--tasks", ",".join(study.tasks), "--seeds", study.seeds),
            *("--configs", ",".join(trained), "--runs-dir", str(runs), *steps),
            *("--device", study.device, "--parallel", str(study.parallel), "--offline"),
            *[a for s in settings for a in ("--set", s)],
            env=study.env,
        )
    folders = [runs] if trained else []
    if reused:
        folders.append(gather(reused, study.out / f"{section}-reused"))
    joining = study.part and write is not None
    # A part's own runs need only their data's copy: the report is of the joined runs (join_part).
    only = ["--data-only"] if joining else []
    run("report", *map(str, folders), "--out", str(reported), *only, env=study.env)
    if joining:
        reported = join_part(study, run, reported, section)
    data = read_report_data(reported / "report.json")
    assert data.study is not None, "a report of runs knows what they were"
    link = _linker(reported, section, study.write_docs)
    head = study_line(COMMAND, section, data.study, compared, len(data.study.seeds))
    head += reuse_note(reused)
    text = f"{head}\n\n{section_text(data, link)}"
    if write is not None:
        keep_data(reported, section)
        write(section, text)
        if section == "results":  # the matched study on the medium datasets: the page's first
            write("results-first", first_paragraph(data, corl_scores()))
        write_page_wide(write)
    return text


def _reused(study: Study, configs: str, section: str, settings: list[str]) -> list[Reused]:
    """The study's configs whose runs the matched sections keep (study_reuse.py), for a study of
    its own (the attentions', the initialisations'): a matched section is made by training, and
    making it again is what its command asks."""
    if not study.reuse or section in _section_names([*SECTIONS.values(), BUDGET_SECTION]):
        return []
    overrides = [*settings, *option_overrides(steps=study.steps, device=study.device, offline=True)]
    seeds = [int(seed) for seed in study.seeds.split(",")]
    paths = [Path(config) for config in configs.split(",")]
    return reusable(paths, study.tasks, seeds, matched_sections(), overrides)


def check_part(tasks: Sequence[str], configs: str, section: str) -> None:
    """A part (--part) trains more seeds of the study whose runs the section keeps: the same tasks
    and configs, or it is refused before anything trains."""
    kept = RESULTS_DATA / section
    if not kept.is_dir():
        return
    has = {(run.parent.name, config_name_of(run.name)) for run in kept.glob("*/*")}
    wants = {(task, Path(config).stem) for task in tasks for config in configs.split(",")}
    if has != wants:
        raise SystemExit(
            f"results.py --part: {kept} keeps runs of {_pairs(has)}, and this part would train "
            f"{_pairs(wants)}; a part adds seeds to the same tasks and configs (give the flags "
            f"its first part was made with), or give another --section"
        )


def _pairs(pairs: set[tuple[str, str]]) -> str:
    return ", ".join(f"{config} on {task}" for task, config in sorted(pairs))


def join_part(study: Study, run: Command, reported: Path, section: str) -> Path:
    """A study too long for one sitting, made a few seeds at a time (--part): this part's runs (the
    copy `report --data-only` made, reported/runs) join the runs the section keeps, replacing a run
    of the same task, config and seed, and are reported together; returns that report's folder,
    whose runs keep_data then keeps. Only the study's folder is written until then, so a part that
    fails leaves the kept runs as they were. Each run's minutes are its own sessions', so the
    parts' idle time between sittings is not counted (report_data.StudyFacts.minutes)."""
    joined = study.out / f"{section}-joined"
    shutil.rmtree(joined, ignore_errors=True)
    kept = RESULTS_DATA / section
    if kept.is_dir():
        shutil.copytree(kept, joined)
    for made in sorted((reported / "runs").glob("*/*")):
        target = joined / made.parent.name / made.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(made, target)
    together = study.out / f"{section}-joined-report"
    run("report", str(joined), "--out", str(together), env=study.env)
    return together


def from_data(study: Study, kept: Path, run: Command, write: WriteSection | None = None) -> str:
    """The section of runs trained elsewhere (scripts/gpu_study.sh: the papers' budget on a GPU),
    from their data alone (`primal-dt report --data-only`'s copy, unpacked into kept,
    results-data/<section>): its report, figures and text, as run_study makes a section. Runs
    stopped before their final evaluation (a device call's time ran out) are refused: a section
    scores final evaluations. The page's first screens are written too where kept is the clone's
    results-data/<section>."""
    section = kept.name
    reported = study.out / f"{section}-report"
    run("report", str(kept), "--out", str(reported), env=study.env)
    data = read_report_data(reported / "report.json")
    stopped = [
        f"{scores.config}-s{seed} on {scores.task}"
        for scores in data.scores
        for seed, score in zip(scores.seeds, scores.scores, strict=True)
        if score is None
    ]
    if stopped:
        raise SystemExit(
            f"results.py --from-data: {len(stopped)} runs in {kept} have no final evaluation (their "
            f"sweep stopped early): {', '.join(stopped)}; train the task again with fewer SEEDS or "
            f"more time"
        )
    facts = data.study
    assert facts is not None, "a report of runs knows what they were"
    runs = len(facts.tasks) * len(facts.configs) * len(facts.seeds)
    compared = (
        f"{', '.join(facts.configs)}, at the papers' budget ({facts.steps // runs:,} steps a run)"
    )
    command = f"bash scripts/gpu_study.sh {' '.join(facts.tasks)}"
    head = study_line(command, section, facts, compared, len(facts.seeds))
    text = f"{head}\n\n{section_text(data, _linker(reported, section, study.write_docs))}"
    if write is not None:
        write(section, text)
        # The first screens read the kept sections: data read from elsewhere (gpu_study.sh --take
        # unpacks it apart) is not among them until kept, then `results.py --refresh` writes them.
        if kept.resolve() == (RESULTS_DATA / section).resolve():
            write_page_wide(write)
    return text


def keep_data(reported: Path, section: str) -> Path:
    """The report's copy of the runs (report.export_runs) as the section's data in the clone,
    replacing what an earlier study of the section left."""
    kept = RESULTS_DATA / section
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(reported / "runs", kept)
    return kept


def combined_parts(section: str, tasks: Sequence[str]) -> list[Path]:
    """The kept data of the sections a combined section reads: <section>-<env> for each task."""
    return [RESULTS_DATA / f"{section}-{task.partition('-')[0]}" for task in tasks]


def combine(study: Study, run: Command, write: WriteSection | None = None) -> str:
    """The quality's section (or study.section) from the runs its tasks' sections made apart keep
    (results-data/<section>-<env>, one per task), reported together: what they say over the tasks
    (the paired differences over tasks, at the final evaluation and over the last quarter, and
    the aggregates), which no one task's section can say. Trains nothing: a study made a task at
    a time, as the 2 cores allow, is read whole without training it again, and a clone makes the
    section again from its data alone."""
    section = study.section or SECTIONS[study.quality]
    parts = combined_parts(section, study.tasks)
    missing = [str(part) for part in parts if not part.is_dir()]
    if missing:
        raise SystemExit(
            f"results.py --combine: no kept runs in {', '.join(missing)}; make each task's "
            f"first: python scripts/results.py --tasks TASK --section {section}-ENV --write-docs "
            f"(with the same dataset flag), which keeps its runs there"
        )
    reported = study.out / f"{section}-report"
    run("report", *map(str, parts), "--out", str(reported), env=study.env)
    data = read_report_data(reported / "report.json")
    text = over_tasks_text(data, _linker(reported, section, study.write_docs))
    text = f"{_combined_line(study, section, data)}\n\n{text}"
    if write is not None:
        write(section, text)
        if section == "results":  # the matched medium study, made a task at a time
            write("results-first", first_paragraph(data, corl_scores()))
        write_page_wide(write)
    return text


def _combined_line(study: Study, section: str, data: ReportData) -> str:
    assert data.study is not None, "a report of runs knows what they were"
    facts, tasks = data.study, study.tasks
    names = ", ".join(part.name for part in combined_parts(section, tasks))
    named = "" if section == SECTIONS[study.quality] else f" --section {section}"
    return (
        f"Made by `{COMMAND}{QUALITY_FLAG.get(study.quality, '')} --combine{named}` ({section}) on "
        f"{date.today()}, from the runs of the sections made apart below ({names}), read together; "
        f"on {machines(facts)}, trained in {precisions(facts)}: {plural(len(tasks), 'task')} "
        f"({', '.join(tasks)}) x {', '.join(facts.configs)} x {len(facts.seeds)} seeds. Here, "
        f"what they say over the tasks; each task's scores, comparisons, curves and spectra are "
        f"in its own section."
    )


def kept_sections() -> list[Path]:
    """The sections whose runs the clone keeps (results-data/<section>/), in name order."""
    return sorted(p for p in RESULTS_DATA.iterdir() if p.is_dir()) if RESULTS_DATA.is_dir() else []


def _section_names(sections: Sequence[str]) -> set[str]:
    """sections' names, whole or a task made apart (<that>-<env>)."""
    return {*sections} | {f"{s}-{env}" for s in sections for env in RECORDED}


def _kept_as(sections: Sequence[str]) -> list[Path]:
    """The kept sections named one of sections, whole or a task made apart (<that>-<env>)."""
    return [p for p in kept_sections() if p.name in _section_names(sections)]


def matched_sections() -> list[Path]:
    """The kept sections of the matched comparison (section a quality's or <that>-<env>)."""
    return _kept_as(list(SECTIONS.values()))


def budget_sections() -> list[Path]:
    """The kept sections of the matched study at the papers' budget (results-budget-<env>)."""
    return _kept_as([BUDGET_SECTION])


def first_screens(cpu: Glance | None, budget: Glance | None) -> tuple[str, str]:
    """The page's first screen and the README's summary: the matched sections' table and figure
    at the CPU budget, led by those at the papers' budget where a study has been made there
    (results_table.first_screen, readme_summary)."""
    cpu_figure, budget_figure = GLANCE_FIGURE, BUDGET_GLANCE_FIGURE
    page = first_screen(cpu, budget, (figure_link(cpu_figure), figure_link(budget_figure)))
    in_clone = (str(cpu_figure.relative_to(REPOSITORY)), str(budget_figure.relative_to(REPOSITORY)))
    return page, readme_summary(cpu, budget, in_clone)


def write_page_wide(write: WriteSection) -> None:
    """What every study refreshes: the page's first screen and the README's summary
    (first_screens), and the paper's table, once on the page."""
    cpu, budget = glance(matched_sections()), glance(budget_sections())
    for seen, figure in ((cpu, GLANCE_FIGURE), (budget, BUDGET_GLANCE_FIGURE)):
        if seen is not None and seen.pairs:
            glance_figure(seen, figure)
    page, readme = first_screens(cpu, budget)
    write("results-table", page)
    write("results-summary", readme)
    write("paper-table", paper_section())
