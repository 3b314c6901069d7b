"""Benchmark: the study's training step (configs/matched.toml, each attention kind in its last
block) in this checkout against an earlier commit's, measured side by side in one run.

    python scripts/bench_study.py                               # softmax and primal, against bd4bf56
    python scripts/bench_study.py --kinds all --write-docs      # every kind, into docs/benchmarks.md
    python scripts/bench_study.py --kinds softmax --threads 1 --precisions bf16 --rounds 3  # a quick look

The earlier commit is unpacked (git archive) into a temporary folder. Each code trains in worker
processes of its own, which import primal_dt from their checkout: the workers build every
measured trainer first (primal-dt's Trainer.train_step on bench_train.py's synthetic
HalfCheetah-sized data, the matched config with `train.threads`, `train.precision` and
`train.compile` set), then time steps when told. Rounds alternate between the codes and the
cells, so that a machine whose speed drifts slows both alike; only one worker computes at a time,
except in the parallel rows.

Two figures per cell:

- steps/s of one run with 1 or 2 threads (the step alone, in the trainer's own loop);
- the study's throughput on the machine's cores: training steps per hour of runs side by side as
  `sweep --parallel` runs them (one run per core, one thread each, all training at once), or
  one run on every core, whichever the row names.

The workers use the OpenMP waits of the `primal-dt` command (primal_dt/common/cpu.py).
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
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
BASELINE = "bd4bf56"  # the commit of issue 40's goal: the study's step before it was made faster


def start_worker(checkout: Path) -> subprocess.Popen:
    """A worker process importing primal_dt from `checkout` (its configs too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(SCRIPTS)])}
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=checkout,
    )


def ask(worker: subprocess.Popen, message: dict[str, Any]) -> None:
    assert worker.stdin is not None
    worker.stdin.write(json.dumps(message) + "\n")
    worker.stdin.flush()


def answer(worker: subprocess.Popen) -> dict[str, Any]:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line:
        sys.exit(f"a worker exited (code {worker.wait()}); its error is above")
    return json.loads(line)


def serve() -> None:
    """The worker: build trainers, then time steps, one JSON line in and one out per request."""
    from primal_dt.common.cpu import quiet_waits

    quiet_waits()
    import torch
    from bench_train import run_steps, synthetic_data

    from primal_dt.common.loading import load_config, named_config_path
    from primal_dt.training.launch import assemble

    trainers: dict[str, Any] = {}
    data = synthetic_data()
    with tempfile.TemporaryDirectory() as runs:
        for line in sys.stdin:
            request = json.loads(line)
            name = request["name"]
            if request["do"] == "build":
                cell = request["cell"]
                kinds = json.dumps(["softmax", "softmax", cell["kind"]])  # matched-<kind>
                overrides = [
                    f"model.attention={kinds}",
                    'train.device="cpu"',
                    f'train.precision="{cell["precision"]}"',
                    f"train.threads={cell['threads']}",
                    f"train.compile={str(cell['compile']).lower()}",
                ]
                config = load_config(
                    named_config_path("matched"), overrides, task="halfcheetah-medium"
                )
                start = time.perf_counter()
                trainer = assemble(config, data, Path(runs) / str(len(trainers)))
                trainers[name] = trainer
                run_steps(trainer, request["warmup"])
                print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
            else:
                trainer = trainers[name]
                torch.set_num_threads(request["threads"])
                start = time.perf_counter()
                run_steps(trainer, request["steps"])
                print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


class Cell(dict):
    """What one measured trainer is: kind, precision, threads, compile."""

    @property
    def name(self) -> str:
        mode = ", compiled" if self["compile"] else ""
        return f"{self['kind']} {self['precision']} {self['threads']}t{mode}"


def baseline_checkout(revision: str, folder: Path) -> Path:
    """The tree of `revision` unpacked into folder."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"git archive {revision} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def measure(args: argparse.Namespace, checkouts: dict[str, Path]) -> dict[str, dict[str, float]]:
    """{code: {cell or parallel-cell name: steps/s}}, in alternating rounds."""
    cores = len(os.sched_getaffinity(0))
    cells = [
        Cell(kind=kind, precision=precision, threads=threads, compile=compiled)
        for kind in args.kinds
        for precision in args.precisions
        for compiled in args.compile
        for threads in args.threads
    ]
    # One worker per core for each code: the first times the single runs, all of them the parallel ones.
    workers = {code: [start_worker(path) for _ in range(cores)] for code, path in checkouts.items()}
    built: dict[str, float] = {}
    for code, pool in workers.items():
        for cell in cells:
            for index, worker in enumerate(pool):
                if index and cell["threads"] != 1:
                    continue  # the parallel rows run one-thread runs side by side
                ask(worker, {"do": "build", "name": cell.name, "cell": cell, "warmup": args.warmup})
            for index, worker in enumerate(pool):
                if index == 0 or cell["threads"] == 1:
                    built[f"{code} {cell.name}"] = answer(worker)["seconds"]
    seconds: dict[str, dict[str, float]] = {code: {} for code in workers}
    for round_ in range(args.rounds):
        for cell in cells:
            for code, pool in workers.items():
                ask(
                    pool[0],
                    {
                        "do": "time",
                        "name": cell.name,
                        "steps": args.steps,
                        "threads": cell["threads"],
                    },
                )
                took = answer(pool[0])["seconds"]
                seconds[code][cell.name] = seconds[code].get(cell.name, 0.0) + took
                if cell["threads"] != 1 or cores == 1:
                    continue
                start = time.perf_counter()  # parallel: every worker trains at once
                for worker in pool:
                    ask(
                        worker, {"do": "time", "name": cell.name, "steps": args.steps, "threads": 1}
                    )
                for worker in pool:
                    answer(worker)
                parallel = f"{cell.name} parallel x{cores}"
                took = (time.perf_counter() - start) / cores  # seconds per step of the study
                seconds[code][parallel] = seconds[code].get(parallel, 0.0) + took
        print(f"round {round_ + 1} of {args.rounds}", file=sys.stderr, flush=True)
    for pool in workers.values():
        for worker in pool:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
    steps = args.steps * args.rounds
    return {code: {name: steps / s for name, s in timed.items()} for code, timed in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit (default {BASELINE})")
    parser.add_argument("--kinds", default="softmax,primal", help="kinds, or all")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--compile", default="false", help="false, true, or false,true")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.worker:
        serve()
        return
    from primal_dt.method.registry import ATTENTIONS

    args.kinds = list(ATTENTIONS) if args.kinds == "all" else args.kinds.split(",")
    args.precisions = args.precisions.split(",")
    args.threads = [int(t) for t in args.threads.split(",")]
    args.compile = [value == "true" for value in args.compile.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        checkouts = {"now": ROOT, args.baseline: baseline_checkout(args.baseline, Path(folder))}
        found = measure(args, checkouts)
    print(json.dumps(found, indent=1))
    publish_table(found, args)


def publish_table(found: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    """Each cell's steps/s now and at the baseline, and their ratio, into docs/benchmarks.md."""
    import platform

    import torch
    from doc_tables import publish

    now, before = found["now"], found[args.baseline]
    rows = [
        f"| {name} | {now[name]:.3g} | {before[name]:.3g} | {now[name] / before[name]:.2f}x |"
        for name in now
    ]
    caption = (
        f"The matched config's training step (batch 64, K 20; kind in the last block, precision, "
        f"threads; parallel: one run per core, one thread each, steps/s of the whole study) now "
        f"against {args.baseline}, {args.rounds} alternating rounds of {args.steps} steps, on a "
        f"{len(os.sched_getaffinity(0))}-core CPU ({platform.machine()}), torch {torch.__version__}:"
    )
    header = (
        f"| cell | now, steps/s | {args.baseline}, steps/s | now / before |\n|---|---:|---:|---:|"
    )
    publish("bench_study_cpu", caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
