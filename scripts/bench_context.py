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
from readme_table import publish, publish_so_far

from primal_dt.common.cpu import quiet_waits

BENCH_TRAIN = str(Path(__file__).resolve().with_name("bench_train.py"))
MODELS = {"DT": "none", "Primal-DT": "all"}  # name -> model.primal_blocks


def measure(k: int, batch: int, steps: int, rounds: int, device: str, tiny: bool) -> dict:
    """Both models' steps/s, GFLOP per step and peak memory at context length k."""
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
        "models": {name: (blocks, False) for name, blocks in MODELS.items()},
    }
    memory = {name: {"primal_blocks": blocks} for name, blocks in MODELS.items()}
    return measure_side_by_side(BENCH_TRAIN, point, memory)


def row(k: int, found: dict) -> str:
    if "error" in found:
        return f"| {k} | {3 * k} | {found['error']} |||||||"
    dt, primal = found["DT"], found["Primal-DT"]
    gflop = [found[f"{name} flops"] / 1e9 for name in MODELS]
    return (
        f"| {k} | {3 * k} | {dt:.3g} | {primal:.3g} | {primal / dt:.2f}x | {gflop[0]:.1f} "
        f"| {gflop[1]:.1f} | {mebibytes(found['DT bytes'])} | {mebibytes(found['Primal-DT bytes'])} |"
    )


def crossover(found: dict[int, dict]) -> str:
    """From which K on Primal-DT trained faster, in words."""
    faster = [k for k, f in found.items() if "error" not in f and f["Primal-DT"] > f["DT"]]
    measured = [k for k, f in found.items() if "error" not in f]
    if not faster:
        return "At none of these K did Primal-DT train faster than DT."
    first = min(faster)
    if all(k in faster for k in measured if k >= first):
        return f"Primal-DT trained faster than DT from K = {first} on (of the K measured)."
    return f"Primal-DT trained faster than DT at K = {', '.join(map(str, faster))} only."


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
        f"{torch.__version__}: steps/s in {args.rounds} alternating rounds, GFLOP per step "
        f"(forward and backward, torch.utils.flop_counter) and peak memory above the resident "
        f"model and data" + (" (process peak resident size)" if not cuda else "") + ":"
    )
    header = (
        "| K | tokens | DT steps/s | Primal-DT (every block) steps/s | Primal / DT | DT GFLOP "
        "| Primal GFLOP | DT MiB | Primal MiB |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    name = f"bench_context_{device.type}"
    found: dict[int, dict] = {}
    rows = []
    for k in ks:
        # Fewer timed steps as a step gets longer: a few seconds per model.
        steps = max((6000 if cuda else 2000) // k, 2 * args.rounds) if not args.tiny else 2
        found[k] = measure(k, batch, steps, args.rounds, args.device, args.tiny)
        print(k, found[k], flush=True)
        rows.append(row(k, found[k]))
        publish_so_far(name, caption, header, rows, args.write_readme)
    publish(name, caption, header, [*rows, "", crossover(found)], args.write_readme)


if __name__ == "__main__":
    main()
