"""Benchmark: one attention layer's forward + backward time and peak memory against context
length, causal softmax attention (through scaled_dot_product_attention) against masked
Primal-Attention, at the Primal paper's width (embed 256, 4 heads, rank 64).

    python scripts/bench_attention.py                         # CPU, K = 20 ... 1000 timesteps
    python scripts/bench_attention.py --device cuda --write-readme

A DT window of K timesteps is 3K tokens. Each point runs in a fresh process, so its peak memory
is its own; the windows are left-padded like training batches (a quarter of them padded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from bench_common import (
    device_name,
    peak_memory,
    reset_peak_memory,
    run_isolated,
    synchronize,
)
from readme_table import publish

from primal_dt.attention import CausalSelfAttention, PrimalAttention


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(point["device"])
    torch.manual_seed(0)
    dim, heads, rank = point["embed_dim"], point["n_head"], point["rank"]
    layer = (
        PrimalAttention(dim, heads, rank, dropout=0.0)
        if point["kind"] == "primal"
        else CausalSelfAttention(dim, heads, dropout=0.0)
    ).to(device)
    batch, length = point["batch"], 3 * point["k"]
    x = torch.randn(batch, length, dim, device=device, requires_grad=True)
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    mask[: batch // 4, : length // 2] = False  # left padding, as in training windows

    def step() -> None:
        y, j = layer(x, mask)
        loss = y.float().square().mean() + (j.square().mean() if j is not None else 0.0)
        loss.backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    baseline = reset_peak_memory(device)
    step()  # warm-up, kernels chosen
    synchronize(device)
    times = []
    for _ in range(point["repeats"]):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"ms": 1000 * statistics.median(times), "bytes": peak_memory(device, baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default="20,50,100,200,500,1000,1500")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure_point(json.loads(args.point))))
        return
    device = torch.device(args.device)
    rows = []
    for k in (int(k) for k in args.ks.split(",")):
        found = {}
        for kind in ("softmax", "primal"):
            point = {"device": args.device, "kind": kind, "k": k, "batch": args.batch,
                     "embed_dim": 256, "n_head": 4, "rank": 64, "repeats": args.repeats}  # fmt: skip
            found[kind] = run_isolated(__file__, point)
            print(k, kind, found[kind], flush=True)
        soft, primal = found["softmax"], found["primal"]
        if "error" in soft or "error" in primal:
            rows.append(
                f"| {k} | {3 * k} | {soft.get('error', '')} | {primal.get('error', '')} |||||"
            )
            continue
        rows.append(
            f"| {k} | {3 * k} | {soft['ms']:.1f} | {primal['ms']:.1f} | "
            f"{soft['ms'] / primal['ms']:.1f}x | {soft['bytes'] / 2**20:.0f} | "
            f"{primal['bytes'] / 2**20:.0f} | {soft['bytes'] / max(primal['bytes'], 1):.1f}x |"
        )
    caption = (
        f"One attention layer, forward + backward, batch {args.batch}, embed 256, 4 heads, "
        f"Primal rank 64, on {device_name(device)}, torch {torch.__version__} "
        f"(median of {args.repeats}; peak memory above the inputs"
        + (", process peak resident size on CPU" if device.type == "cpu" else "")
        + "):"
    )
    header = (
        "| K (timesteps) | tokens | softmax ms | Primal ms | Primal speed-up | softmax MiB "
        "| Primal MiB | memory ratio |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    publish(f"bench_attention_{device.type}", caption, header, rows, args.write_readme)


if __name__ == "__main__":
    main()
