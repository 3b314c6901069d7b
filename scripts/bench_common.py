"""Shared by the benchmarks: run one measurement in a fresh process (so peak memory is its own),
read peak memory, and name the device."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def run_isolated(script: str, point: dict[str, Any]) -> dict[str, Any]:
    """Run `python script --point JSON` and return the JSON object it prints last."""
    result = subprocess.run(
        [sys.executable, script, "--point", json.dumps(point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        return {"error": reason}
    return json.loads(result.stdout.strip().splitlines()[-1])


def time_alternately(
    runs: dict[str, Callable[[], None]], rounds: int, device: torch.device
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time each run once per round, the runs taking turns, so that a machine that slows down or
    speeds up affects all alike. Returns each run's seconds per round and, on CUDA, its peak
    memory above everything resident as "NAME bytes" (on CPU a process has one peak resident
    size: measure that per run in a fresh process, see measure_side_by_side)."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    peak = dict.fromkeys(runs, 0)
    for _ in range(rounds):
        for name, run in runs.items():
            baseline = reset_peak_memory(device)
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
            peak[name] = max(peak[name], peak_memory(device, baseline))
    memory = {f"{name} bytes": peak[name] for name in runs} if device.type != "cpu" else {}
    return seconds, memory


def measure_side_by_side(
    script: str, point: dict[str, Any], memory_points: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Run `script`'s speed measurement of several models at `point` in one fresh process; where
    it could not count memory per model (CPU: a process has one peak resident size), add each
    model's "NAME bytes" from a fresh process of its own, with memory_points[NAME] added to point.
    """
    found = run_isolated(script, {**point, "measure": "speed"})
    for name, extra in memory_points.items():
        if "error" not in found and f"{name} bytes" not in found:
            memory = run_isolated(script, {**point, "measure": "memory", **extra})
            found[f"{name} bytes"] = memory.get("bytes", memory.get("error"))
    return found


def reset_peak_memory(device: torch.device) -> int:
    """Start a peak-memory measurement; returns the baseline to subtract (CPU: bytes resident)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return resident_peak_bytes()


def peak_memory(device: torch.device, baseline: int) -> int:
    """Bytes at the peak since reset_peak_memory, above its baseline. On CPU this is the process's
    peak resident size (ru_maxrss), so it is only meaningful in a fresh process per measurement."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline
    return max(resident_peak_bytes() - baseline, 0)


def resident_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {os.cpu_count()} cores ({platform.machine()}), {torch.get_num_threads()} threads"


def mebibytes(value: int | str) -> str:
    """A byte count as MiB for a table, or the error that stood in for it."""
    return f"{value / 2**20:.0f}" if isinstance(value, int) else str(value)


def primal_dt(*args: str, env: dict[str, str] | None = None) -> str:
    """A `primal-dt` command run as a user runs it; its output, or its error and exit."""
    result = subprocess.run(
        [sys.executable, "-m", "primal_dt.cli", *args], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"primal-dt {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return result.stdout
