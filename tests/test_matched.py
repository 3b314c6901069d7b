"""The matched comparison changes the attention and nothing else: scripts/results.py's configs,
read back as training reads them, differ from DT's only in the last block's kind."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS, results_script

from primal_dt.cli import build_parser
from primal_dt.common.loading import load_config, named_config_path
from primal_dt.method.attention import PRIMAL_INITS
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.runconfig import RunConfig, write_run_config
from primal_dt.store.rundir import RunDir
from primal_dt.tools.corl import corl_scores, corl_table
from primal_dt.tools.runs import Row

POLICIES = SCRIPTS.parent / "tests" / "policies"


def test_matched_configs_differ_only_in_the_last_blocks_attention(tmp_path: Path) -> None:
    script = results_script()
    configs = {kind: load_config(script.matched_config(tmp_path, kind)) for kind in ATTENTIONS}
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
    script = results_script()
    softmax = dataclasses.asdict(load_config(script.matched_config(tmp_path, "softmax")))
    bc = load_config(script.bc_config(tmp_path))
    assert bc.model.return_conditioning is False and softmax["model"]["return_conditioning"]
    other = dataclasses.asdict(bc)
    other["model"]["return_conditioning"] = True
    assert other == softmax


def test_init_configs_differ_from_matched_primal_only_in_the_initialisation(tmp_path: Path) -> None:
    script = results_script()
    primal = dataclasses.asdict(load_config(script.matched_config(tmp_path, "primal")))
    for init in PRIMAL_INITS:
        config = load_config(script.init_config(tmp_path, init))
        assert config.model.attention_settings["primal"]["init"] == init
        other = dataclasses.asdict(config)
        other["model"]["attention_settings"] = primal["model"]["attention_settings"]
        assert other == primal, init


def test_the_recorded_datasets_are_made_from_the_kept_policies_and_their_sac_runs(
    tmp_path: Path,
) -> None:
    """medium: the policy in tests/policies/medium; medium-replay: the SAC run that made it, with
    the seed tests/policies/README.md records for it; both parse as `datasets make` options."""
    script = results_script()
    readme = (SCRIPTS.parent / "tests" / "policies" / "README.md").read_text()
    seeds = dict(re.findall(r"^\| medium/(\w+-v5)\.zip \| \S+ \| (\d+) \|", readme, re.M))
    assert len(seeds) == 3
    for quality in ("medium", "medium-replay"):
        for task in script.recorded_tasks(quality):
            arguments = script.make_arguments(task, tmp_path / "minari", 1000)
            options = build_parser().parse_args(["datasets", "make", *arguments])
            assert Path(options.expert_policy).is_file()
            gym_id = Path(options.expert_policy).stem
            if quality == "medium":
                assert options.recipe == "policy" and options.name == "medium"
                assert Path(options.policy) == POLICIES / "medium" / f"{gym_id}.zip"
            else:
                assert options.recipe == "medium-replay" and options.seed == int(seeds[gym_id])
                assert options.max_steps == 120000
    assert script.make_arguments("hopper-simple", tmp_path, 1000) is None


def test_medium_expert_is_recorded_after_its_parts_from_the_medium_and_expert_policies(
    tmp_path: Path,
) -> None:
    """expert: episodes of the TQC expert, as many steps as the medium's; medium-expert: both in
    one, made offline from the two recorded here, which are recorded first."""
    script = results_script()
    tasks = script.recorded_tasks("medium-expert")
    stages = script.recording_stages([*tasks, "hopper-medium"])
    assert stages[1] == tasks
    assert sorted(stages[0]) == sorted(
        f"{env}-{part}" for env in script.RECORDED for part in ("medium", "expert")
    )
    for env, (gym_id, _) in script.RECORDED.items():
        parse = build_parser().parse_args
        medium, expert = (
            parse(["datasets", "make", *script.make_arguments(f"{env}-{q}", tmp_path, 1000)])
            for q in ("medium", "expert")
        )
        assert expert.recipe == "policy" and expert.name == "expert"
        assert Path(expert.policy) == POLICIES / "tqc" / f"{gym_id}.zip"
        assert expert.steps == medium.steps == 1000
        combined = parse(
            ["datasets", "make", *script.make_arguments(f"{env}-medium-expert", tmp_path, 1000)]
        )
        assert combined.recipe == "medium-expert" and combined.offline
        assert combined.expert_policy == expert.expert_policy == medium.expert_policy


def test_the_results_page_keeps_the_papers_table_apart_and_current() -> None:
    """The page holds the paper's table once, as the report renders it (so it cannot drift from
    paper_scores.toml), and the study's sections leave the report's copy of it out."""
    script = results_script()
    page = (SCRIPTS.parent / "docs" / "results.md").read_text()
    section = page.split("<!-- paper-table:start -->\n", 1)[1].split("\n<!-- paper-table:end -->")[
        0
    ]
    assert section == script.paper_section()
    report = "# title\n\n## Scores\n\nours\n\n## The paper's table\n\ntheirs\n\n## Figures\n\n![f](f.png)\n\n## Notes\n\nnone"
    assert script.section_of(report) == "### Scores\n\nours\n\n### Notes\n\nnone"


def test_the_readme_summary_says_what_the_pages_matched_sections_say() -> None:
    """It counts every matched DT-against-Primal-DT section (one per quality, and the tasks of a
    quality made apart), and says the seven attentions and the initialisations apart."""
    script = results_script()

    def section(name: str, seeds: int, comparisons: list[str], spectra: list[str]) -> str:
        return "\n".join(
            [
                f"<!-- {name}:start -->",
                f"Made by ... x the matched config ... x {seeds} seeds.",
                "",
                "### Comparisons per task",
                "",
                *comparisons,
                "",
                "### Aggregates over tasks",
                "",
                "- not a comparison",
                "",
                "### Attention spectrum",
                "",
                *spectra,
                "",
                "### Notes",
                "",
                f"<!-- {name}:end -->",
            ]
        )

    page = "\n\n".join(
        [
            section(
                "results",
                5,
                ["- No difference between a and b was detected on t1 at this budget (overlap)."],
                [
                    "- t1, block 2: a (Primal) has a lower rank_90 than b (softmax) (3 ± 1, 9 ± 1).",
                    "- t1, block 2: a (Primal) has a lower rank_90 than matched-bc (softmax) (...).",
                    "- t1 (a): Primal block 2 has a lower rank_90 than softmax block 0 (...).",
                ],
            ),
            section(
                "results-replay-hopper",
                5,
                ["- a scores above b on t2 at this budget (intervals [5, 6] and [1, 2])."],
                ["- t2, block 2: no difference detected (a (Primal) 4 ± 2, b (softmax) 5 ± 2)."],
            ),
            section(
                "results-attentions",
                3,
                [
                    "- c − b on t1: -2.0 [-3.0, -1.0] over 3 paired seeds: c scores below b; the "
                    "study could detect 1.5 points.",
                    "- f − b on t1: +0.1 [-1.0, +1.2] over 3 paired seeds: no difference detected; "
                    "the study could detect 2.5 points.",
                ],
                [],
            ),
            section(
                "results-init",
                5,
                [
                    "- d − e on t1: +0.2 [-1, +1] over 5 paired seeds: no "
                    "difference detected; the study could detect 2.0 points."
                ],
                [],
            ),
        ]
    )
    text = script.summary(page)
    assert "on 2 of the datasets recorded here, 5 seeds each" in text
    # The studies of their own, apart: not counted, each against its baseline, with their power.
    assert (
        "The seven attentions of the paper's table, in the matched config's last block, on tasks, "
        "3 seeds, each against b: a difference on 1 of 2 (with no true difference on any, at least "
        "one of 2 intervals at 95% would exclude 0 in 10% of studies): c − b on t1: -2.0 [-3.0, "
        "-1.0] over 3 paired seeds: c scores below b; the study could detect 1.5 points; the "
        "comparisons could detect 1.5 to 2.5 points at 80% power."
    ) in text
    assert (
        "Primal's two initialisations of We and Wr, on tasks, 5 seeds, each against e: no "
        "difference in score detected on any of the 1 (each paired difference's 95% interval "
        "holds 0); the comparisons could detect 2.0 points at 80% power."
    ) in text
    # Until a study is made, its section holds a placeholder, and the summary says nothing of it.
    assert "Primal's two" not in script.summary(
        re.sub(r"(?s)(results-init:start -->\n).*?(<!-- results-init:end)", r"\1Not yet.\n\2", page)
    )
    assert (
        "a difference on 1 of 2 (with no true difference on any, at least one of 2 intervals at "
        "95% would exclude 0 in 10% of studies): a scores above b on t2" in text
    )
    assert ".." not in text  # a claimed difference's sentence ends once
    assert "lower rank_90 than the same block's with softmax on 1 of the 2" in text
    none = script.summary(page.replace("- a scores above", "- No difference: a"))
    assert "no difference in score detected on any of the 2 (95% intervals overlap)" in none
    paired = page.replace("- a scores above", "- No difference: a").replace(
        " at this budget (", ": +0.1 [-0.5, +0.7] over 5 paired seeds ("
    )
    assert "(each paired difference's 95% interval holds 0)" in script.summary(paired)
    # The power over tasks, where a section has it, beside the verdict.
    over = "a − b over 3 tasks (5 paired seeds each): +0.4 [...]: the study could detect 4.1 points"
    with_power = page.replace(
        "### Aggregates over tasks",
        f"### Paired differences over tasks\n\n- {over}\n\n### Aggregates over tasks",
        1,
    )
    assert f"Over tasks: {over}" in script.summary(with_power)
    named = with_power.replace("Made by ...", "Made by ...: 3 tasks (t1, t3, t4) x ...", 1)
    assert f"Over t1, t3, t4: {over}" in script.summary(named)
    # A replication with new seeds is said apart and not counted as a dataset of its own.
    again = "a − b on t2: -3.0 [-4.0, -2.0] over 5 paired seeds: a scores below b"
    replicated = script.summary(
        page + "\n\n" + section("results-replication", 5, [f"- {again}."], [])
    )
    assert f"Again with new seeds: {again}." in replicated
    assert "on 2 of the datasets recorded here" in replicated
    # A claimed difference with the same pair's over the last quarter's evaluations beside it.
    claimed = "a − b on t2: -3.0 [-4.0, -2.0] over 5 paired seeds: a scores below b; the study"
    late = "-0.2 [-2.9, +2.4] over 5 paired seeds: no difference detected"
    with_late = page.replace(
        "- a scores above b on t2 at this budget (intervals [5, 6] and [1, 2]).",
        f"- {claimed} could detect 2.9 points.\n\n### Paired differences over the last "
        f"quarter\n\n- a − b on t1: +9.0 ...\n- a − b on t2: {late}; the study could ...",
    )
    assert (
        f"{claimed} could detect 2.9 points; over each run's last-quarter evaluations: {late}. "
        in script.summary(with_late)
    )
    # A medium-expert dataset holds its medium one: counted, and named as not independent.
    overlapping = page.replace(" on t1 at", " on h-medium at").replace(
        " on t2 at", " on h-medium-expert at"
    )
    assert (
        "on 2 of the datasets recorded here (1 of them medium-expert ones that hold a medium one "
        "of the count too: h-medium-expert; not independent of it), 5 seeds"
    ) in script.summary(overlapping)
    # A section of what a quality's tasks, made apart, say together (results.py --combine): its
    # over-tasks figures with the last quarter's beside them, and no dataset counted again.
    late = (
        "a − b over 3 tasks (5 paired seeds each): +0.1 [-1.0, +1.2] (...): no difference detected"
    )
    combined = "\n".join(
        [
            "<!-- results-expert:start -->",
            "Made by ...: 3 tasks (t5, t6, t7) x a, b x 5 seeds.",
            "",
            "### Paired differences over tasks",
            "",
            f"- {over}.",
            "",
            "### Paired differences over tasks, over the last quarter",
            "",
            f"- {late}; the study could detect 2.0 points.",
            "",
            "<!-- results-expert:end -->",
        ]
    )
    text = script.summary(page + "\n\n" + combined)
    assert "on 2 of the datasets recorded here, 5 seeds" in text
    assert (
        f"Over t5, t6, t7: {over}; over each run's last-quarter evaluations: +0.1 [-1.0, +1.2] "
        "(...): no difference detected." in text
    )
    # The README holds what the page says now.
    readme = (SCRIPTS.parent / "README.md").read_text()
    current = script.summary((SCRIPTS.parent / "docs" / "results.md").read_text())
    assert f"<!-- results-summary:start -->\n{current}\n<!-- results-summary:end -->" in readme


def event_file(folder: Path, opened: int, written: int, suffix: str = "") -> None:
    """A TensorBoard event file as torch names it, opened and last written at these seconds."""
    path = folder / f"events.out.tfevents.{opened}.host.name.4242.0{suffix}"
    path.write_text("")
    os.utime(path, (written, written))


def test_study_minutes_count_every_session_overlaps_once_and_no_idle_time(tmp_path: Path) -> None:
    """Sessions from the trainer's event files (opened: start; last written, or the evaluation
    file's last write after it: end): two runs overlapping (b killed before any evaluation), one
    extended hours later; each evaluation file opened in its trainer's second."""
    script, t0 = results_script(), 1_000_000_000
    runs = {
        "a": [(0, 500, ".eval", 600)],
        "b": [(300, 900, None, 0)],
        "extended": [(1200, 1500, ".eval", 1800), (9000, 9200, ".eval", 9300)],
    }
    for name, sessions in runs.items():
        folder = tmp_path / "task" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        for start, trained, evaluation, evaluated in sessions:
            event_file(folder, t0 + start, t0 + trained)
            if evaluation:  # the evaluation service's file
                event_file(folder, t0 + start, t0 + evaluated, evaluation)
        event_file(folder, t0 + 20000, t0 + 20000, ".by_task")  # a sweep's copy: no session
    (tmp_path / "task" / "unstarted").mkdir()
    assert script.training_sessions(tmp_path / "task" / "extended") == [
        (t0 + 1200, t0 + 1800),
        (t0 + 9000, t0 + 9300),
    ]
    assert script.study_minutes(tmp_path) == (900 + 600 + 300) / 60


def test_each_quality_has_its_own_section_of_the_results_page(tmp_path: Path) -> None:
    script = results_script()
    page = (SCRIPTS.parent / "docs" / "results.md").read_text()
    args = argparse.Namespace(compare_init=False, paper=False, attentions="softmax,primal", bc=True)
    for quality, section in script.SECTIONS.items():
        tasks = script.recorded_tasks(quality)
        configs, found, _, _ = script.comparison(args, tmp_path, tasks)
        assert found == section and configs.endswith("matched-bc.toml")
        assert f"<!-- {section}:start -->" in page
    args.attentions = "all"
    assert script.comparison(args, tmp_path, ["halfcheetah-medium"])[1] == "results-attentions"


def write_record(folder: Path, precision: str, machines: list[str]) -> None:
    """A whole config.json, as a run of dt on halfcheetah-medium would record it."""
    config = load_config(
        named_config_path("dt"), [f'train.precision="{precision}"'], task="halfcheetah-medium"
    )
    write_run_config(RunDir(folder), RunConfig("halfcheetah-medium", "dt", config, machines))


def test_the_studys_precision_and_machines_are_read_from_what_its_runs_recorded(
    tmp_path: Path,
) -> None:
    script = results_script()
    assert script.study_precision(script.recorded(tmp_path)) == "no recorded precision"
    assert script.study_machines(script.recorded(tmp_path)) == "an unrecorded machine"
    for name, precision, machines in [
        ("a", "fp32", ["X"]),
        ("b", "fp32", ["X", "Y"]),
        ("c", "bf16", []),
    ]:
        folder = tmp_path / "task" / name
        folder.mkdir(parents=True)
        write_record(folder, precision, machines)
    assert script.study_precision(script.recorded(tmp_path / "task" / "a")) == "fp32"
    assert script.study_precision(script.recorded(tmp_path)) == "bf16 and fp32"
    assert script.study_machines(script.recorded(tmp_path / "task" / "a")) == "X"
    assert script.study_machines(script.recorded(tmp_path)) == "X and Y"


def test_record_only_records_the_studys_datasets_and_trains_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    script, recorded, commands = results_script(), [], []
    monkeypatch.setattr(script, "record", lambda root, tasks, *rest: recorded.append((root, tasks)))
    monkeypatch.setattr(script, "primal_dt", lambda *args, **kwargs: commands.append(args))
    monkeypatch.setattr(
        sys, "argv", ["results.py", "--out", str(tmp_path), "--medium-expert", "--record-only"]
    )
    script.main()
    assert recorded == [(tmp_path / "minari", script.recorded_tasks("medium-expert"))]
    assert commands == [] and sorted(tmp_path.iterdir()) == []


def test_a_study_without_write_docs_writes_nothing_outside_its_out_folder(
    tmp_path: Path, monkeypatch
) -> None:
    """results.py's main with its recording and its primal-dt commands stood in for by what
    they leave (runs, a report with a figure): the checkout is as it was."""
    script = results_script()
    out = tmp_path / "out"

    def commands(*args: str, env: dict[str, str] | None = None) -> str:
        if args[0] == "sweep":
            run = Path(args[args.index("--runs-dir") + 1]) / "halfcheetah-medium" / "run"
            run.mkdir(parents=True)
            write_record(run, "fp32", [])
            (run / "eval.jsonl").write_text("{}")
            event_file(run, 1_000_000_000, 1_000_000_060)  # a minute's session
        else:  # report
            reported = Path(args[args.index("--out") + 1])
            reported.mkdir(parents=True)
            (reported / "report.md").write_text("# Report\n\n## Scores\n\nnone\n")
            (reported / "curves_halfcheetah-medium.png").write_bytes(b"png")
        return ""

    monkeypatch.setattr(script, "record", lambda *args: None)
    monkeypatch.setattr(script, "primal_dt", commands)

    def checkout() -> list[tuple[Path, float]]:  # what a study could write: figures, pages
        places = [SCRIPTS, SCRIPTS.parent / "docs", SCRIPTS.parent / "README.md"]
        files = [f for place in places for f in ([place] if place.is_file() else place.rglob("*"))]
        return sorted(
            (f, f.stat().st_mtime)
            for f in files
            if "_build" not in f.parts and "__pycache__" not in f.parts
        )

    before = checkout()
    monkeypatch.setattr(
        sys,
        "argv",
        ["results.py", "--out", str(out), "--tasks", "halfcheetah-medium", "--seeds", "0"],
    )
    script.main()
    assert checkout() == before
    assert (out / "results-report" / "curves_halfcheetah-medium.png").is_file()


def test_combine_reports_the_tasks_sections_runs_together_and_keeps_what_is_over_tasks(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """results.py --combine trains and records nothing: it reports the runs of each task's section
    made apart together, and keeps the report's sections over tasks (the final scores', the last
    quarter's, the aggregates with their figure), not what each task's section already says. A
    task whose section has no runs yet is one clear error."""
    script, out, commands = results_script(), tmp_path / "out", []

    def report(*args: str, env: dict[str, str] | None = None) -> str:
        commands.append(args)
        reported = Path(args[args.index("--out") + 1])
        reported.mkdir(parents=True)
        (reported / "report.md").write_text(
            "\n".join(
                [
                    "# primal-dt report: ...",
                    "",
                    "## Comparisons per task",
                    "",
                    "- a − b on t1: once",
                    "",
                    "## Paired differences over tasks",
                    "",
                    "- a − b over 3 tasks: final",
                    "",
                    "## Paired differences over the last quarter",
                    "",
                    "- a − b on t1: late, once",
                    "",
                    "## Paired differences over tasks, over the last quarter",
                    "",
                    "- a − b over 3 tasks: late",
                    "",
                    "## Aggregates over tasks",
                    "",
                    "| table |",
                    "",
                    "![aggregates](aggregates.png)",
                    "",
                    "## Attention spectrum",
                    "",
                    "- spectra",
                    "",
                ]
            )
        )
        (reported / "aggregates.png").write_bytes(b"png")
        return ""

    monkeypatch.setattr(script, "primal_dt", report)
    monkeypatch.setattr(script, "record", lambda *args: commands.append(("record",)))
    monkeypatch.setattr(sys, "argv", ["results.py", "--out", str(out), "--replay", "--combine"])
    parts = [out / f"results-replay-{name}-runs" for name in script.RECORDED]
    with pytest.raises(
        SystemExit, match=re.escape(f"no runs of halfcheetah-medium-replay in {parts[0]}")
    ):
        script.main()
    for part in parts:
        (part / "task" / "run").mkdir(parents=True)
        write_record(part / "task" / "run", "bf16", ["a CPU"])
    script.main()
    assert commands == [("report", *map(str, parts), "--out", str(out / "results-replay-report"))]
    printed = capsys.readouterr().out
    assert "`python scripts/results.py --replay --combine` (results-replay)" in printed
    assert (
        "3 tasks (halfcheetah-medium-replay, hopper-medium-replay, walker2d-medium-replay) x dt x 1 seeds."
        in printed
    )
    kept = printed.split(" own section.\n\n", 1)[1]
    assert kept.startswith("### Paired differences over tasks\n\n- a − b over 3 tasks: final")
    assert (
        "### Paired differences over tasks, over the last quarter\n\n- a − b over 3 tasks: late"
        in kept
    )
    assert f"![aggregates]({out / 'results-replay-report' / 'aggregates.png'})" in kept
    assert "once" not in kept and "spectra" not in kept


def test_the_pages_first_paragraph_says_budget_power_and_corls_fraction() -> None:
    script = results_script()
    corl = corl_scores()

    def row(task: str, final: list[float]) -> Row:  # as the report's side table gets it
        return Row(task, "matched-softmax", [0, 1], final, [], [6000], True, [], [], [215000])

    side = corl_table(
        [row("halfcheetah-medium", [37.98, 37.98]), row("hopper-medium", [50.1, 50.1])],
        "matched-softmax",
        corl,
    )
    over = (
        "matched-primal − matched-softmax over 3 tasks (5 paired seeds each): +0.4 [-1.0, +1.8] "
        "(...): no difference detected; the study could detect 4.1 points over the tasks"
    )
    report = "\n".join(
        [
            "# r",
            "",
            "## Comparisons per task",
            "",
            "- matched-primal − matched-softmax on a: +1.0 [...]: the study could detect 2.5 points",
            "- matched-bc − matched-softmax on a: +1.0 [...]: the study could detect 99.0 points",
            "- matched-primal − matched-softmax on b: +1.0 [...]: the study could detect 17.0 points",
            "",
            "## Paired differences over tasks",
            "",
            f"- {over}",
            "",
            "## Are the curves flat?",
            "",
            "- a on t: the last quarter's mean ... +0.5 [-1.3, +2.3] over 5 seeds: flat: no change "
            "detected beyond the seeds' spread.",
            "- c on t: the last quarter's mean ... +4.3 [-12.1, +20.7] over 5 seeds: flat: no change "
            "detected beyond the seeds' spread.",
            "- b on t: the last quarter's mean ... +12.3 [+3.6, +21.0] over 5 seeds: still rising.",
            "",
            side,
        ]
    )
    text = script.first_paragraph(report, corl, 64)
    assert "Each run trains 6,000 steps of a model of 215,000 parameters" in text
    assert (
        "6% of the 100,000 steps at which CORL trains DT, and, at batch 64, 0.09% of the " in text
    )
    assert (
        "windows it sees (384,000 against 409,600,000); CORL's DT is a model of embed 128" in text
    )
    assert "halfcheetah-medium 0.90, hopper-medium 0.77." in text  # 37.98 / 42.2, 50.1 / 65.1
    assert f"Over the tasks, {over}" in text
    assert "ranges from 2.5 to 17.0 points." in text  # matched-bc's is not Primal's question
    assert (
        "2 of the 3 curves (task and config) are flat within the seeds' spread, though their "
        "intervals on the change reach ±16.4 points, so a change up to that size may go "
        "undetected; not flat: b on t (still rising)." in text
    )  # the widest flat interval, [-12.1, +20.7]
    assert "nothing to say" in script.first_paragraph("# r", corl, 64)
