"""Measurement: what bf16 autocast does to what the policy is conditioned on, on a CPU.

    python scripts/bench_precision.py [--steps 1000] [--write-readme]

Under autocast the return-to-go enters `embed_return` in bf16, whose resolution at 3.6 (a target
of 3600 over return_scale 1000) is 2**-6, about 16 units of return, where a Hopper step earns
about 3. This script shows that input resolution directly, then trains the README's quick-start
model (hopper-bundled, embed 64, Primal rank 16) twice from the same seed, train.precision "fp32"
and "bf16", and compares what decides whether it matters: the final action and KSVD losses, and
the return-conditioning curve (normalised return achieved at each target, the policy acting in
the precision it trained in).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch
from bench_common import primal_dt
from readme_table import publish

from primal_dt.store.dashboards import read_scalars

SETTINGS = ["model.embed_dim=64", "model.primal_rank=16", "train.warmup_steps=100"]
TARGETS = "0:4000:5"


def input_resolution() -> str:
    """Whether bf16 tells a return-to-go from the one a step later (3.600 against 3.597)."""
    a, b = torch.tensor(3.600).bfloat16(), torch.tensor(3.597).bfloat16()
    spacing = 2.0 ** (math.floor(math.log2(3.6)) - 7)  # 8 significant bits
    return (
        f"bf16 holds 3.600 and 3.597 (one Hopper step apart at return_scale 1000) as "
        f"{'the same number' if bool(a == b) else 'different numbers'} ({a.item()}, {b.item()}; "
        f"its values near 3.6 are {spacing} apart)"
    )


def train_and_sweep(precision: str, steps: int, folder: Path) -> dict:
    run = folder / precision
    settings = [*SETTINGS, f'train.precision="{precision}"']
    primal_dt("train", "--env", "hopper-bundled", "--device", "cpu", "--steps", str(steps),
        "--final-episodes", "0", "--run-dir", str(run), "--no-progress",
        *[a for s in settings for a in ("--set", s)])  # fmt: skip
    (record,) = json.loads(primal_dt("eval", "--ckpt", str(run), "--target-sweep", TARGETS,
                               "--episodes", "5", "--device", "cpu", "--json"))  # fmt: skip
    scalars = read_scalars(run)
    last = {tag: scalars[tag][-1][1] for tag in ("train/action_loss", "train/ksvd_loss")}
    curve = {s["target"]: s["normalized_mean"] for s in record["results"]}
    return {**last, "curve": curve, "precision": record["precision"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    print(input_resolution(), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        found = {p: train_and_sweep(p, args.steps, Path(folder)) for p in ("fp32", "bf16")}
    fp32, bf16 = found["fp32"], found["bf16"]
    rows = [
        f"| final train/action_loss | {fp32['train/action_loss']:.4f} "
        f"| {bf16['train/action_loss']:.4f} |",
        f"| final train/ksvd_loss | {fp32['train/ksvd_loss']:.3g} | {bf16['train/ksvd_loss']:.3g} |",
    ]
    rows += [
        f"| normalised return at target {target:g} | {fp32['curve'][target]:.1f} "
        f"| {bf16['curve'][target]:.1f} |"
        for target in fp32["curve"]
    ]
    caption = (
        f"The quick-start model (hopper-bundled, embed 64, Primal rank 16, {args.steps} steps, "
        f"seed 0) trained and evaluated in float32 and in bf16 autocast on a CPU (5 episodes "
        f"per target, acting in {fp32['precision']} and {bf16['precision']}). "
        + input_resolution()
        + ":"
    )
    header = "| measure | float32 | bf16 |\n|---|---:|---:|"
    publish("bench-precision", caption, header, rows, args.write_readme)


if __name__ == "__main__":
    main()
