"""Benchmark: training steps per second and peak memory, vanilla DT against Primal-DT, at the DT
paper's size and at the Primal paper's size, measured side by side in one run.

    python scripts/bench_train.py                          # CPU
    python scripts/bench_train.py --device cuda --compile reduce-overhead --write-readme

Each row times primal-dt's own training step (Trainer.train_step on a batch from its sampler,
the dataset resident on the device) on synthetic HalfCheetah-sized data (17 states, 6 actions,
1000-step episodes: speed does not depend on the values). Vanilla DT and Primal-DT differ only in
model.primal_blocks (none / last). The models train in one process, in alternating rounds, so
that a machine that slows down or speeds up during the run affects all alike. Peak memory comes
from CUDA's allocator in the same run, or on CPU from a fresh process per model (a process has
only one peak resident size). The processes that time run with the OpenMP wait setting the
`primal-dt` command uses (primal_dt/common/cpu.py), so the figures are those a user gets.

A second table, eager only, sets the training step against the same model computed at every token
(forward(..., every_token=True): the last block at all 3K tokens instead of the K state tokens the
loss reads, and a_K kept): its arithmetic per step (torch.utils.flop_counter, forward and backward:
the matrix products and attention; element-wise work is not counted) and its speed, timed in the
same alternating rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_common import (
    device_name,
    measure_side_by_side,
    mebibytes,
    peak_memory,
    reset_peak_memory,
    time_alternately,
)
from readme_table import publish, publish_so_far
from torch.utils.flop_counter import FlopCounterMode

from primal_dt.common.config import COMPILE_MODES, load_config, named_config_path
from primal_dt.common.cpu import quiet_waits
from primal_dt.data.episodes import Episode, TaskData
from primal_dt.data.tasks import Task
from primal_dt.training.launch import assemble
from primal_dt.training.trainer import Trainer

SIZES = {  # label -> (config file, its paper; overrides)
    "DT paper size (embed 128, 3 layers, 1 head)": ("dt", ()),
    "Primal paper size (embed 256, 3 layers, 4 heads)": ("primal-dt", ()),
}
# --tiny (scripts/gpu_check.sh --dry-run): the same code paths at a size a CPU compiles quickly.
TINY_SIZES = {
    "tiny (embed 32, 2 layers, 2 heads)": (
        "primal-dt",
        (
            "model.embed_dim=32",
            "model.n_layer=2",
            "model.n_head=2",
            "model.primal_rank=8",
            "train.batch_size=8",
        ),
    ),  # fmt: skip
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


MODELS = {"DT": "none", "Primal-DT": "last"}  # name -> model.primal_blocks
EVERY_TOKEN = ", every token"  # suffix of a model's name: computed without the cut


def make_trainer(
    point: dict[str, Any], primal_blocks: str, run_dir: Path, every_token: bool = False
) -> Trainer:
    overrides = [
        f"model.primal_blocks={json.dumps(primal_blocks)}",
        f"train.device={json.dumps(point['device'])}",
        f"train.compile={'true' if point['compile'] else 'false'}",
        f"train.compile_mode={json.dumps(point['compile'] or 'default')}",
    ]
    overrides += point.get("overrides", [])
    config = load_config(named_config_path(point["config"]), overrides, task="halfcheetah-medium")
    trainer = assemble(config, synthetic_data(), run_dir)
    if every_token:  # the reference the cut is measured against
        trainer.forward_model = functools.partial(trainer.forward_model, every_token=True)
    return trainer


def step_flops(trainer: Trainer) -> int:
    """Floating-point operations of one training step (forward and backward), as torch counts."""
    batch = trainer.sampler.sample(trainer.config.train.batch_size)
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(batch)
    return counter.get_total_flops()


def run_steps(trainer: Trainer, steps: int) -> None:
    batch_size = trainer.config.train.batch_size
    for _ in range(steps):
        trainer.train_step(trainer.sampler.sample(batch_size))


def measure_speed(point: dict[str, Any]) -> dict[str, Any]:
    """Steps per second of every model, timed in alternating rounds within this process. On CUDA
    also each model's peak memory above everything resident (all models, optimizers, data)."""
    per_round = max(1, point["steps"] // point["rounds"])
    with tempfile.TemporaryDirectory() as run_dir:
        trainers = {
            name: make_trainer(point, blocks, Path(run_dir) / name, every_token)
            for name, (blocks, every_token) in point["models"].items()
        }
        for trainer in trainers.values():
            run_steps(trainer, point["warmup"])  # compile, kernel choice, allocator warm-up
        runs = {
            name: functools.partial(run_steps, trainer, per_round)
            for name, trainer in trainers.items()
        }
        device = torch.device(point["device"])
        seconds, memory = time_alternately(runs, point["rounds"], device)
        flops = {} if point["compile"] else {
            f"{name} flops": step_flops(trainer) for name, trainer in trainers.items()
        }  # fmt: skip
    speeds = {name: per_round * point["rounds"] / sum(seconds[name]) for name in runs}
    return {**speeds, **memory, **flops}


def measure_memory(point: dict[str, Any]) -> dict[str, Any]:
    """Peak resident size of one model's training steps in a process of its own (CPU), above the
    resident model, optimizer and data."""
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(point, point["primal_blocks"], Path(run_dir))
        baseline = reset_peak_memory(trainer.device)
        run_steps(trainer, point["warmup"])
        return {"bytes": peak_memory(trainer.device, baseline)}


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    return measure_speed(point) if point["measure"] == "speed" else measure_memory(point)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps (default: 100 CPU, 2000 CUDA)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    parser.add_argument(
        "--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
        help="also time torch.compile'd steps, in this mode (default: default)",
    )  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (dry runs)")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure_point(json.loads(args.point))))
        return
    quiet_waits()  # the command's OpenMP waits, for the processes that time
    device = torch.device(args.device)
    steps = args.steps or (2000 if device.type == "cuda" else 100)
    batch = 8 if args.tiny else 64
    caption = (
        f"Training steps per second (batch {batch}, K 20, {steps} timed steps "
        f"each, in {args.rounds} alternating rounds) and peak memory "
        f"(above the resident model and data"
        + ("; process peak resident size on CPU" if device.type == "cpu" else "")
        + f") on {device_name(device)}, torch {torch.__version__}:"
    )
    header = (
        "| size | mode | DT steps/s | Primal-DT steps/s | Primal-DT / DT | DT MiB "
        "| Primal-DT MiB |\n|---|---|---:|---:|---:|---:|---:|"
    )
    cut_caption = (
        f"The training step against the same model computed at every token (eager; batch "
        f"{batch}, K 20; GFLOP per step, forward and backward, as torch.utils.flop_counter "
        f"counts them; steps/s from the same alternating rounds) on {device_name(device)}:"
    )
    cut_header = (
        "| size | model | GFLOP, every token | GFLOP, trained | arithmetic | steps/s, every token "
        "| steps/s, trained | speed-up |\n|---|---|---:|---:|---:|---:|---:|---:|"
    )
    rows, cut_rows = [], []
    sizes = (TINY_SIZES if args.tiny else SIZES).items()
    # Eager at every size first, then compiled (slow to compile): what is cut short comes last.
    for compiled in (None, args.compile) if args.compile else (None,):
        for label, (config, overrides) in sizes:
            models = {name: (blocks, False) for name, blocks in MODELS.items()}
            if not compiled:
                models |= {name + EVERY_TOKEN: (blocks, True) for name, blocks in MODELS.items()}
            point = {"config": config, "overrides": list(overrides), "device": args.device,
                     "compile": compiled, "warmup": 30 if compiled else 10}  # fmt: skip
            found = measure_side_by_side(
                __file__, {**point, "steps": steps, "rounds": args.rounds, "models": models},
                {name: {"primal_blocks": blocks} for name, blocks in MODELS.items()},
            )  # fmt: skip
            mode = f"torch.compile ({compiled})" if compiled else "eager"
            print(label, mode, found, flush=True)
            if "error" in found:
                rows.append(f"| {label} | {mode} | {found['error']} |||||")
            else:
                dt, primal = found["DT"], found["Primal-DT"]
                rows.append(
                    f"| {label} | {mode} | {dt:.4g} | {primal:.4g} | {primal / dt:.2f}x "
                    f"| {mebibytes(found['DT bytes'])} | {mebibytes(found['Primal-DT bytes'])} |"
                )
            publish_so_far(f"bench_train_{device.type}", caption, header, rows, args.write_readme)
            if not compiled:
                if "error" in found:
                    cut_rows.append(f"| {label} | | {found['error']} ||||||")
                else:
                    cut_rows += [cut_row(label, name, found) for name in MODELS]
                publish_so_far(
                    f"bench_cut_{device.type}", cut_caption, cut_header, cut_rows, args.write_readme
                )
    publish(f"bench_train_{device.type}", caption, header, rows, args.write_readme)
    publish(f"bench_cut_{device.type}", cut_caption, cut_header, cut_rows, args.write_readme)


def cut_row(label: str, name: str, found: dict[str, Any]) -> str:
    """A row of the cut table: one model, computed at every token and as it trains."""
    full, cut = found[name + EVERY_TOKEN + " flops"] / 1e9, found[name + " flops"] / 1e9
    full_speed, cut_speed = found[name + EVERY_TOKEN], found[name]
    return (
        f"| {label} | {name} | {full:.2f} | {cut:.2f} | {cut / full:.2f}x | {full_speed:.4g} "
        f"| {cut_speed:.4g} | {cut_speed / full_speed:.2f}x |"
    )


if __name__ == "__main__":
    main()
