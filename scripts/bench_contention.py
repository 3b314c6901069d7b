"""Benchmark: training speed on a CPU shared with other processes, before and after primal-dt's
thread policy (primal_dt/common/cpu.py), measured side by side in one run.

    python scripts/bench_contention.py                   # the table, printed
    python scripts/bench_contention.py --write-readme    # and put into README.md
    python scripts/bench_contention.py --quickstart      # the README's first command, timed

Each cell times primal-dt's training step (Trainer.train_step at the DT paper's size, on the
synthetic HalfCheetah-sized data of bench_train.py) in a fresh process, under one of two policies:

- before: torch's defaults: one thread per core, and OpenMP threads that spin while they wait;
- after: primal-dt's policy: OpenMP threads that sleep while they wait (OMP_WAIT_POLICY=PASSIVE),
  a thread count fixed for the whole run, and our own evaluation process at the lowest scheduling
  priority (cpu.yield_cpu);

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

SCRIPT = Path(__file__).resolve()
POLICIES = ("before", "after")
NEIGHBOURS = {
    "a": "(a) alone",
    "b": "(b) beside a one-core busy loop",
    "c": "(c) beside the evaluation service, evaluating",
    "d": "(d) beside another torch program (default threads)",
}
TARGETS = {"b": 0.45, "c": 0.45, "d": 0.35}
QUICKSTART = ["train", "--env", "hopper-bundled", "--device", "cpu", "--steps", "1000",
              "--final-episodes", "20", "--set", "model.embed_dim=64", "--set",
              "model.primal_rank=16", "--set", "train.warmup_steps=100", "--no-progress"]  # fmt: skip


def environment(policy: str) -> dict[str, str]:
    """The environment a process of this policy starts with (before torch is imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy == "after":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
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
            [sys.executable, str(SCRIPT), "--cell", cell], env=environment(policy),
            capture_output=True, text=True, check=True,
        )  # fmt: skip
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
        if cell["policy"] == "after":
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

    if policy == "after":
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
    """The README's first command, timed alone and beside a busy loop (the current policy)."""
    rows = []
    for kind in ("a", "b"):
        other = neighbour(kind, "before")
        try:
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "primal_dt.cli", *QUICKSTART, "--run-dir", folder],
                    env={**os.environ, "MINARI_DATASETS_PATH": str(Path(folder) / "minari")},
                    capture_output=True, check=True,
                )  # fmt: skip
                seconds = time.perf_counter() - start
        finally:
            if other is not None:
                other.kill()
                other.wait()
        rows.append((NEIGHBOURS[kind], seconds))
    alone = rows[0][1]
    table = [
        f"| {name} | {s // 60:.0f} min {s % 60:.0f} s | {alone / s:.2f}x |" for name, s in rows
    ]
    publish("bench-quickstart", f"The README's first command ({device_name()}):",
            "| neighbour | wall time | speed against alone |\n|---|---:|---:|", table, write)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--evaluator", choices=POLICIES, help=argparse.SUPPRESS)
    parser.add_argument("--matmul", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per cell (30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2)")
    parser.add_argument("--quickstart", action="store_true", help="time the README's first command")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    if args.cell:
        return run_cell(json.loads(args.cell))
    if args.evaluator:
        return run_evaluator(args.evaluator)
    if args.matmul:
        return run_matmul()
    if args.quickstart:
        return quickstart(args.write_readme)
    speeds: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for kind in NEIGHBOURS:
            for policy in POLICIES if round_ % 2 == 0 else POLICIES[::-1]:
                speed = measure_cell(policy, kind, args.steps, args.warmup)
                speeds.setdefault((policy, kind), []).append(speed)
                print(f"round {round_ + 1}: {policy}, {NEIGHBOURS[kind]}: {speed:.2f} steps/s")
    mean = {key: sum(values) / len(values) for key, values in speeds.items()}
    rows = []
    for kind, name in NEIGHBOURS.items():
        cells = []
        for policy in POLICIES:
            ratio = mean[(policy, kind)] / mean[(policy, "a")]
            cells += [f"{mean[(policy, kind)]:.2f}", f"{ratio:.2f}x"]
        target = f">= {TARGETS[kind]:.2f}x" if kind in TARGETS else ""
        rows.append(f"| {name} | {' | '.join(cells)} | {target} |")
    caption = (
        f"Training steps/s at the DT paper's size (batch 64, K 20) on a shared CPU, {device_name()}; "
        f"{args.steps} timed steps per cell, mean of {args.rounds} alternating rounds:"
    )
    header = (
        "| neighbour | before: steps/s | before: vs alone | after: steps/s | after: vs alone "
        "| target (after) |\n|---|---:|---:|---:|---:|---|"
    )
    publish("bench-contention", caption, header, rows, args.write_readme)


def device_name() -> str:
    import torch
    from bench_common import device_name as name

    return name(torch.device("cpu"))


def publish(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    from readme_table import publish as put

    put(name, caption, header, rows, write)


if __name__ == "__main__":
    main()
