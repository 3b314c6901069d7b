"""The `primal-dt` command line: it parses arguments and hands them to their command
(commands.py), which calls the modules that do the work."""

from __future__ import annotations

import argparse
import re
import sys

from primal_dt import commands as handlers
from primal_dt.common.errors import PrimalDTError, describe_os_error


def _add_datasets_parser(commands: argparse._SubParsersAction) -> None:
    datasets = commands.add_parser("datasets", help="list, describe, download or make datasets")
    actions = datasets.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="datasets here and official ones, with their state")
    listing.set_defaults(func=handlers.datasets_list)
    info = actions.add_parser("info", help="episodes, returns, reference scores, provenance")
    info.add_argument("id", metavar="ID", help="dataset id or task name (e.g. hopper-bundled)")
    info.set_defaults(func=handlers.datasets_info)
    fetch = actions.add_parser("download", help="fetch an official Minari dataset")
    fetch.add_argument("id", metavar="ID", help="e.g. mujoco/hopper/medium-v0")
    fetch.set_defaults(func=handlers.datasets_download)

    make = actions.add_parser(
        "make", help="record a D4RL-style dataset as primal-dt/<env>/<name>-v0 in the Minari root"
    )
    make.add_argument("--env", required=True, help=_env_names())
    make.add_argument(
        "--recipe", required=True, help="policy, random, medium-replay or medium-expert"
    )  # checked with the other options (data/recipes.py), with a "did you mean" for a misspelling
    make.add_argument("--name", help="the dataset's quality name (default: the recipe's)")
    make.add_argument("--policy", metavar="FILE", help="policy recipe: an SB3 SAC/TQC .zip")
    count = make.add_mutually_exclusive_group()
    count.add_argument("--episodes", type=int, help="episodes to record")
    count.add_argument("--steps", type=int, help="steps to record (default 1000000, as D4RL)")
    make.add_argument("--deterministic", action="store_true", help="the policy's mean action")
    make.add_argument("--seed", type=int, help="seeds episodes, sampled actions, SAC (default 0)")
    make.add_argument(
        "--expert-policy",
        metavar="FILE",
        help="measure reference scores: this expert's and uniform-random mean returns",
    )
    make.add_argument("--ref-episodes", type=int, help="episodes per reference score (10)")
    make.add_argument(
        "--reference",
        metavar="FILE",
        help="the environment's reference scores from this file (datasets reference), not measured",
    )
    make.add_argument(
        "--target-return",
        type=float,
        help="medium-replay: stop SAC at this evaluation return (default: expert reference / 3)",
    )
    make.add_argument("--max-steps", type=int, help="medium-replay: step budget (1000000)")
    make.add_argument("--eval-every", type=int, help="medium-replay: steps between evals (5000)")
    make.add_argument("--eval-episodes", type=int, help="medium-replay: episodes per eval (5)")
    make.add_argument("--learning-starts", type=int, help="medium-replay: SAC's (10000)")
    make.add_argument(
        "--policy-out", metavar="FILE", help="medium-replay: where the medium policy is saved"
    )
    make.add_argument("--offline", action="store_true", help="medium-expert: never download")
    make.add_argument("--force", action="store_true", help="replace an existing dataset")
    make.add_argument("--no-progress", action="store_true", help="no progress bar")
    make.set_defaults(func=handlers.datasets_make)

    reference = actions.add_parser(
        "reference",
        help="measure an environment's reference scores once, to a standard error under 0.5%%",
    )
    reference.add_argument("--env", required=True, help=_env_names())
    reference.add_argument(
        "--expert-policy", metavar="FILE", required=True, help="SB3 SAC/TQC .zip"
    )
    reference.add_argument(
        "--out", metavar="FILE", required=True, help="the references file (JSON)"
    )
    reference.set_defaults(func=handlers.datasets_reference)

    carry = actions.add_parser(
        "carry",
        help="a dataset made here as its actions and reset seeds, to make again elsewhere (small)",
    )
    carry.add_argument("id", metavar="ID", help="dataset id or task name (e.g. hopper-medium)")
    carry.add_argument("--out", metavar="FILE", required=True, help="the carrier (.npz)")
    carry.set_defaults(func=handlers.datasets_carry)
    remake = actions.add_parser(
        "remake", help="make a carried dataset again by replaying its actions, checked bit for bit"
    )
    remake.add_argument("carrier", metavar="FILE", help="what datasets carry wrote")
    remake.add_argument("--workers", type=int, default=1, help="processes replaying at once (1)")
    remake.set_defaults(func=handlers.datasets_remake)


def _add_sweep_parsers(commands: argparse._SubParsersAction) -> None:
    from primal_dt.common.loading import packaged_config_names

    sweep = commands.add_parser(
        "sweep", help="train a grid of tasks x configs x seeds; run again to resume it"
    )
    sweep.add_argument(
        "--tasks", required=True, help="comma-separated, e.g. hopper-medium,walker2d-medium"
    )
    sweep.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    sweep.add_argument(
        "--configs",
        default="dt,primal-dt",
        help=f"comma-separated config names ({', '.join(packaged_config_names())}) or .toml "
        "files (default dt,primal-dt)",
    )
    sweep.add_argument(
        "--runs-dir", default="runs", help="runs go to RUNS_DIR/<task>/<config>-s<seed> (runs)"
    )
    sweep.add_argument(
        "--parallel", type=int, default=1, help="processes training at once, runs or packs (1)"
    )
    sweep.add_argument(
        "--pack",
        type=int,
        metavar="N",
        help="train up to N runs as one pack, a batched model in one process: runs of one task "
        "and config that differ only in their seed (default: on CUDA every seed of a task and "
        "config in one pack; on a CPU 1, no packs)",
    )
    sweep.add_argument("--steps", type=int, help="training steps of every run (train.steps)")
    sweep.add_argument("--device", help="auto, cpu, cuda or cuda:N, for every run")
    sweep.add_argument(
        "--final-episodes",
        type=int,
        help="episodes per target of every run's final evaluation (eval.final_episodes)",
    )
    sweep.add_argument("--offline", action="store_true", help="never download datasets")
    sweep.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="config override for every run"
    )
    sweep.add_argument(
        "--ray", metavar="ADDRESS", help="run on this Ray cluster (e.g. auto, or HOST:6379)"
    )
    sweep.add_argument(
        "--gpus-per-run",
        type=float,
        help="with --ray: GPUs each run asks for (default: 0.25 when the runs train on CUDA, 0 when "
        "they train on CPUs: --device cpu, or auto on a cluster without GPUs)",
    )
    sweep.add_argument("--cpus-per-run", type=int, default=1, help="with --ray: CPUs per run (1)")
    sweep.set_defaults(func=handlers.sweep)

    report = commands.add_parser(
        "report", help="score tables, learning curves and attention spectra of runs directories"
    )
    report.add_argument(
        "runs_dirs",
        metavar="RUNS_DIR",
        nargs="+",
        help="e.g. the --runs-dir of a sweep; several: their runs together",
    )
    report.add_argument(
        "--out", metavar="DIR", help="where to write (default the first RUNS_DIR/report)"
    )
    report.add_argument(
        "--baseline",
        metavar="CONFIG",
        help="the config every other is compared with (default: the Decision Transformer, softmax "
        "in every block and conditioned on returns, whatever its config is named)",
    )
    report.add_argument(
        "--data-only",
        action="store_true",
        help="only the copy of the runs' data (DIR/runs, what a report reads again elsewhere): "
        "for a machine without the report extra",
    )
    report.set_defaults(func=handlers.report)


def _env_names() -> str:
    """The environments of envs/*.toml, for --help texts."""
    from primal_dt.common.resources import resource_dir

    return ", ".join(sorted(p.stem for p in resource_dir("envs").glob("*.toml")))


def _train_epilog() -> str:
    """The tasks and configs `train` knows, for its --help."""
    from primal_dt.common.resources import resource_dir

    envs = _env_names()
    configs = ", ".join(sorted(p.stem for p in resource_dir("configs").glob("*.toml")))
    return (
        f"tasks: <env>-<quality>, env one of {envs}; quality one of simple, medium, expert, "
        f"medium-expert, or one made locally or bundled (primal-dt datasets list shows them, "
        f"e.g. hopper-bundled)\nconfigs: {configs} (the files of configs/), or a .toml file"
    )


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    from primal_dt import __version__

    parser = argparse.ArgumentParser(
        prog="primal-dt",
        description="Decision Transformer with masked Primal-Attention for offline RL on Minari.",
    )
    try:
        installed = version("primal-dt")
    except PackageNotFoundError:  # run from a source checkout that is not installed
        installed = __version__
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(commands)
    _add_eval_parser(commands)
    _add_datasets_parser(commands)
    _add_sweep_parsers(commands)
    return parser


def _add_train_parser(commands: argparse._SubParsersAction) -> None:
    from primal_dt.common.config import Config

    defaults = Config()
    train = commands.add_parser(
        "train",
        help="train on a task or Minari dataset",
        epilog=_train_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--env", metavar="TASK", help="task, e.g. halfcheetah-medium (see below)")
    train.add_argument("--dataset", metavar="ID", help="any Minari dataset id instead of --env")
    train.add_argument(
        "--config", metavar="FILE", help="config name (dt, primal-dt) or .toml file (primal-dt)"
    )
    train.add_argument(
        "--steps", type=int, help=f"training steps (train.steps, default {defaults.train.steps})"
    )
    train.add_argument(
        "--seed", type=int, help=f"random seed (train.seed, default {defaults.train.seed})"
    )
    train.add_argument(
        "--device",
        help=f"auto, cpu, cuda or cuda:N (train.device, default {defaults.train.device})",
    )
    train.add_argument(
        "--run-dir", metavar="DIR", help="where it writes (runs/<task>/<config>-s<seed>-<time>)"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        nargs="+",
        help="continue the run in RUN_DIR (or from its ckpt.pt); several: continue them as one "
        "pack",
    )
    train.add_argument(
        "--seeds",
        metavar="S,S,...",
        help="train one run per seed as one pack, a batched model (docs: Training, packs); "
        "each in runs/<task>/<config>-s<seed>-<time>, or under --runs-dir",
    )
    train.add_argument(
        "--runs-dir", metavar="DIR", help="with --seeds: each run in DIR/<task>/<config>-s<seed>"
    )
    train.add_argument(
        "--from",
        dest="rollback",
        metavar="CHECKPOINT",
        help="with --resume: roll the run back to this kept checkpoint, by step (--from 1000) or "
        "file (RUN_DIR/checkpoints/step_00001000.pt), and continue from it; what the run did "
        "after it is dropped",
    )
    train.add_argument("--offline", action="store_true", help="never download datasets")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--final-episodes",
        type=int,
        help=f"episodes per target at the end (eval.final_episodes, default "
        f"{defaults.eval.final_episodes}; 0: none)",
    )
    train.add_argument(
        "--compile", action="store_true", help="torch.compile the model (train.compile)"
    )
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value, repeatable"
    )
    train.set_defaults(func=handlers.train)


def _add_eval_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval", help="roll checkpoints out and score them, or serve a run's evaluations"
    )
    evaluate.add_argument(
        "--ckpt",
        nargs="+",
        metavar="PATH",
        help="checkpoint files or run directories (their latest checkpoint); one table for all",
    )
    evaluate.add_argument(
        "--all", action="store_true", help="every kept checkpoint of each run directory"
    )
    evaluate.add_argument(
        "--watch",
        metavar="RUN_DIR",
        help="evaluate each new checkpoint of a (running) run as it appears, until stopped",
    )
    evaluate.add_argument(
        "--episodes", type=int, help="episodes per target (default: the run's eval.episodes)"
    )
    evaluate.add_argument("--seed", type=int, help="seed of the first episode (default: the run's)")
    targets = evaluate.add_mutually_exclusive_group()
    targets.add_argument(
        "--targets", type=float, nargs="+", help="target returns (default: the run's)"
    )
    targets.add_argument(
        "--target-sweep",
        metavar="LOW:HIGH:N",
        help="N targets from LOW to HIGH: the return-conditioning curve, kept as a PNG in the run",
    )
    evaluate.add_argument(
        "--workers",
        type=int,
        default=0,
        help="environment processes stepping at once (default 0: all in this process)",
    )
    evaluate.add_argument(
        "--video",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="also render N episodes per target (default 1) to MP4 files in the run's videos/",
    )
    evaluate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    evaluate.add_argument("--json", action="store_true", help="print the records as JSON")
    evaluate.set_defaults(func=handlers.evaluate)


# Options whose value is a comma-separated list of numbers: "--seeds -1,2" would otherwise read
# "-1,2" as an option (argparse: "expected one argument") instead of reaching the range check.
NUMBER_LISTS = ("--seeds",)


def attach_number_lists(argv: list[str]) -> list[str]:
    """["--seeds", "-1,2"] -> ["--seeds=-1,2"]: a list that starts with a negative number stays
    the option's value."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] in NUMBER_LISTS and re.fullmatch(r"-\d[\d,\s+-]*", arg):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def main(argv: list[str] | None = None) -> int:
    from primal_dt.common.cpu import quiet_waits

    quiet_waits()  # before anything imports torch
    args = build_parser().parse_args(attach_number_lists(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except PrimalDTError as err:
        print(f"primal-dt: {err.prefix}: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # a read-only or full file system, a path through a file...
        print(f"primal-dt: error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("primal-dt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
