"""Benchmark: training speed on a CPU shared with other processes, before and after primal-dt's
thread policy (primal_dt/common/cpu.py), measured side by side in one run.

    python scripts/bench_contention.py                   # the table, printed
    python scripts/bench_contention.py --write-docs    # and put into docs/benchmarks.md
    python scripts/bench_contention.py --quickstart      # the quick start's command, timed
    python scripts/bench_contention.py --policies before,passive,spin=1000,spin=3000
                                                         # OpenMP waits compared, to choose one

Each cell times primal-dt's training step (Trainer.train_step at the DT paper's size, on the
synthetic HalfCheetah-sized data of bench_train.py) in a fresh process, under one policy:

- before: torch's defaults: one thread per core, and OpenMP threads that spin while they wait
  (GNU OpenMP: 300,000 times before they sleep);
- after: primal-dt's policy (primal_dt/common/cpu.py): a short spin before sleeping
  (GOMP_SPINCOUNT, cpu.SPIN_COUNT), a thread count fixed for the whole run, and our own
  evaluation process at the lowest scheduling priority (cpu.yield_cpu);
- passive, spin=N: the after policy with other waits (OMP_WAIT_POLICY=PASSIVE: sleep at once;
  GOMP_SPINCOUNT=N), to compare;

beside one of four neighbours, started before the cell and stopped after it:

- (a) none;
- (b) a Python busy loop that keeps one core busy;
- (c) the evaluation service evaluating: primal-dt's own vectorised rollouts of a DT-size policy
  in HalfCheetah-v5, in a loop, with one thread and the policy's wait policy and priority, as the
  service runs;
- (d) another torch program with torch's default threads, multiplying matrices in a loop (as a
  second training, a sweep run or a test suite would). It is not ours, so its threads spin.

Rounds alternate over all cells, so that drift of the machine's speed affects every cell alike.
Ratios are each policy's steps/s over its own (a). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quickstart_command import quickstart_args

SCRIPT = Path(__file__).resolve()
POLICY_NAMES = {"before": "before (torch's defaults)", "after": "after (primal-dt's policy)"}
NEIGHBOURS = {
    "a": "(a) alone",
    "b": "(b) beside a one-core busy loop",
    "c": "(c) beside the evaluation service, evaluating",
    "d": "(d) beside another torch program (default threads)",
}
TARGETS = {"b": 0.45, "c": 0.45, "d": 0.35}
QUICKSTART = [*quickstart_args(), "--no-progress"]


WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS")


def environment(policy: str) -> dict[str, str]:
    """The environment a process of this policy starts with (before torch is imported): "before"
    torch's defaults, "after" the primal-dt command's, "passive" OMP_WAIT_POLICY=PASSIVE, "spin=N"
    GOMP_SPINCOUNT=N (the last two with the rest of the command's policy, to compare waits)."""
    from primal_dt.common.cpu import wait_settings

    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}
    if policy == "after":
        env.update(wait_settings(env))
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy.removeprefix("spin=")
    return env


def neighbour(kind: str, policy: str) -> subprocess.Popen | None:
    """Start the neighbour of a cell; it runs until killed."""
    if kind == "a":
        return None
    command = {
        "b": [sys.executable, "-c", "while True: pass"],
        "c": [sys.executable, str(SCRIPT), "--evaluator", policy],
        "d": [sys.executable, str(SCRIPT), "--matmul"],
    }[kind]
    env = environment(policy if kind == "c" else "before")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    time.sleep(6.0 if kind == "c" else 3.0)  # imported, environments made: at work
    return process


def measure_cell(policy: str, kind: str, steps: int, warmup: int) -> float:
    """Steps per second of one cell, in a fresh process."""
    other = neighbour(kind, policy)
    try:
        cell = json.dumps({"policy": policy, "kind": kind, "steps": steps, "warmup": warmup})
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--cell", cell],
            env=environment(policy),
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        if other is not None:
            other.kill()
            other.wait()
    return json.loads(result.stdout.strip().splitlines()[-1])["steps_per_sec"]


def run_cell(cell: dict) -> None:
    """The timed process of one cell (its environment already holds the policy's wait policy)."""
    import torch
    from bench_train import make_trainer, run_steps

    from primal_dt.common.cpu import training_threads

    point = {"config": "dt", "device": "cpu", "compile": None}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(point, "none", Path(run_dir))
        if cell["policy"] != "before":
            # What the trainer does, whatever runs beside it.
            torch.set_num_threads(training_threads(0))
        run_steps(trainer, cell["warmup"])
        start = time.perf_counter()
        run_steps(trainer, cell["steps"])
        seconds = time.perf_counter() - start
    print(
        json.dumps({"steps_per_sec": cell["steps"] / seconds, "threads": torch.get_num_threads()})
    )


def run_evaluator(policy: str) -> None:
    """Neighbour (c): the evaluation service's work, forever."""
    import torch
    from bench_eval import untrained_policy

    from primal_dt.common.cpu import yield_cpu
    from primal_dt.evaluation.rollout import make_jobs, rollout

    if policy != "before":
        yield_cpu()  # as the service process does
    torch.set_num_threads(1)
    policy, task = untrained_policy("dt", torch.device("cpu"))
    while True:
        rollout(policy, task, make_jobs((6000.0,), 10, seed=0))


def run_matmul() -> None:
    """Neighbour (d): a torch program with default threads, forever."""
    import torch

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    while True:
        a @ b


def quickstart(write: bool) -> None:
    """The quick start's command, timed alone (with its default precision, and forced to
    float32) and beside a busy loop (the current policy)."""
    import torch

    from primal_dt.common.device import resolve_precision

    default = resolve_precision("auto", torch.device("cpu"))
    cases = [
        ("a", default, []),
        ("a", "fp32", ["--set", 'train.precision="fp32"']),
        ("b", default, []),
    ]
    rows = []
    for kind, precision, extra in cases:
        other = neighbour(kind, "before")
        try:
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "primal_dt.cli",
                        *QUICKSTART,
                        *extra,
                        "--run-dir",
                        folder,
                    ],
                    env={**os.environ, "MINARI_DATASETS_PATH": str(Path(folder) / "minari")},
                    capture_output=True,
                    check=True,
                )
                seconds = time.perf_counter() - start
        finally:
            if other is not None:
                other.kill()
                other.wait()
        label = precision + (" (the default here)" if precision == default else " (forced)")
        rows.append((NEIGHBOURS[kind], label, seconds))
    alone = rows[0][2]
    table = [
        f"| {name} | {label} | {round(s) // 60} min {round(s) % 60} s | {alone / s:.2f}x |"
        for name, label, s in rows
    ]
    publish(
        "bench-quickstart",
        f"The quick start's command ({device_name()}):",
        "| neighbour | precision | wall time | speed against the default alone "
        "|\n|---|---|---:|---:|",
        table,
        write,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--evaluator", help=argparse.SUPPRESS)
    parser.add_argument("--matmul", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per cell (30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2)")
    parser.add_argument(
        "--policies",
        default="before,after",
        help="comma-separated: before, after, passive, spin=N (default: before,after)",
    )
    parser.add_argument(
        "--neighbours",
        default="b,c,d",
        help="comma-separated, of b, c, d, besides (a) (default: all)",
    )
    parser.add_argument("--quickstart", action="store_true", help="time the quick start's command")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.cell:
        return run_cell(json.loads(args.cell))
    if args.evaluator:
        return run_evaluator(args.evaluator)
    if args.matmul:
        return run_matmul()
    if args.quickstart:
        return quickstart(args.write_docs)
    policies = args.policies.split(",")
    kinds = ["a", *(kind for kind in args.neighbours.split(",") if kind != "a")]  # a: the base
    speeds: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for kind in kinds:
            for policy in policies if round_ % 2 == 0 else policies[::-1]:
                speed = measure_cell(policy, kind, args.steps, args.warmup)
                speeds.setdefault((policy, kind), []).append(speed)
                print(f"round {round_ + 1}: {policy}, {NEIGHBOURS[kind]}: {speed:.2f} steps/s")
    mean = {key: sum(values) / len(values) for key, values in speeds.items()}
    targets = "after" in policies
    rows = []
    for kind in kinds:
        name = NEIGHBOURS[kind]
        cells = [
            f"{mean[(p, kind)]:.2f} ({mean[(p, kind)] / mean[(p, 'a')]:.2f}x)" for p in policies
        ]
        target = [f">= {TARGETS[kind]:.2f}x" if kind in TARGETS else ""] if targets else []
        rows.append(f"| {' | '.join([name, *cells, *target])} |")
    idle = [f"{mean[(p, 'a')] / mean[(policies[0], 'a')]:.2f}x" for p in policies]
    idle += [""] if targets else []
    rows.append(f"| {' | '.join([f'(a) alone, against {policies[0]} alone', *idle])} |")
    caption = (
        f"Training steps/s at the DT paper's size (batch 64, K 20) on a shared CPU, {device_name()}; "
        f"{args.steps} timed steps per cell, mean of {args.rounds} alternating rounds; in "
        f"brackets, against the same policy alone:"
    )
    columns = ["neighbour", *(POLICY_NAMES.get(p, p) for p in policies)]
    columns += ["target (after)"] if targets else []
    header = f"| {' | '.join(columns)} |\n|---|{'---:|' * len(policies)}{'---|' if targets else ''}"
    publish("bench-contention", caption, header, rows, args.write_docs)


def device_name() -> str:
    import torch
    from bench_common import device_name as name

    return name(torch.device("cpu"))


def publish(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    from doc_tables import publish as put

    put(name, caption, header, rows, write)


if __name__ == "__main__":
    main()
