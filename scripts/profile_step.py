"""Profile: where a training step's time goes, by kind of operator, at both papers' sizes, on one
and on two threads.

    python scripts/profile_step.py [--precision bf16] [--steps 10] [--write-docs]

Each (size, threads) point runs in a fresh process: bench_train.py's trainer (primal-dt's own
Trainer.train_step on synthetic HalfCheetah-sized data, Primal-DT: Primal-Attention in the last
block), a warm-up, then --steps steps under torch.profiler. Each aten operator's self time (its
duration on the training thread, its OpenMP threads' work inside it) is put in a group by what it
does, and the table gives each group's share of the step. The profiler adds a little time to
every operator call, so the total it measures per step is slightly above the unprofiled step's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from bench_common import run_isolated
from doc_tables import publish

from primal_dt.common.cpu import quiet_waits

GROUPS = {  # group -> aten operators (without the "aten::" prefix)
    "matrix products (mm, addmm, bmm)": ("mm", "addmm", "bmm", "baddbmm"),
    "dtype casts (copy_, _to_copy)": ("copy_", "_to_copy"),
    "dropout masks (integer hash)": (
        "bitwise_right_shift",
        "bitwise_and_",
        "bitwise_xor_",
        "bitwise_not_",
        "bitwise_right_shift_",
        "arange",
    ),
    "element-wise arithmetic": (
        "mul",
        "mul_",
        "add",
        "add_",
        "sub",
        "sub_",
        "div",
        "div_",
        "where",
        "masked_fill_",
        "addcmul_",
        "fill_",
        "zero_",
        "neg",
        "clamp",
        "clamp_min",
        "reciprocal",
        "tanh",
        "tanh_backward",
        "pow",
        "rsub",
        "bitwise_or",
        "bitwise_not",
        "tril",
        "eq",
        "ge",
    ),
    "GELU, forward and backward": ("gelu", "gelu_backward"),
    "LayerNorm, forward and backward": ("native_layer_norm", "native_layer_norm_backward"),
    "softmax, forward and backward": ("_softmax", "_softmax_backward_data"),
    "reductions (sum, cumsum, norms)": (
        "sum",
        "cumsum",
        "linalg_vector_norm",
        "mean",
        "all",
        "_foreach_norm",
        "linalg_vecdot",
        "isfinite",
    ),
    "AdamW (fused) and gradient clipping": ("_fused_adamw_", "_foreach_mul_", "_foreach_add_"),
    "sampling, indexing, concatenation": (
        "index",
        "cat",
        "stack",
        "embedding",
        "embedding_dense_backward",
        "index_select",
        "repeat_interleave",
        "randint",
        "random_",
        "gather",
        "index_put_",
        "_index_put_impl_",
        "scatter_add_",
    ),
}
GROUP_OF = {op: group for group, ops in GROUPS.items() for op in ops}
OTHER = "everything else (allocation, views, autograd bookkeeping)"
SIZES = {"DT paper size": "dt", "Primal paper size": "primal-dt"}


def profile_point(point: dict[str, Any]) -> dict[str, Any]:
    """Milliseconds per step by group, at one size and thread count."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_train import make_trainer

    torch.set_num_threads(point["threads"])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(
            {"config": point["config"], "device": "cpu", "compile": None},
            "last",
            Path(run_dir),
            precision=point["precision"],
        )
        batch_size = trainer.config.train.batch_size
        for _ in range(5):
            trainer.train_step(trainer.sampler.sample(batch_size))
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(point["steps"]):
                trainer.train_step(trainer.sampler.sample(batch_size))
    groups: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        if event.key.startswith("aten::"):
            group = GROUP_OF.get(event.key.removeprefix("aten::"), OTHER)
        else:
            group = OTHER  # Python functions, autograd nodes, the optimiser's wrapper
        groups[group] += event.self_cpu_time_total / 1e3 / point["steps"]
    return dict(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(profile_point(json.loads(args.point))))
        return
    quiet_waits()  # the command's OpenMP waits
    columns = {}
    for label, config in SIZES.items():
        for threads in map(int, args.threads.split(",")):
            point = {
                "config": config,
                "threads": threads,
                "steps": args.steps,
                "precision": args.precision,
            }
            found = run_isolated(__file__, point)
            print(label, threads, found, flush=True)
            columns[f"{label}, {threads} thread" + ("s" if threads > 1 else "")] = found
    names = [*GROUPS, OTHER]
    rows = []
    for name in names:
        cells = [
            f"{found[name] / sum(found.values()):.0%}" if name in found else "–"
            for found in columns.values()
        ]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [f"{sum(found.values()):.0f}" for found in columns.values()]
    rows.append("| **ms per step, profiled** | " + " | ".join(totals) + " |")
    caption = (
        f"Where a Primal-DT training step's time goes in {args.precision} "
        f"({'autocast' if args.precision == 'bf16' else 'no autocast'}; batch 64, K 20; "
        f"torch.profiler, self time of each aten operator, {args.steps} steps) on a "
        f"{os.cpu_count()}-core CPU ({platform.machine()}), torch {torch.__version__}, by kind "
        f"of operator, as a share of the profiled step:"
    )
    header = "| operators | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns)
    publish(f"profile_{args.precision}", caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
