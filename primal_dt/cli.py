"""The `primal-dt` command line: it parses arguments and calls the modules, nothing else."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from primal_dt.errors import PrimalDTError

if TYPE_CHECKING:
    from primal_dt.train import Trainer


def _train(args: argparse.Namespace) -> int:
    from primal_dt.evaluate import format_table
    from primal_dt.train import StopSignals

    with StopSignals() as stop:  # a signal while the data loads still ends with a checkpoint
        trainer = _make_trainer(args)
        print(f"run directory: {trainer.run_dir}", file=sys.stderr)
        final = trainer.run(progress=not args.no_progress, stop=stop)
    if final is not None:
        print(format_table([final]))
    print(f"checkpoint: {trainer.run_dir / 'ckpt.pt'}", file=sys.stderr)
    return 0


def _make_trainer(args: argparse.Namespace) -> Trainer:
    from primal_dt.config import load_config, named_config_path
    from primal_dt.errors import ConfigError
    from primal_dt.tasks import dataset_task, resolve_task
    from primal_dt.train import default_run_dir, resume_run, start_run

    if args.resume:
        given = (args.env, args.dataset, args.config, args.set, args.device)
        if any(given) or args.seed is not None or args.final_episodes is not None:
            raise ConfigError(
                "--resume continues a run with its saved task and config; only --steps, "
                "--offline and --no-progress may be given with it"
            )
        return resume_run(Path(args.resume), args.steps, False if args.offline else None)
    if bool(args.env) == bool(args.dataset):
        raise ConfigError(
            "give exactly one of --env TASK (e.g. halfcheetah-medium) or --dataset ID"
        )
    task = resolve_task(args.env) if args.env else dataset_task(args.dataset)
    config_file = named_config_path(args.config or "primal-dt")
    overrides = list(args.set or [])
    for key, value in (("train.steps", args.steps), ("train.seed", args.seed),
                       ("train.device", args.device),
                       ("eval.final_episodes", args.final_episodes)):  # fmt: skip
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if args.offline:
        overrides.append("data.download=false")
    config = load_config(config_file, overrides, task=task.name)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(
        task.name, config_file.stem, config.train.seed
    )  # fmt: skip
    return start_run(config, task, run_dir)


def _eval(args: argparse.Namespace) -> int:
    from primal_dt.checkpoint import checkpoints_to_evaluate
    from primal_dt.eval_service import EvalOptions, watch
    from primal_dt.evaluate import evaluate_checkpoint, format_table
    from primal_dt.train import resolve_device

    if args.episodes is not None and args.episodes <= 0:
        raise PrimalDTError(f"--episodes must be > 0, got {args.episodes}")
    if args.workers < 0:
        raise PrimalDTError(f"--workers must be >= 0, got {args.workers}")
    if bool(args.ckpt) == bool(args.watch):
        raise PrimalDTError("give either --ckpt PATH [PATH ...] or --watch RUN_DIR")
    if args.watch:
        options = EvalOptions(args.device, args.workers, args.episodes, args.seed, args.targets)
        resolve_device(args.device)  # a missing CUDA is an error now, not at the first checkpoint
        try:
            watch(Path(args.watch), options)
        except KeyboardInterrupt:
            print("stopped watching", file=sys.stderr)
        return 0
    device = resolve_device(args.device)
    paths = [p for given in args.ckpt for p in checkpoints_to_evaluate(given, args.all)]
    records = []
    for path in paths:
        records.append(
            evaluate_checkpoint(path, device, args.episodes, args.seed, args.targets, args.workers)
        )
        if not args.json:
            print(f"evaluated {path} in {records[-1]['seconds']:.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        print(format_table(records))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="primal-dt",
        description="Decision Transformer with masked Primal-Attention for offline RL on Minari.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train on a task or Minari dataset")
    train.add_argument("--env", metavar="TASK", help="task, e.g. halfcheetah-medium")
    train.add_argument("--dataset", metavar="ID", help="any Minari dataset id instead of --env")
    train.add_argument("--config", metavar="FILE", help="config name (dt, primal-dt) or .toml file")
    train.add_argument("--steps", type=int, help="training steps (train.steps)")
    train.add_argument("--seed", type=int, help="random seed (train.seed)")
    train.add_argument("--device", help="auto, cpu, cuda or cuda:N (train.device)")
    train.add_argument("--run-dir", metavar="DIR", help="where logs and checkpoints go")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    train.add_argument("--offline", action="store_true", help="never download datasets")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--final-episodes", type=int, help="episodes per target at the end (eval.final_episodes)"
    )
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value, repeatable"
    )
    train.set_defaults(func=_train)

    evaluate = commands.add_parser(
        "eval", help="roll checkpoints out and score them, or serve a run's evaluations"
    )
    evaluate.add_argument(
        "--ckpt", nargs="+", metavar="PATH",
        help="checkpoint files or run directories (their latest checkpoint); one table for all",
    )  # fmt: skip
    evaluate.add_argument(
        "--all", action="store_true", help="every kept checkpoint of each run directory"
    )
    evaluate.add_argument(
        "--watch", metavar="RUN_DIR",
        help="evaluate each new checkpoint of a (running) run as it appears, until stopped",
    )  # fmt: skip
    evaluate.add_argument(
        "--episodes", type=int, help="episodes per target (default: the run's eval.episodes)"
    )
    evaluate.add_argument("--seed", type=int, help="seed of the first episode (default: the run's)")
    evaluate.add_argument(
        "--targets", type=float, nargs="+", help="target returns (default: the run's)"
    )
    evaluate.add_argument(
        "--workers", type=int, default=0,
        help="environment processes stepping at once (default 0: all in this process)",
    )  # fmt: skip
    evaluate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    evaluate.add_argument("--json", action="store_true", help="print the records as JSON")
    evaluate.set_defaults(func=_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except PrimalDTError as err:
        print(f"primal-dt: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("primal-dt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
