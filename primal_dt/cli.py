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
        results = trainer.run(progress=not args.no_progress, stop=stop)
    if results:
        print(format_table(trainer.data.task.name, results, trainer.data.reference))
    print(f"checkpoint: {trainer.run_dir / 'ckpt.pt'}", file=sys.stderr)
    return 0


def _make_trainer(args: argparse.Namespace) -> Trainer:
    from primal_dt.config import load_config, named_config_path
    from primal_dt.errors import ConfigError
    from primal_dt.tasks import dataset_task, resolve_task
    from primal_dt.train import default_run_dir, resume_run, start_run

    if args.resume:
        if args.env or args.dataset or args.config or args.set or args.seed is not None:
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
                       ("train.device", args.device)):  # fmt: skip
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
    from primal_dt.evaluate import evaluate, format_table, load_policy
    from primal_dt.train import resolve_device

    policy, setup, ckpt = load_policy(args.ckpt, resolve_device(args.device))
    if args.episodes <= 0:
        raise PrimalDTError(f"--episodes must be > 0, got {args.episodes}")
    results = evaluate(policy, setup, args.episodes, args.seed, args.targets)
    task = ckpt["task"]["name"]
    if args.json:
        print(json.dumps({"task": task, "step": ckpt["step"], "results": [
            r.summary() for r in results]}))  # fmt: skip
    else:
        print(f"checkpoint {args.ckpt} (step {ckpt['step']}), {setup.env_id}")
        print(format_table(task, results, setup.reference))
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
        "--set", action="append", metavar="KEY=VALUE", help="override a config value, repeatable"
    )
    train.set_defaults(func=_train)

    evaluate = commands.add_parser("eval", help="roll a checkpoint out and score it")
    evaluate.add_argument("--ckpt", required=True, help="checkpoint file or run directory")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes per target")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    evaluate.add_argument(
        "--targets", type=float, nargs="+", help="target returns (default: task's)"
    )
    evaluate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
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
