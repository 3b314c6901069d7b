"""Benchmark: one attention layer's forward + backward time and peak memory against context
length, for every attention of the registry (method/registry.py): causal softmax attention
(scaled_dot_product_attention on CUDA, written out on a CPU: attention.explicit_attention), masked
Primal-Attention and the five of the Primal paper's comparison (Linear, Reformer, Performer,
cosFormer, Flowformer, with the settings of configs/<kind>-dt.toml), at the widths of the Primal
paper's model (embed 256, 4 heads, rank 64) and the DT paper's (embed 128, 1 head, Primal rank
32, the default).

    python scripts/bench_attention.py                         # CPU, K = 20 ... 2000 timesteps
    python scripts/bench_attention.py --device cuda --write-docs

A DT window of K timesteps is 3K tokens, left-padded like training batches (a quarter of them
padded). At each K every layer runs in one fresh process, timed in alternating rounds so that a
machine that slows down or speeds up affects both alike; on CPU each layer's peak memory (the
process's peak resident size) is measured in a process of its own. The layers run in the
precision training runs them in (train.precision "auto": bf16 autocast where the device multiplies
bf16 in hardware, as on CUDA and on this project's CPUs, else float32).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch
from bench_common import (
    device_name,
    measure_side_by_side,
    mebibytes,
    peak_memory,
    reset_peak_memory,
    time_alternately,
)
from doc_tables import publish, publish_so_far

from primal_dt.common.config import ModelConfig
from primal_dt.common.device import autocast, resolve_precision
from primal_dt.method.registry import ATTENTIONS, attention_label, build_attention

KINDS = tuple(ATTENTIONS)
WIDTHS = {  # label -> (embed_dim, n_head, Primal rank): the two papers' models (configs/)
    "Primal paper (embed 256, 4 heads, rank 64)": (256, 4, 64),
    "DT paper (embed 128, 1 head, rank 32)": (128, 1, 32),
}


def make_layer(kind: str, point: dict[str, Any]) -> torch.nn.Module:
    """The layer a model of this width builds for a block of this kind (its other settings the
    kind's defaults, those of configs/<kind>-dt.toml)."""
    torch.manual_seed(0)
    config = ModelConfig(
        embed_dim=point["embed_dim"],
        n_head=point["n_head"],
        dropout=0.0,
        context_len=point["k"],
        attention=kind,
        attention_settings={"primal": {"rank": point["rank"]}} if kind == "primal" else {},
    )
    return build_attention(kind, config)


def make_step(layer: torch.nn.Module, point: dict[str, Any]) -> Callable[[], None]:
    """One forward + backward on left-padded windows (a quarter of them padded), as in training."""
    device = torch.device(point["device"])
    batch, length = point["batch"], 3 * point["k"]
    x = torch.randn(batch, length, point["embed_dim"], device=device, requires_grad=True)
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    mask[: batch // 4, : length // 2] = False

    def step() -> None:
        with autocast(resolve_precision("auto", device), device):  # what training runs
            y, j = layer(x, mask)
        loss = y.float().square().mean() + (j.float().mean() if j is not None else 0.0)
        loss.backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return step


def measure_speed(point: dict[str, Any]) -> dict[str, Any]:
    """Median milliseconds of both layers, timed in alternating rounds within this process. On
    CUDA also each layer's peak memory above the inputs and weights."""
    device = torch.device(point["device"])
    steps = {kind: make_step(make_layer(kind, point).to(device), point) for kind in KINDS}
    for step in steps.values():
        step()  # warm-up, kernels chosen
    seconds, memory = time_alternately(steps, point["repeats"], device)
    return {**{kind: 1000 * statistics.median(seconds[kind]) for kind in KINDS}, **memory}


def measure_memory(point: dict[str, Any]) -> dict[str, Any]:
    """Peak resident size of one layer's steps in a process of its own (CPU), above the inputs."""
    device = torch.device(point["device"])
    step = make_step(make_layer(point["kind"], point).to(device), point)
    baseline = reset_peak_memory(device)
    step()
    step()
    return {"bytes": peak_memory(device, baseline)}


def measure_point(point: dict[str, Any]) -> dict[str, Any]:
    return measure_speed(point) if point["measure"] == "speed" else measure_memory(point)


def measure_row(point: dict[str, Any]) -> dict[str, Any]:
    """Every layer at one point."""
    found = measure_side_by_side(__file__, point, {kind: {"kind": kind} for kind in KINDS})
    print(point["embed_dim"], point["k"], found, flush=True)
    return found


def table_row(k: int, found: dict[str, Any]) -> str:
    """The row from the K column on: each kind's milliseconds and MiB, the fastest named."""
    if "error" in found:
        return f"| {k} | {3 * k} | {found['error']} |" + "|" * len(KINDS)
    fastest = min(KINDS, key=lambda kind: found[kind])
    cells = [
        f"{'**' if kind == fastest else ''}{found[kind]:.1f}{'**' if kind == fastest else ''} "
        f"({mebibytes(found[f'{kind} bytes'])})"
        for kind in KINDS
    ]
    return f"| {k} | {3 * k} | " + " | ".join(cells) + f" | {attention_label(fastest)} |"


def fastest_where(found: dict[tuple[str, int], dict[str, Any]]) -> str:
    """Which attention was fastest at which K, per width, in words."""
    sentences = []
    for width in WIDTHS:
        measured = {k: f for (w, k), f in found.items() if w == width and "error" not in f}
        names = [
            attention_label(min(KINDS, key=lambda kind, f=f: f[kind])) for f in measured.values()
        ]
        if not names:
            continue
        ranges = ", ".join(f"{name} at K = {k}" for name, k in zip(names, measured, strict=True))
        sentences.append(f"{width}: fastest {ranges}.")
    return " ".join(sentences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default="20,100,500,2000")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure_point(json.loads(args.point))))
        return
    device = torch.device(args.device)
    caption = (
        f"One attention layer, forward + backward, batch {args.batch}, on {device_name(device)}, "
        f"torch {torch.__version__}, in training's precision: milliseconds (median of "
        f"{args.repeats}, every kind in the same alternating rounds) and, in brackets, peak memory "
        f"above the inputs"
        + (" (process peak resident size, a process per kind)" if device.type == "cpu" else "")
        + "; the fastest in bold:"
    )
    kinds = " | ".join(attention_label(kind) for kind in KINDS)
    header = (
        f"| width | K (timesteps) | tokens | {kinds} | fastest |\n"
        "|---|---:|---:|" + "---:|" * len(KINDS) + "---|"
    )
    rows = []
    found: dict[tuple[str, int], dict[str, Any]] = {}
    name = f"bench_attention_{device.type}"
    for width, (dim, heads, rank) in WIDTHS.items():
        for k in (int(k) for k in args.ks.split(",")):
            point = {
                "device": args.device,
                "k": k,
                "batch": args.batch,
                "embed_dim": dim,
                "n_head": heads,
                "rank": rank,
                "repeats": args.repeats,
            }
            found[width, k] = measure_row(point)
            rows.append(f"| {width} " + table_row(k, found[width, k]))
            publish_so_far(name, caption, header, rows, args.write_docs)
    publish(name, caption, header, [*rows, "", fastest_where(found)], args.write_docs)


if __name__ == "__main__":
    main()
