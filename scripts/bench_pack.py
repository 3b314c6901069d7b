"""Benchmark: run-steps per second (steps/s x runs) of packs of runs (training/pack.py) against a
lone run, eager and with the whole step compiled (train.compile), at the DT paper's size and at the
Primal paper's, with peak memory; and today's model-only compiled step (torch.compile of the
model alone, the optimiser and the loss eager around it) beside them.

    python scripts/bench_pack.py                                     # CPU, every row
    python scripts/bench_pack.py --device cuda --write-docs          # on a GPU
    python scripts/bench_pack.py --device cuda --sizes dt --packs 32 --modes compiled --steps 1000

Every point trains Primal-DT (configs/primal-dt.toml's blocks, softmax, softmax, Primal) in bf16
on synthetic HalfCheetah-sized data (bench_train.py's), each in a fresh process, so that its peak
memory is its own (CUDA's allocator, or the CPU process's peak resident size). A point times
--steps steps after --warmup steps (which compile, where it compiles); run-steps/s counts every
run's steps. A pack of R runs is R runs of seeds 0..R-1; a pack of 1 is the lone Trainer's own
step (eager, or its WholeStep with train.compile).

On a CPU, --parallel-baseline adds what `sweep --parallel 2` gets from the same cores: two lone
runs in two processes of one thread each, side by side, their run-steps/s added, against a pack
of two in one process.
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

import torch
from bench_common import (
    device_name,
    mebibytes,
    peak_memory,
    reset_peak_memory,
    run_isolated,
    synchronize,
)
from bench_train import SIZES, TINY_SIZES, synthetic_data
from doc_tables import publish, publish_so_far

from primal_dt.common.cpu import quiet_waits
from primal_dt.common.loading import load_config, named_config_path
from primal_dt.training.compiling import compile_model
from primal_dt.training.launch import assemble
from primal_dt.training.pack import PackedModel
from primal_dt.training.trainer import Trainer

SIZE_KEYS = {"dt": 0, "primal": 1}  # --sizes: the rows of bench_train.SIZES
MODES = ("eager", "compiled", "model-compiled")  # model-compiled: today's, lone runs only
PRIMAL_LAST = 'model.attention=["softmax", "softmax", "primal"]'


def trainers(point: dict[str, Any], root: Path) -> list[Trainer]:
    """The point's runs, assembled as launch.py assembles them (seeds 0..R-1)."""
    sizes = TINY_SIZES if point["tiny"] else SIZES
    label = list(sizes)[0 if point["tiny"] else SIZE_KEYS[point["size"]]]
    config_name, extra = sizes[label]
    compiled = point["mode"] == "compiled"
    mode = "reduce-overhead" if point["device"].startswith("cuda") else "default"
    overrides = [
        *extra,
        PRIMAL_LAST,
        'train.precision="bf16"',
        f"train.device={json.dumps(point['device'])}",
        f"train.compile={'true' if compiled else 'false'}",
        f"train.compile_mode={json.dumps(mode)}",
    ]
    data = synthetic_data()
    runs = []
    for seed in range(point["pack"]):
        config = load_config(named_config_path(config_name), [*overrides, f"train.seed={seed}"])
        runs.append(assemble(config, data, root / f"s{seed}"))
    if point["mode"] == "model-compiled":  # the model alone compiled, the rest of the step eager
        model = runs[0].model
        model.forward = compile_model(model.forward, mode, runs[0].device)  # type: ignore[method-assign,arg-type]
    return runs


def measure(point: dict[str, Any]) -> dict[str, Any]:
    """Run-steps/s and peak memory of one point (in this fresh process)."""
    with tempfile.TemporaryDirectory() as folder:
        runs = trainers(point, Path(folder))
        device = runs[0].device
        baseline = reset_peak_memory(device)
        if len(runs) == 1:
            run = runs[0]
            batch_size = run.config.train.batch_size

            def step() -> None:
                run.train_step(run.sampler.sample(batch_size))
                run.step += 1
        else:
            packed = PackedModel(runs, [torch.get_rng_state() for _ in runs])

            def step() -> None:
                packed.step(runs[0].step)
                for run in runs:
                    run.step += 1

        start = time.perf_counter()
        for _ in range(point["warmup"]):
            step()
        synchronize(device)
        first = time.perf_counter() - start
        start, steps = time.perf_counter(), 0
        while steps < point["steps"] and (steps < 3 or time.perf_counter() - start < point["cap"]):
            step()
            steps += 1
            if steps % 50 == 0:
                synchronize(device)  # the cap reads the clock: let it see the device's pace
        synchronize(device)
        seconds = time.perf_counter() - start
        return {
            "run_steps_per_sec": len(runs) * steps / seconds,
            "steps": steps,
            "warmup_sec": first,
            "bytes": peak_memory(device, baseline),
            "device": device_name(device),
        }


def parallel_baseline(point: dict[str, Any]) -> float:
    """Run-steps/s of two lone runs in two one-thread processes at once (sweep --parallel 2)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    lone = {**point, "pack": 1, "mode": "eager"}
    command = [sys.executable, __file__, "--point", json.dumps(lone)]
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [process.communicate()[0] for process in processes]
    if any(process.returncode for process in processes):
        raise SystemExit("a --parallel baseline process failed")
    rates = [json.loads(output.strip().splitlines()[-1])["run_steps_per_sec"] for output in outputs]
    return sum(rates)


def packs_by_size(text: str) -> dict[str, list[int]]:
    """'1,8' -> {'': [1, 8]}; 'dt:1,8;primal:1' -> {'dt': [1, 8], 'primal': [1]}."""
    found = {}
    for part in text.split(";"):
        size, _, counts = part.rpartition(":")
        found[size] = [int(count) for count in counts.split(",")]
    return found


def row(size: str, pack: int, mode: str, found: dict[str, Any], lone: float | None) -> str:
    if "error" in found:
        return f"| {size} | {pack} | {mode} | {found['error']} | | | |"
    rate = found["run_steps_per_sec"]
    ratio = f"{rate / lone:.2f}" if lone else "1.00"
    return (
        f"| {size} | {pack} | {mode} | {rate:.3g} | {rate / pack:.3g} | {ratio} | "
        f"{mebibytes(found['bytes'])} |"
    )


def main() -> None:
    quiet_waits()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="dt,primal", help="dt, primal or both (dt,primal)")
    parser.add_argument(
        "--packs",
        default="1,8,32,128",
        help="runs per pack (1,8,32,128), or per size: 'dt:1,8,32;primal:1,8' (what fits memory)",
    )
    parser.add_argument("--modes", default="eager,compiled,model-compiled")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per point (5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    parser.add_argument(
        "--cap",
        type=float,
        default=60.0,
        help="seconds of timed steps per point at most (at least 3 steps; default 60)",
    )
    parser.add_argument("--parallel-baseline", action="store_true", help="CPU: --parallel 2 too")
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (dry runs)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure(json.loads(args.point))))
        return
    packs = packs_by_size(args.packs)
    modes = args.modes.split(",")
    sizes = ["tiny"] if args.tiny else args.sizes.split(",")
    header = (
        "| size | runs per pack | step | run-steps/s | steps/s per run | against one run "
        "eager | peak memory (MiB) |\n|---|---:|---|---:|---:|---:|---:|"
    )
    rows: list[str] = []
    device = None
    caption = (
        f"Packs: run-steps per second (steps/s x runs) of Primal-DT's bf16 training step, "
        f"batch 64, K 20, {args.steps} timed steps after {args.warmup} (or as many as "
        f"{args.cap:g} s allowed, at least 3)"
    )
    marker = f"bench-pack-{'cuda' if args.device.startswith('cuda') else 'cpu'}"
    for size in sizes:
        base = {
            "device": args.device,
            "size": size,
            "tiny": args.tiny,
            "steps": args.steps,
            "warmup": args.warmup,
            "cap": args.cap,
        }
        lone = None
        for pack in packs.get(size, packs.get("", [])):
            for mode in modes:
                if mode == "model-compiled" and pack != 1:
                    continue
                found = run_isolated(__file__, {**base, "pack": pack, "mode": mode})
                device = found.get("device", device)
                if pack == 1 and mode == "eager" and "error" not in found:
                    lone = found["run_steps_per_sec"]
                rows.append(row(size, pack, mode, found, lone))
                print(rows[-1], flush=True)
                publish_so_far(marker, caption, header, rows, args.write_docs)
        if args.parallel_baseline and args.device == "cpu":
            rate = parallel_baseline({**base, "tiny": args.tiny})
            ratio = f"{rate / lone:.2f}" if lone else ""
            rows.append(
                f"| {size} | 2 processes | sweep --parallel 2 | {rate:.3g} | "
                f"{rate / 2:.3g} | {ratio} | |"
            )
            packed = run_isolated(__file__, {**base, "pack": 2, "mode": "eager"})
            rows.append(row(size, 2, "eager, one process", packed, lone))
            print(*rows[-2:], sep="\n", flush=True)
    caption += f", on {device}, torch {torch.__version__}" if device else ""
    publish(marker, caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
