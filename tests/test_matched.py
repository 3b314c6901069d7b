"""The studies of the results page (scripts/results.py, primal_dt/tools/study*.py): the matched
comparison changes the attention and nothing else (its configs, read back as training reads them,
differ from DT's only in the last block's kind), the datasets are recorded from the kept
policies, and the page's text comes from report.json."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from primal_dt.cli import build_parser
from primal_dt.common.loading import load_config, named_config_path
from primal_dt.data.references import reference_for
from primal_dt.method.attention import PRIMAL_INITS
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.results import EvalResult
from primal_dt.store.runconfig import RunConfig, write_run_config
from primal_dt.store.rundir import RunDir
from primal_dt.store.training_log import (
    LogPoint,
    current,
    curve,
    training_sessions,
    union_minutes,
)
from primal_dt.tools import study as study_module
from primal_dt.tools.corl import corl_scores
from primal_dt.tools.flatness import FLAT, NOT_KNOWN
from primal_dt.tools.report_data import (
    CorlResult,
    FlatnessResult,
    OverTasks,
    PairedResult,
    ReportData,
    ReportSection,
    StudyFacts,
    TaskScores,
    study_facts,
    write_report_data,
)
from primal_dt.tools.results_page import (
    first_paragraph,
    machines,
    paper_section,
    precisions,
    section_text,
)
from primal_dt.tools.results_table import NONE_KEPT, glance
from primal_dt.tools.runs import read_run
from primal_dt.tools.study import Study, combine, comparison, record, run_study
from primal_dt.tools.study_configs import bc_config, init_config, matched_config
from primal_dt.tools.study_datasets import (
    RECORDED,
    make_arguments,
    recorded_tasks,
    recording_stages,
)

POLICIES = ROOT / "tests" / "policies"


def test_matched_configs_differ_only_in_the_last_blocks_attention(tmp_path: Path) -> None:
    configs = {kind: load_config(matched_config(tmp_path, kind)) for kind in ATTENTIONS}
    dt = dataclasses.asdict(configs["softmax"])
    assert configs["softmax"].model.block_kinds() == ["softmax"] * 3
    for kind, config in configs.items():
        assert config.model.block_kinds() == ["softmax", "softmax", kind]
        other = dataclasses.asdict(config)
        other["model"]["attention"] = dt["model"]["attention"]
        # Each kind keeps the settings matched.toml gives it (only Primal's: rank 16, public
        # init), none of another kind's.
        own = {"primal": {"rank": 16, "init": "public"}}.get(kind, {})
        assert other["model"].pop("attention_settings") == ({kind: own} if own else {}), kind
        assert other == {
            **dt,
            "model": {k: v for k, v in dt["model"].items() if k != "attention_settings"},
        }, kind
    # The parameter counts differ by the last block's own weights only (Primal's We, Wr, Λ and
    # its concat layer; none for the kinds that reuse softmax's projections' shapes).
    sizes = {
        kind: sum(p.numel() for p in DecisionTransformer(c.model, 11, 3, 1000).parameters())
        for kind, c in configs.items()
    }
    assert sizes["linear"] == sizes["softmax"] and sizes["primal"] != sizes["softmax"]


def test_matched_bc_is_matched_softmax_without_return_conditioning(tmp_path: Path) -> None:
    softmax = dataclasses.asdict(load_config(matched_config(tmp_path, "softmax")))
    bc = load_config(bc_config(tmp_path))
    assert bc.model.return_conditioning is False and softmax["model"]["return_conditioning"]
    other = dataclasses.asdict(bc)
    other["model"]["return_conditioning"] = True
    assert other == softmax


def test_the_papers_budget_changes_the_width_and_steps_alone(tmp_path: Path) -> None:
    """scripts/gpu_study.sh's configs: each matched config with papers_budget.toml's settings over
    it, in a folder of its own (the CPU study's configs of the same name stay as they are)."""
    budget = {"embed_dim": 128, "steps": 100_000, "eval_every": 10_000, "ckpt_every": 10_000}
    made = [
        (matched_config(tmp_path, "softmax"), matched_config(tmp_path, "softmax", budget=True)),
        (matched_config(tmp_path, "primal"), matched_config(tmp_path, "primal", budget=True)),
        (bc_config(tmp_path), bc_config(tmp_path, budget=True)),
    ]
    for cpu, gpu in made:
        assert cpu.name == gpu.name and cpu.parent != gpu.parent
        at_cpu, at_budget = (dataclasses.asdict(load_config(path)) for path in (cpu, gpu))
        changed = {
            key: value
            for section in ("model", "train", "eval")
            for key, value in at_budget[section].items()
            if at_cpu[section][key] != value
        }
        assert changed == budget, cpu.name


def test_init_configs_differ_from_matched_primal_only_in_the_initialisation(tmp_path: Path) -> None:
    primal = dataclasses.asdict(load_config(matched_config(tmp_path, "primal")))
    for init in PRIMAL_INITS:
        config = load_config(init_config(tmp_path, init))
        assert config.model.attention_settings["primal"]["init"] == init
        other = dataclasses.asdict(config)
        other["model"]["attention_settings"] = primal["model"]["attention_settings"]
        assert other == primal, init


def test_the_recorded_datasets_are_made_from_the_kept_policies_and_their_sac_runs(
    tmp_path: Path,
) -> None:
    """medium: the policy in tests/policies/medium; medium-replay: the SAC run that made it, with
    the seed tests/policies/README.md records for it; both parse as `datasets make` options."""
    readme = (ROOT / "tests" / "policies" / "README.md").read_text()
    seeds = dict(re.findall(r"^\| medium/(\w+-v5)\.zip \| \S+ \| (\d+) \|", readme, re.M))
    assert len(seeds) == 3
    for quality in ("medium", "medium-replay"):
        for task in recorded_tasks(quality):
            arguments = make_arguments(task, tmp_path / "minari", 1000)
            options = build_parser().parse_args(["datasets", "make", *arguments])
            assert Path(options.expert_policy).is_file()
            gym_id = Path(options.expert_policy).stem
            if quality == "medium":
                assert options.recipe == "policy" and options.name == "medium"
                assert Path(options.policy) == POLICIES / "medium" / f"{gym_id}.zip"
            else:
                assert options.recipe == "medium-replay" and options.seed == int(seeds[gym_id])
                assert options.max_steps == 120000
    assert make_arguments("hopper-simple", tmp_path, 1000) is None
    # One pair of reference scores per environment, of the expert each dataset names, with a
    # standard error under 0.5% of the expert's mean.
    for env, (gym_id, _) in RECORDED.items():
        arguments = make_arguments(f"{env}-medium", tmp_path, 1000)
        assert arguments is not None
        options = build_parser().parse_args(["datasets", "make", *arguments])
        found = reference_for(Path(options.reference), gym_id, options.expert_policy)
        assert max(found.random_se, found.expert_se) < 0.005 * found.expert, gym_id


def test_medium_expert_is_recorded_after_its_parts_from_the_medium_and_expert_policies(
    tmp_path: Path,
) -> None:
    """expert: episodes of the TQC expert, as many steps as the medium's; medium-expert: both in
    one, made offline from the two recorded here, which are recorded first."""
    tasks = recorded_tasks("medium-expert")
    stages = recording_stages([*tasks, "hopper-medium"])
    assert stages[1] == tasks
    assert sorted(stages[0]) == sorted(
        f"{env}-{part}" for env in RECORDED for part in ("medium", "expert")
    )
    for env, (gym_id, _) in RECORDED.items():
        parse = build_parser().parse_args
        medium, expert = (
            parse(["datasets", "make", *make_arguments(f"{env}-{q}", tmp_path, 1000)])
            for q in ("medium", "expert")
        )
        assert expert.recipe == "policy" and expert.name == "expert"
        assert Path(expert.policy) == POLICIES / "tqc" / f"{gym_id}.zip"
        assert expert.steps == medium.steps == 1000
        combined = parse(
            ["datasets", "make", *make_arguments(f"{env}-medium-expert", tmp_path, 1000)]
        )
        assert combined.recipe == "medium-expert" and combined.offline
        assert combined.expert_policy == expert.expert_policy == medium.expert_policy


def test_the_results_page_keeps_the_papers_table_apart_and_current() -> None:
    """The page holds the paper's table once, as the report renders it (so it cannot drift from
    paper_scores.toml), and the study's sections leave the report's copy of it out."""
    page = (ROOT / "docs" / "results.md").read_text()
    section = page.split("<!-- paper-table:start -->\n", 1)[1].split("\n<!-- paper-table:end -->")[
        0
    ]
    assert section == paper_section()
    data = ReportData(["runs"], 1, None, lead="1 runs, grouped ...")
    data.sections = [
        ReportSection("Scores", "ours"),
        ReportSection(
            "Aggregates over tasks", "table\n\n![aggregates](aggregates.png)", ["aggregates.png"]
        ),
        ReportSection("The paper's table", "theirs"),
        ReportSection("Figures", "![f](f.png)", ["f.png"]),
        ReportSection("Notes", "none"),
    ]
    assert section_text(data, lambda name: f"../scripts/figures/x_{name}") == (
        "1 runs, grouped ...\n\n### Scores\n\nours\n\n### Aggregates over tasks\n\ntable\n\n"
        "![aggregates](../scripts/figures/x_aggregates.png)\n\n### Notes\n\nnone\n\n"
        "![f](../scripts/figures/x_f.png)"
    )


def test_the_readme_and_the_pages_first_screen_show_the_kept_matched_runs() -> None:
    """The README's summary and the page's table are the tables and figures of the matched
    sections' kept runs as results-data/ holds them now (the papers' budget's first, where kept),
    and each figure is drawn where its table has a difference."""
    cpu = glance(study_module.matched_sections())
    budget = glance(study_module.budget_sections())
    readme, page = (ROOT / "README.md").read_text(), (ROOT / "docs" / "results.md").read_text()
    table, summary = study_module.first_screens(cpu, budget)
    assert f"<!-- results-summary:start -->\n{summary}\n<!-- results-summary:end -->" in readme
    assert f"<!-- results-table:start -->\n{table}\n<!-- results-table:end -->" in page
    for seen, figure in (
        (cpu, study_module.GLANCE_FIGURE),
        (budget, study_module.BUDGET_GLANCE_FIGURE),
    ):
        assert figure.is_file() == (seen is not None and bool(seen.pairs))


def test_the_table_reads_the_matched_sections_alone(tmp_path: Path, monkeypatch) -> None:
    """A quality's section and its tasks made apart are the matched comparison; the studies of
    their own (attentions, initialisations, replications with new seeds) are not counted."""
    monkeypatch.setattr(study_module, "RESULTS_DATA", tmp_path)
    names = ["results", "results-hopper", "results-expert-walker2d", "results-replay"]
    for name in [*names, "results-attentions", "results-init", "results-replication"]:
        (tmp_path / name).mkdir()
    (tmp_path / "README.md").write_text("not a section")
    assert [p.name for p in study_module.matched_sections()] == sorted(names)


def test_study_minutes_count_every_session_overlaps_once_and_no_idle_time() -> None:
    """Sessions from training.jsonl (each from its start to its last point, or to the last
    evaluation that finished before the next session began); runs side by side counted once,
    and the hours between a session and its --resume not at all."""
    t0 = 1_000_000_000.0

    def points(session: float, *times: float) -> list[LogPoint]:
        return [LogPoint(i, t0 + session, 0, t0 + time, {}) for i, time in enumerate(times)]

    def finished(at: float) -> EvalResult:
        return EvalResult(1, "ckpt.pt", finished_at=t0 + at)

    extended = training_sessions(
        [*points(1200, 1300, 1500), *points(9000, 9100, 9200)],
        [finished(1800), finished(9300), EvalResult(2, "ckpt.pt")],  # (an old record: no time)
    )
    assert extended == [(t0 + 1200, t0 + 1800), (t0 + 9000, t0 + 9300)]
    a = training_sessions(points(0, 100, 500), [finished(600)])
    b = training_sessions(points(300, 900), [])  # killed before any evaluation
    assert union_minutes([*a, *b, *extended]) == (900 + 600 + 300) / 60
    assert training_sessions([], [finished(5)]) == []


def test_a_later_session_supersedes_the_points_after_the_step_it_began_at() -> None:
    """A resume (or a roll-back to a kept checkpoint) trains its steps again: the curve is the run
    as it now stands, whatever earlier sessions logged beyond the step a later one began at."""

    def session(start: float, first: int, *steps: int) -> list[LogPoint]:
        return [LogPoint(s, start, first, start + s, {"ksvd_loss": start + s}) for s in steps]

    a, b, c = session(100, 0, 5, 10, 15, 20), session(200, 10, 15, 20), session(300, 5, 10)
    assert current([*a, *b, *c]) == [a[0], c[0]]
    assert curve([*a, *b], "ksvd_loss") == [(5, 105), (10, 110), (15, 215), (20, 220)]
    assert curve([*a, *b], "action_loss") == []


def test_each_quality_has_its_own_section_of_the_results_page(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "results.md").read_text()
    for quality, section in study_module.SECTIONS.items():
        study = Study(tmp_path, recorded_tasks(quality), quality)
        configs, found, _ = comparison(study)
        assert found == section and configs.endswith("matched-bc.toml")
        assert f"<!-- {section}:start -->" in page
    study = Study(tmp_path, ["halfcheetah-medium"], attentions="all")
    assert comparison(study)[1] == "results-attentions"


def write_record(folder: Path, precision: str, machines: list[str]) -> None:
    """A whole config.json, as a run of dt on halfcheetah-medium would record it."""
    config = load_config(
        named_config_path("dt"), [f'train.precision="{precision}"'], task="halfcheetah-medium"
    )
    write_run_config(RunDir(folder), RunConfig("halfcheetah-medium", "dt", config, machines))


def test_the_studys_precision_and_machines_are_read_from_what_its_runs_recorded(
    tmp_path: Path,
) -> None:
    summaries = []
    for name, precision, where in [
        ("a", "fp32", ["X"]),
        ("b", "fp32", ["X", "Y"]),
        ("c", "bf16", []),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        write_record(folder, precision, where)
        summaries.append(read_run(folder, spectra=False))
    assert (summaries[0].precision, summaries[0].machines) == ("fp32", ["X"])
    assert summaries[0].batch_size == load_config(named_config_path("dt")).train.batch_size
    assert (
        precisions(study_facts(summaries[:1])) == "fp32"
        and machines(study_facts(summaries[:1])) == "X"
    )
    facts = study_facts(summaries)
    assert precisions(facts) == "bf16 and fp32" and machines(facts) == "X and Y"
    assert facts.minutes is None  # none of them trained: no session to count
    nothing = study_facts([])
    assert precisions(nothing) == "no recorded precision"
    assert machines(nothing) == "an unrecorded machine"


def test_a_study_records_its_missing_datasets_parts_first_each_on_one_thread(
    tmp_path: Path,
) -> None:
    """medium-expert: its medium and expert parts first, then the combinations; a dataset already
    in the Minari root is not recorded again."""
    made: list[tuple[str, ...]] = []
    threads: set[str] = set()

    def command(*args: str, env: dict[str, str]) -> str:
        made.append(args)
        threads.add(env["OMP_NUM_THREADS"])
        assert env["MINARI_DATASETS_PATH"] == str(tmp_path / "minari")
        return ""

    (tmp_path / "minari" / "primal-dt" / "hopper" / "expert-v0").mkdir(parents=True)
    record(Study(tmp_path, recorded_tasks("medium-expert"), "medium-expert", parallel=1), command)
    recorded = [(a[a.index("--env") + 1], a[a.index("--recipe") + 1]) for a in made]
    singles = [(env, recipe) for env, recipe in recorded if recipe == "policy"]
    assert len(singles) == 5 and recorded[5:] == [(env, "medium-expert") for env in RECORDED]
    assert threads == {"1"} and all(a[:2] == ("datasets", "make") for a in made)


def report_json(folder: Path, data: ReportData) -> None:
    """What `primal-dt report --out folder` leaves that a study reads: report.json, a figure."""
    folder.mkdir(parents=True)
    write_report_data(data, folder / "report.json")
    for section in data.sections:
        for name in section.figures:
            (folder / name).write_bytes(b"png")


FACTS = StudyFacts(
    ["halfcheetah-medium"], ["dt"], [0], ["a CPU"], ["fp32"], [64], steps=600, minutes=1.0
)


def test_a_study_without_write_docs_writes_nothing_outside_its_out_folder(tmp_path: Path) -> None:
    """run_study with its primal-dt commands stood in for by what they leave (runs, a report
    with a figure): the clone is as it was, and the section links the report's own figure."""
    out = tmp_path / "out"
    commands: list[str] = []

    def command(*args: str, env: dict[str, str]) -> str:
        commands.append(args[0])
        if args[0] == "report":
            data = ReportData(["runs"], 1, "dt", FACTS, lead="1 runs")
            data.sections = [ReportSection("Figures", "![c](c.png)", ["c.png"])]
            report_json(Path(args[args.index("--out") + 1]), data)
        return ""

    def clone() -> list[tuple[Path, float]]:  # what a study could write: figures, pages
        places = [ROOT / "scripts", ROOT / "docs", ROOT / "README.md"]
        files = [f for place in places for f in ([place] if place.is_file() else place.rglob("*"))]
        return sorted(
            (f, f.stat().st_mtime)
            for f in files
            if "_build" not in f.parts and "__pycache__" not in f.parts
        )

    before = clone()
    text = run_study(Study(out, ["halfcheetah-medium"], seeds="0"), command)
    assert clone() == before and commands == ["sweep", "report"]
    assert text.startswith("Made by `python scripts/results.py` (results) on ")
    assert (
        "on a CPU, trained in fp32, 1 minute of training (each session of each run from its "
        "start to its final evaluation, overlaps counted once; 36,000 training steps an hour"
    ) in text
    assert (
        ": 1 task (halfcheetah-medium) x the matched config with softmax, primal in its last "
        in text
    )
    assert text.endswith(f"1 runs\n\n![c]({out / 'results-report' / 'c.png'})")


def test_a_part_adds_its_seeds_to_the_sections_kept_runs_and_refuses_other_configs(
    tmp_path: Path, monkeypatch
) -> None:
    """--part: a study made a few seeds at a time. Each part's runs join the runs the section
    keeps (a run made again replaces its earlier copy whole), the section is written from them all,
    and a part of other configs is refused before it trains, the kept runs left as they were."""
    monkeypatch.setattr(study_module, "RESULTS_DATA", tmp_path / "results-data")
    monkeypatch.setattr(study_module, "write_page_wide", lambda write: None)
    out, commands = tmp_path / "out", []

    def command(*args: str, env: dict[str, str]) -> str:
        commands.append(args)
        if args[0] == "sweep":  # each run of the grid, as a file that names its part
            configs = [Path(c).stem for c in args[args.index("--configs") + 1].split(",")]
            for seed in args[args.index("--seeds") + 1].split(","):
                for config in configs:
                    made = Path(args[args.index("--runs-dir") + 1]) / "t" / f"{config}-s{seed}"
                    made.mkdir(parents=True)
                    (made / f"part{len(commands)}").write_text("")
        if args[0] == "report":  # its copy of the runs, and what they were
            runs = sorted(Path(args[1]).glob("*/*"))
            for run in runs:
                shutil.copytree(run, Path(args[args.index("--out") + 1]) / "runs" / "t" / run.name)
            seeds = sorted({int(run.name.rpartition("-s")[2]) for run in runs})
            data = ReportData([args[1]], len(runs), None, dataclasses.replace(FACTS, seeds=seeds))
            write_report_data(data, Path(args[args.index("--out") + 1]) / "report.json")
        return ""

    written: dict[str, str] = {}

    def part(seeds: str, attentions: str = "softmax,primal") -> str:
        study = Study(out, ["t"], seeds=seeds, attentions=attentions, section="s", part=True)
        shutil.rmtree(out, ignore_errors=True)
        return run_study(study, command, written.__setitem__)

    part("0,1")
    assert "x 2 seeds." in written["s"]
    reports = [c for c in commands if c[0] == "report"]  # the part's data alone, then all reported
    assert ["--data-only" in c for c in reports] == [True, False]
    part("1,2")
    kept = study_module.RESULTS_DATA / "s" / "t"
    names = sorted(p.name for p in kept.iterdir())
    assert names == [
        f"{c}-s{s}" for c in ("matched-bc", "matched-primal", "matched-softmax") for s in (0, 1, 2)
    ]
    assert [f.name for f in (kept / "matched-primal-s1").iterdir()] == ["part4"]  # the second's
    assert [f.name for f in (kept / "matched-primal-s0").iterdir()] == ["part1"]
    assert "x 3 seeds." in written["s"] and commands[-1][1].endswith("s-joined")
    commands.clear()
    with pytest.raises(SystemExit, match="keeps runs of matched-bc on t, .* and this part would"):
        part("3", attentions="softmax,linear")
    assert commands == [] and sorted(p.name for p in kept.iterdir()) == names


def test_combine_reports_the_tasks_sections_runs_together_and_keeps_what_is_over_tasks(
    tmp_path: Path, monkeypatch
) -> None:
    """combine trains and records nothing: it reports the runs that each task's section made
    apart keeps (results-data/<section>-<env>) together, and keeps the report's sections over
    tasks (the final scores', the last quarter's, the aggregates with their figure), not what each
    task's section already says. A task whose section keeps no runs yet is one clear error."""
    monkeypatch.setattr(study_module, "RESULTS_DATA", tmp_path / "results-data")
    out, commands = tmp_path / "out", []
    sections = [
        ReportSection("Comparisons per task", "- a − b on t1: once"),
        ReportSection("Paired differences over tasks", "- a − b over 3 tasks: final"),
        ReportSection("Paired differences over the last quarter", "- a − b on t1: late, once"),
        ReportSection("Paired differences over tasks, over the last quarter", "- late"),
        ReportSection("Aggregates over tasks", "| t |\n\n![g](g.png)", ["g.png"]),
        ReportSection("Attention spectrum", "- spectra"),
    ]

    def command(*args: str, env: dict[str, str]) -> str:
        commands.append(args)
        facts = dataclasses.replace(FACTS, configs=["a", "b"], seeds=[0, 1])
        report_json(
            Path(args[args.index("--out") + 1]),
            ReportData([], 2, "b", facts, "", sections=sections),
        )
        return ""

    study = Study(out, recorded_tasks("medium-replay"), "medium-replay")
    parts = [tmp_path / "results-data" / f"results-replay-{name}" for name in RECORDED]
    with pytest.raises(SystemExit, match=re.escape(f"no kept runs in {parts[0]}, {parts[1]}")):
        combine(study, command)
    for part in parts:
        part.mkdir(parents=True)
    text = combine(study, command)
    assert commands == [("report", *map(str, parts), "--out", str(out / "results-replay-report"))]
    assert "`python scripts/results.py --replay --combine` (results-replay)" in text
    assert (
        "3 tasks (halfcheetah-medium-replay, hopper-medium-replay, walker2d-medium-replay) x a, b "
        "x 2 seeds." in text
    )
    kept = text.split(" own section.\n\n", 1)[1]
    assert kept.startswith("### Paired differences over tasks\n\n- a − b over 3 tasks: final")
    assert "### Paired differences over tasks, over the last quarter\n\n- late" in kept
    assert f"![g]({out / 'results-replay-report' / 'g.png'})" in kept
    assert "once" not in kept and "spectra" not in kept
    for name in RECORDED:  # a study of its own made a task at a time names its section
        (tmp_path / "results-data" / f"results-init-{name}").mkdir(parents=True)
    text = combine(Study(out, recorded_tasks("medium"), section="results-init"), command)
    assert "`python scripts/results.py --combine --section results-init` (results-init)" in text


def test_from_data_refuses_runs_stopped_before_their_final_evaluation(tmp_path: Path) -> None:
    """A device call whose time ran out leaves runs with no final evaluation: --from-data names
    each such run and writes no section, since a section scores final evaluations."""
    kept = tmp_path / "results-s"
    written: dict[str, str] = {}

    def command(*args: str, env: dict[str, str]) -> str:
        scores = [TaskScores("t", "a", [0, 1], [50.0, None], True)]
        data = ReportData([args[1]], 2, None, FACTS, scores=scores)
        report_json(Path(args[args.index("--out") + 1]), data)
        return ""

    study = Study(tmp_path / "out", ["t"])
    with pytest.raises(
        SystemExit, match=f"1 runs in {re.escape(str(kept))} have no final .*: a-s1 on t;"
    ):
        study_module.from_data(study, kept, command, written.__setitem__)
    assert written == {}


def test_combining_the_medium_tasks_writes_the_pages_first_paragraph(
    tmp_path: Path, monkeypatch
) -> None:
    """The matched medium study made a task at a time: --combine --write-docs writes its
    section, the page's first paragraph from the combined report, and the page-wide parts."""
    monkeypatch.setattr(study_module, "RESULTS_DATA", tmp_path / "results-data")
    monkeypatch.setattr(study_module, "matched_sections", list)  # their runs are not read here
    out, written = tmp_path / "out", {}

    def command(*args: str, env: dict[str, str]) -> str:
        report_json(Path(args[args.index("--out") + 1]), ReportData([], 2, "b", FACTS, ""))
        return ""

    for name in RECORDED:
        (tmp_path / "results-data" / f"results-{name}").mkdir(parents=True)
    study = Study(out, recorded_tasks("medium"), "medium")
    combine(study, command, lambda name, text: written.setdefault(name, text))
    assert list(written) == [
        "results",
        "results-first",
        "results-table",
        "results-summary",
        "paper-table",
    ]
    assert written["results-first"] == first_paragraph(ReportData([], 2, "b", FACTS), corl_scores())
    assert written["results-table"] == written["results-summary"] == NONE_KEPT


def test_the_pages_first_paragraph_says_budget_power_and_corls_fraction() -> None:
    corl = corl_scores()

    def side(task: str, mean: float) -> CorlResult:
        last, best = corl.last[task], corl.best[task]
        return CorlResult(task, [6000], [215000], mean, None, last, best, None, mean / last[0])

    def paired(config: str, task: str, detectable: float) -> PairedResult:
        differences = [1.0, 1.0]
        return PairedResult(
            task,
            config,
            "matched-softmax",
            [0, 1],
            differences,
            1.0,
            None,
            0.5,
            0.5,
            detectable,
            9.0,
            3,
        )

    def curve(config: str, low: float, high: float) -> FlatnessResult:
        flat = low > -2 and high < 2
        verdict = FLAT if flat else "still rising" if low > 0 else NOT_KNOWN
        return FlatnessResult("t", config, [], 0.0, (low, high), (low, high), flat, verdict)

    over = OverTasks(
        "matched-primal",
        "matched-softmax",
        ["a", "b", "c"],
        5,
        0.4,
        (-1.0, 1.8),
        0.4,
        4.1,
        11.8,
        19,
        3.0,
    )
    data = ReportData(["runs"], 30, "matched-softmax", dataclasses.replace(FACTS, batch_sizes=[64]))
    data.corl = [side("halfcheetah-medium", 37.98), side("hopper-medium", 50.1)]
    data.paired = [
        paired("matched-primal", "a", 2.5),
        paired("matched-bc", "a", 99.0),
        paired("matched-primal", "b", 17.0),
    ]
    data.over_tasks = [over]
    data.flatness = [curve("a", -1.3, 1.7), curve("c", -12.1, 20.7), curve("b", 3.6, 21.0)]
    text = first_paragraph(data, corl)
    assert "Each run trains 6,000 steps of a model of 215,000 parameters" in text
    assert (
        "6% of the 100,000 steps at which CORL trains DT, and, at batch 64, 0.09% of the " in text
    )
    assert (
        "windows it sees (384,000 against 409,600,000); CORL's DT is a model of embed 128" in text
    )
    assert "halfcheetah-medium 0.90, hopper-medium 0.77." in text  # 37.98 / 42.2, 50.1 / 65.1
    assert (
        "Over the tasks, matched-primal − matched-softmax over 3 tasks (5 paired seeds each): "
        "+0.4 [-1.0, +1.8] (Student's t on each seed's mean over the tasks, p = 0.400): no "
        "difference detected; the study could detect 4.1 points over the tasks at 80% power (up "
        "to 11.8 were the spread at the top of its 95% interval); 5 points would need 19 seeds "
        "per task." in text
    )
    assert "ranges from 2.5 to 17.0 points." in text  # matched-bc's is not Primal's question
    assert (
        "Over the end of training, 1 of the 3 curves (task and config) are flat within ±2 points "
        "per 1,000 steps (90% interval of the slope); the others: c on t (not known to be flat); "
        "b on t (still rising)." in text
    )
    assert "nothing to say" in first_paragraph(ReportData([], 0, None), corl)


def test_a_sections_data_is_the_reports_copy_of_its_runs(tmp_path: Path, monkeypatch) -> None:
    """--write-docs keeps the report's runs/ (small text) as results-data/<section>, replacing
    an earlier study's."""
    monkeypatch.setattr(study_module, "RESULTS_DATA", tmp_path / "results-data")
    reported = tmp_path / "report"
    (reported / "runs" / "task" / "run").mkdir(parents=True)
    (reported / "runs" / "task" / "run" / "eval.jsonl").write_text("{}\n")
    stale = tmp_path / "results-data" / "results" / "old"
    stale.mkdir(parents=True)
    kept = study_module.keep_data(reported, "results")
    assert kept == tmp_path / "results-data" / "results" and not stale.exists()
    assert (kept / "task" / "run" / "eval.jsonl").read_text() == "{}\n"
