"""Benchmark: training end to end against context length, DT (softmax attention in every block)
against Primal-DT with Primal-Attention in every block, at the DT paper's size, side by side.

    python scripts/bench_context.py                          # CPU, K = 20, 50, 100, 200, 500
    python scripts/bench_context.py --device cuda --write-readme

The layer benchmark (bench_attention.py) times one attention layer; this one times what a user who
wants a long-context Decision Transformer runs: primal-dt's whole training step (bench_train.py's
measurement: Trainer.train_step on synthetic HalfCheetah-sized data, embed 128, 3 layers, 1 head,
Primal rank 32), with the embeddings, MLPs, loss and optimiser around the attention. At each K
both models train in one fresh process in alternating rounds; peak memory comes from CUDA's
allocator, or on CPU from a fresh process per model (its peak resident size above the resident
model and data). The batch is the same at every K (small enough for K = 500 on a CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_common import device_name, measure_side_by_side, mebibytes
from bench_train import PRECISIONS, model_name
from readme_table import publish, publish_so_far

from primal_dt.common.cpu import quiet_waits

BENCH_TRAIN = str(Path(__file__).resolve().with_name("bench_train.py"))
MODELS = {"DT": "none", "Primal-DT": "all"}  # name -> model.primal_blocks


def measure(k: int, batch: int, steps: int, rounds: int, device: str, tiny: bool) -> dict:
    """Both models' steps/s, GFLOP per step and peak memory at context length k, in each of the
    device's precisions (bench_train.PRECISIONS), all in the same alternating rounds."""
    precisions = PRECISIONS[torch.device(device).type]
    size = ["model.embed_dim=32", "model.n_layer=2"] if tiny else []
    overrides = [
        *size,
        f"model.context_len={k}",
        f"train.batch_size={batch}",
        "model.primal_rank=32",
    ]
    point = {
        "config": "dt",
        "overrides": overrides,
        "device": device,
        "compile": None,
        "warmup": 5 if device.startswith("cuda") else 2,
        "steps": steps,
        "rounds": rounds,
        "models": {
            model_name(name, p): (blocks, False, p) for name, blocks in MODELS.items()
            for p in precisions
        },
    }  # fmt: skip
    memory = {
        model_name(name, p): {"primal_blocks": blocks, "precision": p}
        for name, blocks in MODELS.items() for p in precisions
    }  # fmt: skip
    return measure_side_by_side(BENCH_TRAIN, point, memory)


def row(k: int, precision: str, found: dict) -> str:
    if "error" in found:
        return f"| {k} | {3 * k} | {precision} | {found['error']} |||||||"
    dt, primal = (found[model_name(name, precision)] for name in MODELS)
    gflop = [found[f"{model_name(name, precision)} flops"] / 1e9 for name in MODELS]
    memory = [mebibytes(found[f"{model_name(name, precision)} bytes"]) for name in MODELS]
    return (
        f"| {k} | {3 * k} | {precision} | {dt:.3g} | {primal:.3g} | {primal / dt:.2f}x "
        f"| {gflop[0]:.1f} | {gflop[1]:.1f} | {memory[0]} | {memory[1]} |"
    )


def crossover(found: dict[int, dict], precision: str) -> str:
    """From which K on Primal-DT trained faster in `precision`, in words."""
    dt, primal = (model_name(name, precision) for name in MODELS)
    measured = [k for k, f in found.items() if "error" not in f]
    faster = [k for k in measured if found[k][primal] > found[k][dt]]
    if not faster:
        return f"In {precision}, at none of these K did Primal-DT train faster than DT."
    first = min(faster)
    if all(k in faster for k in measured if k >= first):
        return f"In {precision}, Primal-DT trained faster than DT from K = {first} on (of the K measured)."
    return f"In {precision}, Primal-DT trained faster than DT at K = {', '.join(map(str, faster))} only."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default="20,50,100,200,500", help="context lengths (timesteps)")
    parser.add_argument(
        "--batch", type=int, default=0, help="batch size (default: 16 CPU, 64 CUDA)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (dry runs)")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    quiet_waits()  # the command's OpenMP waits, for the processes that time
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (64 if cuda else 16)
    ks = [int(k) for k in args.ks.split(",")]
    size = "a tiny model" if args.tiny else "DT paper's size (embed 128, 3 layers, 1 head)"
    caption = (
        f"Training end to end against context length K (3K tokens), {size}, Primal rank 32, "
        f"batch {batch}, on {device_name(device)}, torch "
        f"{torch.__version__}: steps/s in {args.rounds} alternating rounds (every model and precision in one process), GFLOP per step "
        f"(forward and backward, torch.utils.flop_counter) and peak memory above the resident "
        f"model and data" + (" (process peak resident size)" if not cuda else "") + ":"
    )
    header = (
        "| K | tokens | precision | DT steps/s | Primal-DT (every block) steps/s | Primal / DT "
        "| DT GFLOP | Primal GFLOP | DT MiB | Primal MiB "
        "|\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    name = f"bench_context_{device.type}"
    found: dict[int, dict] = {}
    rows = []
    for k in ks:
        # Fewer timed steps as a step gets longer: a few seconds per model.
        steps = max((6000 if cuda else 2000) // k, 2 * args.rounds) if not args.tiny else 2
        found[k] = measure(k, batch, steps, args.rounds, args.device, args.tiny)
        print(k, found[k], flush=True)
        rows += [row(k, p, found[k]) for p in PRECISIONS[device.type]]
        publish_so_far(name, caption, header, rows, args.write_readme)
    words = " ".join(crossover(found, p) for p in PRECISIONS[device.type])
    publish(name, caption, header, [*rows, "", words], args.write_readme)


if __name__ == "__main__":
    main()
