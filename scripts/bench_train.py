"""Benchmark: training steps per second and peak memory, vanilla DT against Primal-DT, at the DT
paper's size and at the Primal paper's size, measured side by side in one run.

    python scripts/bench_train.py                          # CPU
    python scripts/bench_train.py --device cuda --compile reduce-overhead --write-docs

Each row times primal-dt's own training step (Trainer.train_step on a batch from its sampler,
the dataset resident on the device) on synthetic HalfCheetah-sized data (17 states, 6 actions,
1000-step episodes: speed does not depend on the values). Vanilla DT and Primal-DT differ only in
model.attention (softmax everywhere, or Primal in the last block). The models train in one
process, in alternating rounds, so that a machine that slows down or speeds up during the run
affects all alike. Peak memory comes from CUDA's allocator in the same run, or on CPU from a fresh process per model (a process has
only one peak resident size). The processes that time run with the OpenMP wait setting the
`primal-dt` command uses (primal_dt/common/cpu.py), so the figures are those a user gets.

On a CPU each model trains in float32 and in bf16 autocast (train.precision "fp32" and "bf16") in
the same rounds; a precision table sets them side by side, with the bf16 step's arithmetic rate
(GFLOP/s) against the rate of its own matrix products alone: every mm, addmm and bmm that one
step calls, replayed on tensors of the same shapes, strides and dtypes (what the CPU's bf16 unit
does at the step's shapes). On CUDA the models train in bf16, what "auto" resolves to there.

A cut table, eager and in the default precision only, sets the training step against the same model computed at every token
(forward(..., every_token=True): the last block at all 3K tokens instead of the K state tokens the
loss reads, and a_K kept): its arithmetic per step (torch.utils.flop_counter, forward and backward:
the matrix products and attention; element-wise work is not counted) and its speed, timed in the
same alternating rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import tempfile
from collections.abc import Callable
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
from bench_flops import matrix_product_rate, step_flops
from doc_tables import publish, publish_so_far

from primal_dt.common.config import COMPILE_MODES
from primal_dt.common.cpu import quiet_waits
from primal_dt.common.loading import load_config, named_config_path
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
    "tiny (embed 32, 3 layers, 2 heads)": (
        "primal-dt",
        (
            "model.embed_dim=32",
            "model.n_layer=3",
            "model.n_head=2",
            "model.attention_settings.primal.rank=8",
            "train.batch_size=8",
        ),
    ),
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


MODELS = {"DT": "none", "Primal-DT": "last"}  # name -> its blocks (block_kinds)
EVERY_TOKEN = ", every token"  # suffix of a model's name: computed without the cut
PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("bf16",)}  # timed per device type
DEFAULT_PRECISION = "bf16"  # what "auto" resolves to on the CPUs this runs on, and on CUDA


def model_name(name: str, precision: str, every_token: bool = False) -> str:
    return f"{name} {precision}" + (EVERY_TOKEN if every_token else "")


def block_kinds(blocks: str, n_layer: int = 3) -> str | list[str]:
    """A model's attention: which blocks are Primal, softmax elsewhere (none, last, all), or the
    name of an attention kind for every block (method/registry.py)."""
    if blocks == "last":
        return ["softmax"] * (n_layer - 1) + ["primal"]
    return {"none": "softmax", "all": "primal"}.get(blocks, blocks)


def block_overrides(blocks: str, overrides: list[str]) -> list[str]:
    """The model's attention as an override, for the model.n_layer the overrides give (3 without),
    and the given overrides that apply to it (a kind's settings only where a block has that kind:
    the loader refuses settings no block uses)."""
    layers = [int(o.partition("=")[2]) for o in overrides if o.startswith("model.n_layer=")]
    kinds, own = block_kinds(blocks, (layers or [3])[-1]), "model.attention_settings."
    named = [kinds] if isinstance(kinds, str) else kinds
    kept = [o for o in overrides if not o.startswith(own) or o.split(".")[2] in named]
    return [f"model.attention={json.dumps(kinds)}", *kept]


def make_trainer(
    point: dict[str, Any],
    blocks: str,
    run_dir: Path,
    every_token: bool = False,
    precision: str = DEFAULT_PRECISION,
) -> Trainer:
    overrides = [
        f"train.precision={json.dumps(precision)}",
        f"train.device={json.dumps(point['device'])}",
        f"train.compile={'true' if point['compile'] else 'false'}",
        f"train.compile_mode={json.dumps(point['compile'] or 'default')}",
        *block_overrides(blocks, point.get("overrides", [])),
    ]
    config = load_config(named_config_path(point["config"]), overrides, task="halfcheetah-medium")
    trainer = assemble(config, synthetic_data(), run_dir)
    if every_token:  # the reference the cut is measured against
        model = trainer.model
        model.forward = functools.partial(model.forward, every_token=True)  # type: ignore[method-assign]
    return trainer


def run_steps(trainer: Trainer, steps: int) -> None:
    batch_size = trainer.config.train.batch_size
    for _ in range(steps):
        trainer.train_step(trainer.sampler.sample(batch_size))


def warm_up(trainer: Trainer, steps: int) -> int:
    """Compile, choose kernels, warm the allocator; returns the peak memory of these steps above
    what was resident after the first one (which makes the optimizer's state, resident from then
    on like the model's). Under reduce-overhead this holds the memory pool of the CUDA graphs,
    allocated once while they are recorded, that the timed steps then reuse."""
    run_steps(trainer, 1)
    baseline = reset_peak_memory(trainer.device)
    run_steps(trainer, steps - 1)
    return peak_memory(trainer.device, baseline)


def measure_speed(point: dict[str, Any]) -> dict[str, Any]:
    """Steps per second of every model, timed in alternating rounds within this process. On CUDA
    also each model's peak memory above everything resident (all models, optimizers, data)."""
    per_round = max(1, point["steps"] // point["rounds"])
    with tempfile.TemporaryDirectory() as run_dir:
        trainers = {
            name: make_trainer(point, blocks, Path(run_dir) / safe(name), every_token, precision)
            for name, (blocks, every_token, precision) in point["models"].items()
        }
        device = torch.device(point["device"])
        warmup_peak = {
            name: warm_up(trainer, point["warmup"]) for name, trainer in trainers.items()
        }
        runs: dict[str, Callable[[], None]] = {
            name: functools.partial(run_steps, trainer, per_round)
            for name, trainer in trainers.items()
        }
        seconds, memory = time_alternately(runs, point["rounds"], device)
        for name, peak in warmup_peak.items():
            if f"{name} bytes" in memory:  # CUDA graphs' memory pool is allocated while recording
                memory[f"{name} bytes"] = max(memory[f"{name} bytes"], peak)
        flops = (
            {}
            if point["compile"]
            else {f"{name} flops": step_flops(trainer) for name, trainer in trainers.items()}
        )
        rates = (
            {}
            if point["compile"] or device.type != "cpu"
            else {
                f"{name} matrix rate": matrix_product_rate(trainer)
                for name, trainer in trainers.items()
                if not name.endswith(EVERY_TOKEN)
            }
        )
    speeds = {name: per_round * point["rounds"] / sum(seconds[name]) for name in runs}
    return {**speeds, **memory, **flops, **rates}


def safe(name: str) -> str:
    return name.replace(" ", "_").replace(",", "")


def measure_memory(point: dict[str, Any]) -> dict[str, Any]:
    """Peak resident size of one model's training steps in a process of its own (CPU), above the
    resident model, optimizer and data."""
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(point, point["blocks"], Path(run_dir), False, point["precision"])
        baseline = reset_peak_memory(trainer.device)
        run_steps(trainer, point["warmup"])
        return {"bytes": peak_memory(trainer.device, baseline)}


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    return measure_speed(point) if point["measure"] == "speed" else measure_memory(point)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps (default: 100 CPU, 2000 CUDA)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="default",
        choices=COMPILE_MODES,
        metavar="MODE",
        help="also time torch.compile'd steps (bf16), in this mode (default: default)",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (dry runs)")
    parser.add_argument("--write-docs", action="store_true")
    return parser


def bench_tables(device: torch.device, batch: int, steps: int, rounds: int) -> dict[str, Table]:
    """The three tables of a run, captioned with what it measures and where."""
    where = f"{device_name(device)}, torch {torch.__version__}"
    return {
        "train": Table(
            f"bench_train_{device.type}",
            f"Training steps per second (batch {batch}, K 20, {steps} timed steps each, in "
            f"{rounds} alternating rounds) and peak memory (above the resident model and "
            f"data"
            + ("; process peak resident size on CPU" if device.type == "cpu" else "")
            + f") on {where}:",
            "| size | precision | mode | DT steps/s | Primal-DT steps/s | Primal-DT / DT "
            "| DT MiB | Primal-DT MiB |\n|---|---|---|---:|---:|---:|---:|---:|",
        ),
        "precision": Table(
            f"bench_precision_{device.type}",
            f"The training step in bf16 autocast against float32 (eager; the same alternating "
            f"rounds) on {where}; GFLOP/s: the step's matrix-product arithmetic (forward and "
            f"backward, torch.utils.flop_counter) per second of the whole step, and per second "
            f"of those matrix products alone, replayed at the step's shapes:",
            "| size | model | fp32 steps/s | bf16 steps/s | bf16 / fp32 | bf16 step GFLOP/s "
            "| bf16 matrix products alone, GFLOP/s | fp32 step GFLOP/s "
            "|\n|---|---|---:|---:|---:|---:|---:|---:|",
        ),
        "cut": Table(
            f"bench_cut_{device.type}",
            f"The training step against the same model computed at every token (eager, "
            f"{DEFAULT_PRECISION}; batch {batch}, K 20; GFLOP per step, forward and backward, as "
            f"torch.utils.flop_counter counts them; steps/s from the same alternating rounds) "
            f"on {where}:",
            "| size | model | GFLOP, every token | GFLOP, trained | arithmetic | steps/s, every "
            "token | steps/s, trained | speed-up |\n|---|---|---:|---:|---:|---:|---:|---:|",
        ),
    }


def main() -> None:
    args = build_parser().parse_args()
    if args.point:
        print(json.dumps(measure_point(json.loads(args.point))))
        return
    quiet_waits()  # the command's OpenMP waits, for the processes that time
    device = torch.device(args.device)
    steps = args.steps or (2000 if device.type == "cuda" else 100)
    batch = 8 if args.tiny else 64
    tables = bench_tables(device, batch, steps, args.rounds)
    precisions = PRECISIONS[device.type]
    sizes = (TINY_SIZES if args.tiny else SIZES).items()
    # Eager at every size first, then compiled (slow to compile): what is cut short comes last.
    for compiled in (None, args.compile) if args.compile else (None,):
        for label, (config, overrides) in sizes:
            models = {
                model_name(name, p, every): (blocks, every, p)
                for name, blocks in MODELS.items()
                for p in ((DEFAULT_PRECISION,) if compiled else precisions)
                for every in ((False,) if compiled or p != DEFAULT_PRECISION else (False, True))
            }
            point = {
                "config": config,
                "overrides": list(overrides),
                "device": args.device,
                "compile": compiled,
                "warmup": 30 if compiled else 10,
            }
            found = measure_side_by_side(
                __file__,
                {**point, "steps": steps, "rounds": args.rounds, "models": models},
                {
                    name: {"blocks": blocks, "precision": p}
                    for name, (blocks, every, p) in models.items()
                    if not every
                },
            )
            mode = f"torch.compile ({compiled})" if compiled else "eager"
            print(label, mode, found, flush=True)
            for p in (DEFAULT_PRECISION,) if compiled else precisions:
                tables["train"].add(train_row(label, p, mode, found), args.write_docs)
            if compiled:
                continue
            if len(precisions) > 1:
                for name in MODELS:
                    tables["precision"].add(precision_row(label, name, found), args.write_docs)
            for name in MODELS:
                tables["cut"].add(cut_row(label, name, found), args.write_docs)
    for table in tables.values():
        if table.rows:
            publish(table.name, table.caption, table.header, table.rows, args.write_docs)


@dataclasses.dataclass
class Table:
    """A table that goes into the documentation row by row (publish_so_far), then whole (publish)."""

    name: str
    caption: str
    header: str
    rows: list[str] = dataclasses.field(default_factory=list)

    def add(self, row: str, write: bool) -> None:
        self.rows.append(row)
        publish_so_far(self.name, self.caption, self.header, self.rows, write)


def train_row(label: str, precision: str, mode: str, found: dict[str, Any]) -> str:
    if "error" in found:
        return f"| {label} | {precision} | {mode} | {found['error']} |||||"
    dt, primal = found[model_name("DT", precision)], found[model_name("Primal-DT", precision)]
    memory = [mebibytes(found[model_name(name, precision) + " bytes"]) for name in MODELS]
    return (
        f"| {label} | {precision} | {mode} | {dt:.4g} | {primal:.4g} | {primal / dt:.2f}x "
        f"| {memory[0]} | {memory[1]} |"
    )


def precision_row(label: str, name: str, found: dict[str, Any]) -> str:
    """One model's bf16 step against its float32 step, and the bf16 step's arithmetic rate."""
    if "error" in found:
        return f"| {label} | {name} | {found['error']} ||||||"
    fp32, bf16 = model_name(name, "fp32"), model_name(name, "bf16")
    rate = {p: found[m + " flops"] * found[m] / 1e9 for p, m in (("fp32", fp32), ("bf16", bf16))}
    return (
        f"| {label} | {name} | {found[fp32]:.4g} | {found[bf16]:.4g} "
        f"| {found[bf16] / found[fp32]:.2f}x | {rate['bf16']:.0f} "
        f"| {found[bf16 + ' matrix rate']:.0f} | {rate['fp32']:.0f} |"
    )


def cut_row(label: str, name: str, found: dict[str, Any]) -> str:
    """A row of the cut table: one model, computed at every token and as it trains."""
    if "error" in found:
        return f"| {label} | {name} | {found['error']} ||||||"
    trained = model_name(name, DEFAULT_PRECISION)
    every = model_name(name, DEFAULT_PRECISION, every_token=True)
    full, cut = found[every + " flops"] / 1e9, found[trained + " flops"] / 1e9
    return (
        f"| {label} | {name} | {full:.2f} | {cut:.2f} | {cut / full:.2f}x | {found[every]:.4g} "
        f"| {found[trained]:.4g} | {found[trained] / found[every]:.2f}x |"
    )


if __name__ == "__main__":
    main()
