"""The results page (docs/results.md) and the README's summary (its table at a glance), made by the pipeline
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
    python scripts/results.py --attentions all --no-bc --tasks halfcheetah-medium --seeds 0,1 --part --write-docs
        # a study too long for one sitting, a few seeds at a time: --seeds 2,3 and --seeds 4
        # later join the runs its section keeps, and the section is written from them all
    python scripts/results.py --refresh
        # the table at a glance, its figure and the README's summary again from results-data/
    python scripts/results.py --attentions all --no-bc --tasks halfcheetah-medium
        # all seven attentions of the paper's table, on one dataset
    python scripts/results.py --compare-init --write-docs
        # matched-primal with each initialisation of We and Wr (model.attention_settings.primal.init), side by side
        # (these two studies read the runs the matched sections keep of matched-softmax and
        # matched-primal instead of training them again; --no-reuse trains them)
    python scripts/results.py --paper --tasks halfcheetah-medium,... --device cuda --seeds 0,1,2
        # the papers' own configs at their budget (100k steps): the reproduction, on a GPU
    python scripts/results.py --budget --tasks hopper-medium --device cuda --write-docs
        # the matched comparison at the papers' budget where the report extra is installed, into
        # results-budget-<env>; on a lent GPU, scripts/gpu_study.sh trains it and --from-data reads it

At the CPU budget this compares attentions under one matched setting on datasets recorded here; it
does not reproduce the paper's numbers, which came from D4RL v2 datasets at 100k steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_common import primal_dt
from doc_tables import write_section

from primal_dt.tools.study import (
    Study,
    combine,
    from_data,
    record,
    run_study,
    write_page_wide,
)
from primal_dt.tools.study_datasets import recorded_tasks


def build_parser() -> argparse.ArgumentParser:
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
        "--budget",
        action="store_true",
        help="the matched configs at the papers' budget (embed 128, 100,000 steps: "
        "primal_dt/tools/papers_budget.toml), for a GPU (scripts/gpu_study.sh)",
    )
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
        "--part",
        action="store_true",
        help="with --write-docs: these seeds' runs join the runs the section keeps (results-data/"
        "<section>), and the section is written from them all: a study too long for one sitting, "
        "made a few seeds at a time with the same other flags",
    )
    parser.add_argument(
        "--reuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="in a study of its own (the attentions', the initialisations'), read the runs of a "
        "config that the matched sections keep with the same settings, tasks and seeds instead "
        "of training them again (on)",
    )
    parser.add_argument(
        "--record-only",
        action="store_true",
        help="record the datasets the study needs, and train nothing",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="read the runs that the tasks' sections made apart keep (results-data/<section>-<env>) "
        "together, and train nothing",
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="rewrite the table at a glance, its figure, the README's summary and the paper's "
        "table from results-data/, and train nothing",
    )
    parser.add_argument(
        "--from-data",
        metavar="FOLDER",
        help="write the section of runs trained elsewhere from their data alone (results-data/"
        "<section>, as scripts/gpu_study.sh --take unpacks it), and train nothing",
    )
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.budget and (args.paper or args.compare_init):
        parser.error("--budget is the matched comparison's: not with --paper or --compare-init")
    if args.part and (not args.write_docs or args.combine or args.from_data or args.refresh):
        parser.error(
            "--part trains seeds that join a section's kept runs: give --write-docs, and "
            "not --combine, --from-data or --refresh"
        )
    if args.refresh:
        write_page_wide(write_section)
        return
    quality = (
        "medium-replay" if args.replay else "medium-expert" if args.medium_expert else "medium"
    )
    study = Study(
        out=Path(args.out).resolve(),
        tasks=args.tasks.split(",") if args.tasks else recorded_tasks(quality),
        quality=quality,
        seeds=args.seeds,
        steps=args.steps,
        dataset_steps=args.dataset_steps,
        attentions=args.attentions,
        bc=args.bc,
        episodes=args.episodes,
        parallel=args.parallel,
        device=args.device,
        paper=args.paper,
        budget=args.budget,
        compare_init=args.compare_init,
        section=args.section,
        write_docs=args.write_docs,
        part=args.part,
        reuse=args.reuse,
    )
    write = write_section if args.write_docs else None
    if args.from_data:
        print(from_data(study, Path(args.from_data).resolve(), primal_dt, write))
        return
    if args.combine:
        print(combine(study, primal_dt, write))
        return
    record(study, primal_dt)
    if not args.record_only:
        print(run_study(study, primal_dt, write))


if __name__ == "__main__":
    main()
