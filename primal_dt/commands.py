"""What each `primal-dt` command does with its parsed arguments: check that they go together,
call the modules that do the work, and print what they return (cli.py only parses)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from primal_dt.common.errors import CheckpointError, PrimalDTError

if TYPE_CHECKING:
    from primal_dt.common.config import Config
    from primal_dt.data.tasks import Task
    from primal_dt.training.pack import Pack
    from primal_dt.training.trainer import Trainer


def train(args: argparse.Namespace) -> int:
    from primal_dt.common.signals import StopSignals
    from primal_dt.store.results import format_table

    if args.seeds is not None or (args.resume and len(args.resume) > 1):
        return _train_pack(args)
    with StopSignals() as stop:  # a signal while the data loads still ends with a checkpoint
        trainer = _make_trainer(args)
        print(f"run directory: {trainer.run_dir}", file=sys.stderr)
        print(f"dataset: {_describe(trainer.data.task.dataset_ids)}", file=sys.stderr)
        final = trainer.train(progress=not args.no_progress, stop=stop)
    if final is not None:
        print(format_table([final]))
    print(f"checkpoint: {trainer.run_dir.checkpoint}", file=sys.stderr)
    return 0


def _train_pack(args: argparse.Namespace) -> int:
    """`train --seeds` or `train --resume` of several runs: one pack (training/pack.py)."""
    from primal_dt.common.signals import StopSignals
    from primal_dt.store.results import format_table

    with StopSignals() as stop:
        pack = _make_pack(args)
        print(f"pack of {len(pack.trainers)} runs: {' '.join(pack.run_dirs)}", file=sys.stderr)
        print(f"dataset: {_describe(pack.trainers[0].data.task.dataset_ids)}", file=sys.stderr)
        finals = pack.train(progress=not args.no_progress, stop=stop)
    records = [final for final in finals if final is not None]
    if records:
        print(format_table(records))
    for trainer in pack.trainers:
        print(f"checkpoint: {trainer.run_dir.checkpoint}", file=sys.stderr)
    return 0


def _check_resume_alone(args: argparse.Namespace) -> None:
    from primal_dt.common.errors import ConfigError

    given = (args.env, args.dataset, args.config, args.set, args.device, args.compile)
    if any(given) or args.seed is not None or args.final_episodes is not None or args.seeds:
        raise ConfigError(
            "--resume continues a run with its saved task and config; only --steps, "
            "--offline and --no-progress may be given with it"
        )


def _new_config(args: argparse.Namespace) -> tuple[Task, Path, Config]:
    """The task, config file and config of a new run (or pack) from train's arguments."""
    from primal_dt.common.errors import ConfigError
    from primal_dt.common.loading import load_config, named_config_path, option_overrides
    from primal_dt.data.tasks import dataset_task, resolve_task

    if bool(args.env) == bool(args.dataset):
        raise ConfigError(
            "give exactly one of --env TASK (e.g. halfcheetah-medium) or --dataset ID"
        )
    task = resolve_task(args.env) if args.env else dataset_task(args.dataset)
    config_file = named_config_path(args.config or "primal-dt")
    options = option_overrides(
        steps=args.steps,
        seed=args.seed,
        device=args.device,
        final_episodes=args.final_episodes,
        offline=args.offline,
        compile=args.compile,
    )
    config = load_config(config_file, [*(args.set or []), *options], task=task.name)
    return task, config_file, config


def _make_pack(args: argparse.Namespace) -> Pack:
    from primal_dt.common.errors import ConfigError
    from primal_dt.store.rundir import run_dir_name
    from primal_dt.tools.grid import parse_list
    from primal_dt.training.launch import default_run_dir, resume_pack, start_pack, with_seeds

    if args.rollback:
        raise ConfigError("--from rolls one run back: give it with one --resume RUN_DIR")
    if args.resume:
        _check_resume_alone(args)
        download = False if args.offline else None
        return resume_pack([Path(path) for path in args.resume], args.steps, download)
    if args.seed is not None or args.run_dir:
        raise ConfigError(
            "--seeds trains one run per seed, each in its own directory: give it without "
            "--seed and --run-dir (--runs-dir DIR puts them in DIR/<task>/<config>-s<seed>)"
        )
    seeds = parse_list(args.seeds, "--seeds", int)
    if not seeds:
        raise ConfigError("--seeds is empty; give a comma-separated list, e.g. --seeds 0,1,2")
    task, config_file, config = _new_config(args)
    name = config_file.stem
    if args.runs_dir:
        run_dirs = [Path(args.runs_dir) / run_dir_name(task.name, name, seed) for seed in seeds]
    else:
        run_dirs = [default_run_dir(task.name, name, seed) for seed in seeds]
    return start_pack(with_seeds(config, seeds), task, run_dirs, name)


def _make_trainer(args: argparse.Namespace) -> Trainer:
    from primal_dt.common.errors import ConfigError
    from primal_dt.training.launch import default_run_dir, resume_run, start_run

    if args.rollback and not args.resume:
        raise ConfigError("--from rolls a run back: give it with --resume RUN_DIR")
    if args.runs_dir:
        raise ConfigError("--runs-dir places the runs of --seeds; one run takes --run-dir")
    if args.resume:
        _check_resume_alone(args)
        rollback = Path(args.rollback) if args.rollback else None
        download = False if args.offline else None
        return resume_run(Path(args.resume[0]), args.steps, download, rollback)
    task, config_file, config = _new_config(args)
    run_dir = (
        Path(args.run_dir)
        if args.run_dir
        else default_run_dir(task.name, config_file.stem, config.train.seed)
    )
    return start_run(config, task, run_dir, config_file.stem)


def evaluate(args: argparse.Namespace) -> int:
    from primal_dt.common.device import resolve_device
    from primal_dt.evaluation.checkpoints import evaluate_checkpoints
    from primal_dt.evaluation.conditioning import targets_between
    from primal_dt.evaluation.rollout import EvalOptions
    from primal_dt.evaluation.service import watch
    from primal_dt.evaluation.video import VideoUnavailable, check_mp4_writer
    from primal_dt.store.results import format_table

    if bool(args.ckpt) == bool(args.watch):
        raise PrimalDTError("give either --ckpt PATH [PATH ...] or --watch RUN_DIR")
    targets = targets_between(args.target_sweep) if args.target_sweep else args.targets
    options = EvalOptions(args.device, args.workers, args.episodes, args.seed, targets, args.video)
    device = resolve_device(options.validate().device, "--device")
    if options.videos:
        check_mp4_writer()  # before any evaluation runs or a videos/ folder is made
    if args.watch:
        try:
            watch(Path(args.watch), options, device)
        except KeyboardInterrupt:
            print("stopped watching", file=sys.stderr)
        return 0
    records = evaluate_checkpoints(
        args.ckpt,
        options,
        device,
        every=args.all,
        curve=bool(args.target_sweep),
        say=lambda line: print(line, file=sys.stderr),
        quiet=args.json,
    )
    if args.json:
        print(json.dumps([record.to_dict() for record in records], indent=1))
    else:
        print(format_table(records))
    for record in records:
        for video in record.videos:
            print(f"video: {video}", file=sys.stderr)
    failed = [record for record in records if record.error is not None]
    for record in failed:  # each good checkpoint's numbers are above; the bad ones fail the command
        print(f"primal-dt: error: {record.error}", file=sys.stderr)
    if failed:
        return CheckpointError.exit_code
    for record in records:
        if record.video_error:  # the numbers above stand; the videos could not be made
            raise VideoUnavailable(record.video_error)
    return 0


def _describe(dataset_ids: tuple[str, ...]) -> str:
    from primal_dt.data.sources import describe_sources

    return describe_sources(dataset_ids)


def datasets_list(args: argparse.Namespace) -> int:
    from primal_dt.data.catalogue import format_list, list_datasets

    print(format_list(list_datasets()))
    return 0


def datasets_info(args: argparse.Namespace) -> int:
    from primal_dt.data.catalogue import dataset_info

    print(dataset_info(args.id))
    return 0


def datasets_download(args: argparse.Namespace) -> int:
    from primal_dt.data.catalogue import download

    print(f"{args.id}: {download(args.id)}")
    return 0


def datasets_make(args: argparse.Namespace) -> int:
    from primal_dt.data.recipes import MakeOptions, make_dataset

    fields = {  # options not given keep MakeOptions' defaults
        k: v
        for k, v in vars(args).items()
        if k in MakeOptions.__dataclass_fields__ and v is not None
    }
    options = MakeOptions(**fields, download=not args.offline)
    dataset_id = make_dataset(
        options, log=lambda line: print(line, file=sys.stderr), progress=not args.no_progress
    )
    print(dataset_id)
    return 0


def datasets_reference(args: argparse.Namespace) -> int:
    from primal_dt.data.references import measure_into

    found = measure_into(
        Path(args.out), args.env, args.expert_policy, lambda line: print(line, file=sys.stderr)
    )
    print(f"{found.env_id}: random {found.random:.2f}, expert {found.expert:.2f} -> {args.out}")
    return 0


def datasets_carry(args: argparse.Namespace) -> int:
    from primal_dt.data.carried import carry

    carrier = carry(args.id)
    carrier.write(Path(args.out))
    size = Path(args.out).stat().st_size / 2**20
    about = carrier.about
    print(
        f"{about.dataset_id}: {len(carrier.lengths)} episodes, {about.steps} steps -> {args.out} "
        f"({size:.1f} MiB)"
    )
    return 0


def datasets_remake(args: argparse.Namespace) -> int:
    from primal_dt.common.errors import ConfigError
    from primal_dt.data.carried import remake

    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    print(remake(Path(args.carrier), args.workers))
    return 0


def sweep(args: argparse.Namespace) -> int:
    from primal_dt.tools.grid import SweepOptions, parse_list
    from primal_dt.tools.sweep import train_grid

    options = SweepOptions(
        tasks=parse_list(args.tasks, "--tasks"),
        seeds=parse_list(args.seeds, "--seeds", int),
        configs=parse_list(args.configs, "--configs"),
        runs_dir=Path(args.runs_dir),
        parallel=args.parallel,
        steps=args.steps,
        device=args.device,
        final_episodes=args.final_episodes,
        offline=args.offline,
        overrides=list(args.set or []),
        ray_address=args.ray,
        gpus_per_run=args.gpus_per_run,
        cpus_per_run=args.cpus_per_run,
        pack=args.pack,
    )
    train_grid(options, out=lambda line: print(line, flush=True))
    return 0


def report(args: argparse.Namespace) -> int:
    from primal_dt.common.errors import ConfigError
    from primal_dt.tools.report import write_report, write_runs_data

    out = Path(args.out) if args.out else None
    if args.data_only:
        if args.baseline:
            raise ConfigError("--data-only writes no comparison: leave out --baseline")
        print(write_runs_data([Path(d) for d in args.runs_dirs], out))
        return 0
    table, written = write_report([Path(d) for d in args.runs_dirs], out, args.baseline)
    print(table)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
