"""Measurement: what bf16 autocast costs in quality, on a CPU: float32 against bf16, same seeds.

    python scripts/bench_precision.py [--seeds 0,1,2] [--write-docs]

Under autocast the return-to-go enters `embed_return` in bf16, whose resolution at 3.6 (a target
of 3600 over return_scale 1000) is 2**-6, about 16 units of return, where a Hopper step earns
about 3; the matrix products, softmax and GELU run in bf16 too, while the loss, the KSVD
objective's sums and the prefix means sum in float32 (attention.py, trainer.py). This script
shows the input resolution, then trains two models from each seed twice, train.precision "fp32"
and "bf16", changing nothing else, and compares what decides whether bf16 costs anything:

- the quick start's model (hopper-bundled, embed 64, Primal rank 16, 1000 steps);
- a DT-size model (configs/dt.toml: embed 128, 3 layers, 1 head, softmax; warm-up 200 steps
  instead of 10,000 at this budget) on hopper-medium recorded here from tests/policies' SAC policy
  (the recipe of scripts/results.py), 2000 steps.

For each: the final action loss, the final score (the better of the task's two targets, 10
episodes each, as the run's final evaluation scores it) and the return-conditioning curve
(normalised return at targets 0 to 4000, 5 episodes each), the policy acting in the precision it
trained in. Per precision the table gives the mean over seeds with a Student's t 95% interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import device_name, primal_dt
from doc_tables import publish
from scipy import stats

from primal_dt.store.rundir import RunDir
from primal_dt.store.training_log import curve as logged_curve
from primal_dt.store.training_log import read_points

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "tests" / "policies"
TARGETS = "0:4000:5"
MODELS = {  # label -> (task, config, steps, overrides)
    "quick-start model (hopper-bundled, embed 64, rank 16)": (
        "hopper-bundled",
        "primal-dt",
        1000,
        ["model.embed_dim=64", "model.attention_settings.primal.rank=16", "train.warmup_steps=100"],
    ),
    "DT size (configs/dt.toml, hopper-medium recorded here)": (
        "hopper-medium",
        "dt",
        2000,
        ["train.warmup_steps=200"],
    ),
}


def input_resolution() -> str:
    """Whether bf16 tells a return-to-go from the one a step later (3.600 against 3.597)."""
    a, b = torch.tensor(3.600).bfloat16(), torch.tensor(3.597).bfloat16()
    spacing = 2.0 ** (math.floor(math.log2(3.6)) - 7)  # 8 significant bits
    return (
        f"bf16 holds 3.600 and 3.597 (one Hopper step apart at return_scale 1000) as "
        f"{'the same number' if bool(a == b) else 'different numbers'} ({a.item()}, {b.item()}; "
        f"its values near 3.6 are {spacing} apart)"
    )


def record_hopper_medium(env: dict[str, str]) -> None:
    """hopper-medium from the SAC policy, made once (scripts/results.py's recipe)."""
    if not (Path(env["MINARI_DATASETS_PATH"]) / "primal-dt" / "hopper" / "medium-v0").exists():
        primal_dt(
            "datasets",
            "make",
            "--env",
            "hopper",
            "--recipe",
            "policy",
            "--name",
            "medium",
            "--policy",
            str(POLICIES / "sac" / "Hopper-v5.zip"),
            "--steps",
            "20000",
            "--expert-policy",
            str(POLICIES / "tqc" / "Hopper-v5.zip"),
            "--no-progress",
            env=env,
        )


def train_and_measure(model: str, precision: str, seed: int, folder: Path, env: dict) -> dict:
    task, config, steps, overrides = MODELS[model]
    run = folder / f"{config}-{precision}-s{seed}"
    settings = [*overrides, f'train.precision="{precision}"', "train.eval_every=0"]
    primal_dt(
        "train",
        "--env",
        task,
        "--config",
        config,
        "--device",
        "cpu",
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--final-episodes",
        "10",
        "--run-dir",
        str(run),
        "--no-progress",
        "--offline",
        *[a for s in settings for a in ("--set", s)],
        env=env,
    )
    (final,) = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    (curve,) = json.loads(
        primal_dt(
            "eval",
            "--ckpt",
            str(run),
            "--target-sweep",
            TARGETS,
            "--episodes",
            "5",
            "--device",
            "cpu",
            "--json",
            env=env,
        )
    )
    assert final["precision"] == curve["precision"] == precision
    loss = logged_curve(read_points(RunDir(run).training_log), "action_loss")[-1][1]
    points = {s["target"]: s["normalized_mean"] for s in curve["results"]}
    return {"loss": loss, "score": final["score"], "curve": points}


def interval(values: list[float]) -> str:
    """mean ± the half-width of Student's t 95% interval over the seeds."""
    mean = float(np.mean(values))
    half = stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return f"{mean:.3g} ± {half:.2g}"


def overlap(a: list[float], b: list[float]) -> bool:
    def bounds(v: list[float]) -> tuple[float, float]:
        half = stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / math.sqrt(len(v))
        return float(np.mean(v)) - half, float(np.mean(v)) + half

    (lo_a, hi_a), (lo_b, hi_b) = bounds(a), bounds(b)
    return lo_a <= hi_b and lo_b <= hi_a


def rows_for(model: str, found: dict[str, list[dict]]) -> list[str]:
    """One model's rows: loss, score and each curve point, fp32 and bf16 over the seeds."""
    measures = [
        ("final train/action_loss", lambda r: r["loss"]),
        ("final score (normalised, better target)", lambda r: r["score"]),
    ]
    targets = found["fp32"][0]["curve"]
    measures += [
        (f"normalised return at target {t:g}", lambda r, t=t: r["curve"][t]) for t in targets
    ]
    rows = []
    for name, value in measures:
        fp32 = [value(r) for r in found["fp32"]]
        bf16 = [value(r) for r in found["bf16"]]
        verdict = "none detected" if overlap(fp32, bf16) else "intervals apart"
        rows.append(f"| {model} | {name} | {interval(fp32)} | {interval(bf16)} | {verdict} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", help="where the dataset and runs go (default: a temporary folder)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(input_resolution(), flush=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.out or temporary).resolve()
        env = {**os.environ, "MINARI_DATASETS_PATH": str(folder / "minari")}
        record_hopper_medium(env)
        rows = []
        for model in MODELS:
            found: dict[str, list[dict]] = {"fp32": [], "bf16": []}
            for seed in seeds:
                for precision in found:  # alternating, so a drifting machine affects both alike
                    found[precision].append(train_and_measure(model, precision, seed, folder, env))
                    print(model, precision, seed, found[precision][-1], flush=True)
            rows += rows_for(model, found)
    minutes = (time.monotonic() - start) / 60
    caption = (
        f"float32 against bf16 autocast on {device_name(torch.device('cpu'))}, seeds "
        f"{args.seeds}, the only difference train.precision (mean over seeds ± Student's t 95% "
        f"interval; {minutes:.0f} minutes). {input_resolution()}:"
    )
    header = "| model | measure | float32 | bf16 | difference |\n|---|---|---:|---:|---|"
    publish("bench-precision", caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
