"""Benchmark: training end to end against context length, a Decision Transformer with each
attention of the registry in every block (DT: softmax; Primal-DT; Linear, Reformer, Performer,
cosFormer and Flowformer with their configs' settings), at the DT paper's size, side by side.

    python scripts/bench_context.py                          # CPU, K = 20, 50, 100, 200, 500
    python scripts/bench_context.py --device cuda --write-docs

The layer benchmark (bench_attention.py) times one attention layer; this one times what a user who
wants a long-context Decision Transformer runs: primal-dt's whole training step (bench_train.py's
measurement: Trainer.train_step on synthetic HalfCheetah-sized data, embed 128, 3 layers, 1 head,
Primal rank 32), with the embeddings, MLPs, loss and optimiser around the attention. At each K
every model trains in one fresh process in alternating rounds, in training's precision (bf16 on
this project's CPUs and on CUDA; bench_train.py compares the precisions); peak memory comes from CUDA's
allocator, or on CPU from a fresh process per model (its peak resident size above the resident
model and data). The batch is the same at every K (small enough for K = 500 on a CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_common import device_name, measure_side_by_side, mebibytes
from bench_train import model_name
from doc_tables import publish, publish_so_far

from primal_dt.common.cpu import quiet_waits
from primal_dt.common.device import resolve_precision
from primal_dt.method.registry import ATTENTIONS, attention_label

BENCH_TRAIN = str(Path(__file__).resolve().with_name("bench_train.py"))
MODELS = {attention_label(kind): kind for kind in ATTENTIONS}  # label -> kind in every block


def measure(k: int, batch: int, steps: int, rounds: int, device: str, tiny: bool) -> dict:
    """Every model's steps/s, GFLOP per step and peak memory at context length k, in training's
    precision, all in the same alternating rounds."""
    precision = training_precision(device)
    size = ["model.embed_dim=32", "model.n_layer=2"] if tiny else []
    overrides = [
        *size,
        f"model.context_len={k}",
        f"train.batch_size={batch}",
        "model.attention_settings.primal.rank=32",
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
            model_name(name, precision): (kind, False, precision) for name, kind in MODELS.items()
        },
    }
    memory = {
        model_name(name, precision): {"blocks": kind, "precision": precision}
        for name, kind in MODELS.items()
    }
    return measure_side_by_side(BENCH_TRAIN, point, memory)


def training_precision(device: str) -> str:
    """What train.precision "auto" trains in on this device (device.py)."""
    return resolve_precision("auto", torch.device(device))


def row(k: int, precision: str, found: dict) -> str:
    """Each model's steps/s (its speed against DT's) and MiB; the fastest in bold."""
    if "error" in found:
        return f"| {k} | {3 * k} | {found['error']} |" + "|" * len(MODELS)
    speed = {name: found[model_name(name, precision)] for name in MODELS}
    fastest = max(speed, key=lambda name: speed[name])
    cells = []
    for name in MODELS:
        bold = "**" if name == fastest else ""
        memory = mebibytes(found[f"{model_name(name, precision)} bytes"])
        cells.append(
            f"{bold}{speed[name]:.3g}{bold} ({speed[name] / speed['softmax']:.2f}x, {memory})"
        )
    return f"| {k} | {3 * k} | " + " | ".join(cells) + f" | {fastest} |"


def fastest_where(found: dict[int, dict], precision: str) -> str:
    """Which model trained fastest at which K, in words."""
    named = [
        f"{max(MODELS, key=lambda name, f=f: f[model_name(name, precision)])} at K = {k}"
        for k, f in found.items()
        if "error" not in f
    ]
    return f"Fastest in {precision}: " + ", ".join(named) + "." if named else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default="20,50,100,200,500", help="context lengths (timesteps)")
    parser.add_argument(
        "--batch", type=int, default=0, help="batch size (default: 16 CPU, 64 CUDA)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (dry runs)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    quiet_waits()  # the command's OpenMP waits, for the processes that time
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (64 if cuda else 16)
    ks = [int(k) for k in args.ks.split(",")]
    precision = training_precision(args.device)
    size = "a tiny model" if args.tiny else "DT paper's size (embed 128, 3 layers, 1 head)"
    caption = (
        f"Training end to end against context length K (3K tokens), {size}, each attention in "
        f"every block (Primal rank 32, the others' settings their configs'), batch {batch}, in "
        f"{precision}, on {device_name(device)}, torch {torch.__version__}: steps/s in "
        f"{args.rounds} alternating rounds (every model in one process), in brackets the speed "
        f"against softmax's and the peak memory above the resident model and data"
        + (" (process peak resident size, a process per model)" if not cuda else "")
        + "; the fastest in bold:"
    )
    header = (
        "| K | tokens | "
        + " | ".join(MODELS)
        + " | fastest |\n|---:|---:|"
        + "---:|" * len(MODELS)
        + "---|"
    )
    name = f"bench_context_{device.type}"
    found: dict[int, dict] = {}
    rows = []
    for k in ks:
        # Fewer timed steps as a step gets longer: a few seconds per model (on CUDA about one,
        # so that the seven kinds at three K fit gpu_check.sh's budget).
        steps = max((1000 if cuda else 2000) // k, 2 * args.rounds) if not args.tiny else 2
        found[k] = measure(k, batch, steps, args.rounds, args.device, args.tiny)
        print(k, found[k], flush=True)
        rows.append(row(k, precision, found[k]))
        publish_so_far(name, caption, header, rows, args.write_docs)
    publish(name, caption, header, [*rows, "", fastest_where(found, precision)], args.write_docs)


if __name__ == "__main__":
    main()
