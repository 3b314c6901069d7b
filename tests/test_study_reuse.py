"""A study of its own reads the runs the matched sections keep of a config it shares with them
(tools/study_reuse.py): only where every task and seed has one, finished, with the same settings."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from primal_dt.common.loading import load_config, option_overrides
from primal_dt.store.results import EvalResult, append_result
from primal_dt.store.run_facts import RunFacts, write_facts
from primal_dt.store.runconfig import RunConfig, write_run_config
from primal_dt.store.rundir import RunDir
from primal_dt.tools import study as study_module
from primal_dt.tools.report_data import ReportData, StudyFacts, write_report_data
from primal_dt.tools.study import Study, comparison, run_study
from primal_dt.tools.study_configs import init_configs, matched_config
from primal_dt.tools.study_reuse import gather, reusable

TASKS = ["halfcheetah-medium", "hopper-medium"]
OVERRIDES = option_overrides(device="cpu", offline=True)  # the study's, as run_study gives them


def keep_run(
    section: Path, config: Path, task: str, seed: int, *, final: bool = True, **train: object
) -> RunDir:
    """A kept run as a report's copy leaves it: config.json, facts.json, eval.jsonl; train: settings
    changed from what the study asks."""
    made = load_config(config, [*OVERRIDES, *option_overrides(seed=seed)], task)
    made = dataclasses.replace(made, train=dataclasses.replace(made.train, **train))
    run = RunDir(section / task / f"{config.stem}-s{seed}")
    run.path.mkdir(parents=True)
    write_run_config(run, RunConfig(task, config.stem, made, ["a CPU"]))
    steps = made.train.steps
    write_facts(run, RunFacts(steps, steps, 1000, None))
    append_result(run, EvalResult(steps // 2, "step.pt", task, score=1.0))
    if final:
        append_result(run, EvalResult(steps, "step.pt", task, final=True, score=2.0))
    return run


def test_a_config_is_reused_only_where_every_task_and_seed_has_its_finished_run(
    tmp_path: Path,
) -> None:
    primal, softmax = matched_config(tmp_path, "primal"), matched_config(tmp_path, "softmax")
    first, second = tmp_path / "results-halfcheetah", tmp_path / "results-hopper"
    for seed in (0, 1):
        keep_run(first, primal, TASKS[0], seed)
        keep_run(second, primal, TASKS[1], seed)
        keep_run(first, softmax, TASKS[0], seed)  # softmax lacks hopper-medium
    found = reusable([primal, softmax], TASKS, [0, 1], [first, second], OVERRIDES)
    assert [r.config for r in found] == ["matched-primal"]
    assert found[0].sections == ["results-halfcheetah", "results-hopper"]
    assert [(r.parent.name, r.name) for r in found[0].runs] == [
        (task, f"matched-primal-s{seed}") for seed in (0, 1) for task in TASKS
    ]
    assert reusable([primal], TASKS, [0, 1, 2], [first, second], OVERRIDES) == []  # no seed 2
    gathered = gather(found, tmp_path / "reused")
    assert sorted(str(p.relative_to(gathered)) for p in gathered.glob("*/*")) == sorted(
        f"{task}/matched-primal-s{seed}" for seed in (0, 1) for task in TASKS
    )


def test_a_kept_run_with_other_settings_or_no_final_evaluation_is_not_reused(
    tmp_path: Path,
) -> None:
    primal = matched_config(tmp_path, "primal")
    kept = tmp_path / "kept"
    keep_run(kept, primal, TASKS[0], 0, lr=0.5)
    assert reusable([primal], TASKS[:1], [0], [kept], OVERRIDES) == []
    shutil.rmtree(kept)
    keep_run(kept, primal, TASKS[0], 0, final=False)
    assert reusable([primal], TASKS[:1], [0], [kept], OVERRIDES) == []
    shutil.rmtree(kept)
    keep_run(kept, primal, TASKS[0], 0, log_every=7)  # how it was logged makes no result
    assert len(reusable([primal], TASKS[:1], [0], [kept], OVERRIDES)) == 1
    other_steps = option_overrides(steps=123, device="cpu", offline=True)
    assert reusable([primal], TASKS[:1], [0], [kept], other_steps) == []


def test_the_initialisations_study_compares_matched_primal_itself_with_the_other_init(
    tmp_path: Path,
) -> None:
    names = [config.stem for config in init_configs(tmp_path)]
    assert names == ["matched-primal-per-head-init", "matched-primal"]
    configs, _, _ = comparison(Study(tmp_path, TASKS, compare_init=True))
    assert [Path(c).stem for c in configs.split(",")] == names


def test_a_study_of_its_own_trains_only_the_configs_the_matched_sections_lack(
    tmp_path: Path, monkeypatch
) -> None:
    """The initialisations' study: matched-primal read from the kept matched sections, not swept;
    the report reads the new runs and the reused ones together, and the section's first line says
    which were read. Making a matched section again trains all it asks for."""
    data = tmp_path / "results-data"
    monkeypatch.setattr(study_module, "RESULTS_DATA", data)
    primal = matched_config(tmp_path / "made", "primal")
    for task, env in zip(TASKS, ("halfcheetah", "hopper"), strict=True):
        keep_run(data / f"results-{env}", primal, task, 0)
    commands: list[tuple[str, ...]] = []

    def command(*args: str, env: dict[str, str]) -> str:
        commands.append(args)
        if args[0] == "report":
            out = Path(args[args.index("--out") + 1])
            facts = StudyFacts(TASKS, ["c"], [0], ["a CPU"], ["bf16"], [64], steps=9, minutes=1.0)
            out.mkdir(parents=True, exist_ok=True)
            write_report_data(ReportData(list(args[1:2]), 4, None, facts), out / "report.json")
        return ""

    text = run_study(Study(tmp_path / "out", TASKS, seeds="0", compare_init=True), command)
    sweep, report = commands
    assert Path(sweep[sweep.index("--configs") + 1]).stem == "matched-primal-per-head-init"
    assert [Path(a).name for a in report[1:3]] == ["results-init-runs", "results-init-reused"]
    assert sorted(p.name for p in (tmp_path / "out" / "results-init-reused").glob("*/*")) == [
        "matched-primal-s0",
        "matched-primal-s0",
    ]
    assert (
        "matched-primal's runs are those results-data/results-halfcheetah, results-hopper" in text
    )
    commands.clear()
    study = Study(tmp_path / "out", TASKS[:1], seeds="0", section="results-halfcheetah")
    run_study(study, command)
    assert commands[0][commands[0].index("--configs") + 1].count(",") == 2  # all three trained
    commands.clear()
    run_study(dataclasses.replace(study, section=None, compare_init=True, reuse=False), command)
    assert commands[0][commands[0].index("--configs") + 1].count(",") == 1  # --no-reuse: both
