"""Benchmark: what a checkpoint's digest costs (primal_dt/store/integrity.py), on a save and on a
load, at both papers' sizes, measured side by side in alternating rounds.

    python scripts/bench_checkpoint.py [--rounds 10] [--write-docs]

Each size's checkpoint is a real one: the Snapshot (weights, AdamW state, sampler and RNG states,
settings) of bench_train.py's trainer after a few training steps. A save is write_snapshot's
atomic write (a temporary file, fsync, rename) of the payload with and without its digests; a
load is torch.load(weights_only=True) with and without recomputing them (damaged_parts).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from bench_common import device_name
from bench_train import SIZES, make_trainer
from doc_tables import publish

from primal_dt.store.atomic import atomic_write
from primal_dt.store.integrity import damaged_parts, seal
from primal_dt.store.snapshots import payload_of


def measure(config: str, rounds: int, folder: Path) -> dict[str, float]:
    """Median milliseconds of each way to save and load this size's checkpoint, and its size."""
    trainer = make_trainer({"config": config, "device": "cpu", "compile": None}, "last", folder)
    for _ in range(3):
        trainer.train_step(trainer.sampler.sample(trainer.config.train.batch_size))
    payload = payload_of(trainer.snapshot(resumable=True))
    path = folder / "ckpt.pt"

    def save(with_digest: bool) -> None:
        data = seal(payload) if with_digest else payload
        atomic_write(path, lambda file: torch.save(data, file))

    def load(with_digest: bool) -> None:
        loaded = torch.load(path, weights_only=True)
        if with_digest:
            assert damaged_parts(loaded) == []

    save(True)
    ways = {
        "save": lambda: save(False),
        "save, digest": lambda: save(True),
        "load": lambda: load(False),
        "load, digest": lambda: load(True),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            if name.startswith("load"):
                save(True)  # the file both loads read
            start = time.perf_counter()
            way()
            times[name].append((time.perf_counter() - start) * 1e3)
    found = {name: sorted(values)[len(values) // 2] for name, values in times.items()}
    return {**found, "MiB": path.stat().st_size / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    rows = []
    for label, (config, _) in SIZES.items():
        with tempfile.TemporaryDirectory() as folder:
            found = measure(config, args.rounds, Path(folder))
        print(label, found, flush=True)
        save, sealed = found["save"], found["save, digest"]
        load, checked = found["load"], found["load, digest"]
        rows.append(
            f"| {label} | {found['MiB']:.1f} | {save:.1f} | {sealed:.1f} | {sealed / save:.2f}x "
            f"| {load:.1f} | {checked:.1f} | {checked / load:.2f}x |"
        )
    caption = (
        f"A resumable checkpoint (weights, AdamW state, sampler and RNG states, settings) saved "
        f"(atomically, with fsync) and loaded without and with its digests, median of "
        f"{args.rounds} alternating rounds, on {device_name(torch.device('cpu'))}, torch "
        f"{torch.__version__}:"
    )
    header = (
        "| size | MiB | save ms | save with digest ms | ratio | load ms | load and verify ms "
        "| ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    publish("bench-checkpoint", caption, header, rows, args.write_docs)


if __name__ == "__main__":
    main()
