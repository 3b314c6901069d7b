"""Benchmark: environment steps per second of primal-dt's vectorised evaluator against the
reference implementations' sequential loop (one episode after another, one model call per step
with a batch of one), same policy, same HalfCheetah-v5 episodes, measured side by side in one run.

    python scripts/bench_eval.py                      # 100 episodes, DT and Primal-DT sizes, CPU
    python scripts/bench_eval.py --ckpt RUN_DIR       # a trained HalfCheetah checkpoint instead
    python scripts/bench_eval.py --workers 2 --write-docs

Without --ckpt each policy is an untrained Decision Transformer of the given config's size for
HalfCheetah-v5: speed does not depend on the weights, and HalfCheetah episodes always last 1000
steps, so every evaluator does the same work per step. The sequential loop runs the first
--sequential-episodes of the same episodes (its rate per step does not depend on how many), and
every evaluator's returns on those episodes are compared with it: the table gives the largest
relative difference. The vectorised evaluator acts in float32 and, on a CPU, in bf16 autocast
(what train.precision "auto" resolves to on a CPU with a bf16 unit), each row its own timing.
(They are not bit-identical: a batched model call sums in another order
than a batch of one, and 1000 chaotic HalfCheetah steps grow float32 rounding into fractions of
a percent. tests/test_evaluation.py checks the two equal on short episodes.)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_common import device_name
from bench_train import PRECISIONS
from doc_tables import publish

from primal_dt.common.loading import load_config, named_config_path
from primal_dt.data.tasks import quiet_mujoco_warnings
from primal_dt.evaluation.rollout import (
    EvalOptions,
    Job,
    Policy,
    load_policy,
    make_jobs,
    plan_evaluation,
    rollout,
)
from primal_dt.evaluation.sequential import sequential_rollout
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.snapshots import TaskInfo, read_snapshot


def untrained_policy(spec: str, device: torch.device) -> tuple[Policy, TaskInfo]:
    """spec: a config name, optionally with overrides: 'primal-dt+model.embed_dim=64+...'."""
    torch.manual_seed(0)
    name, *overrides = spec.split("+")
    config = load_config(named_config_path(name), overrides, task="halfcheetah-medium")
    model = DecisionTransformer(config.model, 17, 6, 1000).to(device)
    policy = Policy(
        model,
        torch.zeros(17, device=device),
        torch.ones(17, device=device),
        config.train.return_scale,
        device,
    )
    return policy, TaskInfo("untrained", (), "HalfCheetah-v5", {}, 1000, (6000.0,), None)


def size_label(spec: str) -> str:
    """'dt' -> 'embed 128, 1 head, softmax (dt)'."""
    name, *overrides = spec.split("+")
    m = load_config(named_config_path(name), overrides, task="halfcheetah-medium").model
    attention = "Primal last block" if m.blocks_of("primal") else "softmax"
    heads = f"{m.n_head} head" + ("s" if m.n_head > 1 else "")
    return f"embed {m.embed_dim}, {heads}, {attention} ({name})"


EpisodeRunner = Callable[[list[Job]], tuple[np.ndarray, np.ndarray]]


def measure(label: str, policy: Policy, task: TaskInfo, args: argparse.Namespace) -> list[str]:
    """Rows of every evaluator of `policy`; the vectorised ones in each precision of the device,
    the sequential reference in float32."""
    jobs = make_jobs(task.eval_targets[:1], args.episodes, seed=0)
    fp32 = dataclasses.replace(policy, precision="fp32")
    evaluators: dict[str, tuple[EpisodeRunner, list[Job]]] = {
        "sequential, batch 1, fp32": (
            lambda j: sequential_rollout(fp32, task, j),
            jobs[: args.sequential_episodes],
        ),
    }
    for precision in PRECISIONS[policy.device.type]:
        acting = dataclasses.replace(policy, precision=precision)
        evaluators[f"vectorised, SyncVectorEnv, {precision}"] = (
            lambda j, acting=acting: rollout(acting, task, j),
            jobs,
        )
        if args.workers > 1:
            evaluators[f"vectorised, AsyncVectorEnv, {args.workers} workers, {precision}"] = (
                lambda j, acting=acting: rollout(acting, task, j, workers=args.workers),
                jobs,
            )
    rows, base_rate, reference = [], None, None
    for name, (evaluate, subset) in evaluators.items():
        start = time.perf_counter()
        returns, lengths = evaluate(subset)
        seconds = time.perf_counter() - start
        rate = lengths.sum() / seconds
        if reference is None:
            reference, base_rate = returns, rate
        n = len(reference)
        difference = np.max(np.abs(returns[:n] - reference) / np.abs(reference))
        print(
            f"{label}, {name}: {lengths.sum()} steps in {seconds:.1f} s, returns differ by "
            f"{difference:.2%} at most"
        )
        rows.append(
            f"| {label} | {name} | {len(subset)} | {seconds:.1f} | {rate:.0f} "
            f"| {rate / base_rate:.1f}x | {difference:.2%} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", help="a HalfCheetah checkpoint or run directory")
    parser.add_argument(
        "--configs",
        default="primal-dt+model.embed_dim=64+model.attention_settings.primal.rank=16,dt,primal-dt",
        help="model sizes without --ckpt: config names, each with +key=value overrides",
    )
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--sequential-episodes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=0, help="> 1 adds an AsyncVectorEnv row")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    quiet_mujoco_warnings()
    device = torch.device(args.device)
    if args.ckpt:
        snapshot = read_snapshot(args.ckpt)
        targets = plan_evaluation(snapshot, EvalOptions()).targets  # the run's, as it evaluates
        task = dataclasses.replace(snapshot.task, eval_targets=targets)
        policies = {args.ckpt: (load_policy(snapshot, device, args.ckpt), task)}
    else:
        policies = {
            size_label(spec): untrained_policy(spec, device) for spec in args.configs.split(",")
        }
    rows = []
    for label, (policy, task) in policies.items():
        rows += measure(label, policy, task, args)
    caption = (
        f"{args.episodes} HalfCheetah-v5 episodes of 1000 steps on {device_name(device)}, "
        f"torch {torch.__version__}; the sequential loop ran the first "
        f"{args.sequential_episodes} of them:"
    )
    header = (
        "| model | evaluator | episodes | seconds | env steps / s | speed-up "
        "| return difference |\n|---|---|---:|---:|---:|---:|---:|"
    )
    publish(f"bench_eval_{device.type}", caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
