"""Benchmark: training steps per second and peak memory, vanilla DT against Primal-DT, at the DT
paper's size and at the Primal paper's size, measured side by side in one run.

    python scripts/bench_train.py                          # CPU
    python scripts/bench_train.py --device cuda --compile --write-readme

Each row times primal-dt's own training step (Trainer.train_step on a batch from its sampler,
the dataset resident on the device) on synthetic HalfCheetah-sized data (17 states, 6 actions,
1000-step episodes: speed does not depend on the values), in a fresh process so that its peak
memory is its own. Vanilla DT and Primal-DT differ only in model.primal_blocks (none / last).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_common import device_name, peak_memory, reset_peak_memory, run_isolated, synchronize
from readme_table import publish

from primal_dt.config import load_config, named_config_path
from primal_dt.data import Episode, TaskData
from primal_dt.tasks import Task
from primal_dt.train import Trainer

SIZES = {  # label -> (config file, its paper)
    "DT paper size (embed 128, 3 layers, 1 head)": "dt",
    "Primal paper size (embed 256, 3 layers, 4 heads)": "primal-dt",
}


def synthetic_data(episodes: int = 20, length: int = 1000) -> TaskData:
    rng = np.random.default_rng(0)
    return TaskData(
        task=Task("synthetic", (), None),
        episodes=[
            Episode(
                rng.standard_normal((length, 17), dtype=np.float32),
                rng.uniform(-1, 1, (length, 6)).astype(np.float32),
                rng.standard_normal(length, dtype=np.float32),
            )
            for _ in range(episodes)
        ],
        env_id="HalfCheetah-v5",
        env_kwargs={},
        max_episode_steps=length,
        reference=None,
        eval_targets=(),
    )


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    overrides = [
        f"model.primal_blocks={json.dumps(point['primal_blocks'])}",
        f"train.device={json.dumps(point['device'])}",
        f"train.compile={'true' if point['compile'] else 'false'}",
    ]
    config = load_config(named_config_path(point["config"]), overrides, task="halfcheetah-medium")
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer.create(config, synthetic_data(), Path(run_dir))
        device = trainer.device
        batch_size = config.train.batch_size
        baseline = reset_peak_memory(device)  # the model, optimizer and data are resident
        for _ in range(point["warmup"]):  # compile, kernel choice, allocator warm-up
            trainer.train_step(trainer.sampler.sample(batch_size))
        synchronize(device)
        start = time.perf_counter()
        for _ in range(point["steps"]):
            trainer.train_step(trainer.sampler.sample(batch_size))
        synchronize(device)
        seconds = time.perf_counter() - start
    return {"steps_per_sec": point["steps"] / seconds, "bytes": peak_memory(device, baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps (default: 100 CPU, 2000 CUDA)"
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd steps")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure_point(json.loads(args.point))))
        return
    device = torch.device(args.device)
    steps = args.steps or (2000 if device.type == "cuda" else 100)
    rows = []
    for label, config in SIZES.items():
        for compiled in (False, True) if args.compile else (False,):
            found = {}
            for name, blocks in (("DT", "none"), ("Primal-DT", "last")):
                point = {"config": config, "primal_blocks": blocks, "device": args.device,
                         "compile": compiled, "steps": steps,
                         "warmup": 30 if compiled else 10}  # fmt: skip
                found[name] = run_isolated(__file__, point)
                print(label, name, "compiled" if compiled else "eager", found[name], flush=True)
            dt, primal = found["DT"], found["Primal-DT"]
            mode = "torch.compile" if compiled else "eager"
            if "error" in dt or "error" in primal:
                rows.append(
                    f"| {label} | {mode} | {dt.get('error', '')} | {primal.get('error', '')} ||||"
                )
                continue
            rows.append(
                f"| {label} | {mode} | {dt['steps_per_sec']:.4g} | {primal['steps_per_sec']:.4g} "
                f"| {primal['steps_per_sec'] / dt['steps_per_sec']:.2f}x "
                f"| {dt['bytes'] / 2**20:.0f} | {primal['bytes'] / 2**20:.0f} |"
            )
    caption = (
        f"Training steps per second (batch 64, K 20, {steps} timed steps) and peak memory "
        f"(above the resident model and data"
        + ("; process peak resident size on CPU" if device.type == "cpu" else "")
        + f") on {device_name(device)}, torch {torch.__version__}:"
    )
    header = (
        "| size | mode | DT steps/s | Primal-DT steps/s | Primal-DT / DT | DT MiB "
        "| Primal-DT MiB |\n|---|---|---:|---:|---:|---:|---:|"
    )
    publish(f"bench_train_{device.type}", caption, header, rows, args.write_readme)


if __name__ == "__main__":
    main()
