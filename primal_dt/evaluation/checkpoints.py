"""`primal-dt eval --ckpt`: evaluate checkpoint files and run directories, and keep beside each
run what was asked for with it: its return-conditioning curve, its videos."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from primal_dt.common.cpu import evaluation_threads
from primal_dt.common.errors import CheckpointError
from primal_dt.evaluation.conditioning import write_curve
from primal_dt.evaluation.rollout import (
    EvalOptions,
    add_videos,
    evaluation_record,
    load_policy,
    plan_evaluation,
)
from primal_dt.store.results import EvalResult
from primal_dt.store.rundir import folder_of
from primal_dt.store.snapshots import checkpoints_to_evaluate, read_snapshot, unsealed_note


def evaluate_checkpoint(
    path: Path,
    options: EvalOptions,
    device: torch.device,
    videos_to: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> EvalResult:
    """Read, load and evaluate one checkpoint file; with videos asked for, also render them into
    videos_to. A file older than checkpoint digests is said (to `say`) to be unverified."""
    snapshot = read_snapshot(path, map_location=device)
    if not snapshot.sealed and say is not None:
        say(unsealed_note(path))
    policy = load_policy(snapshot, device, f"checkpoint {path}")
    plan = plan_evaluation(snapshot, options)
    record = evaluation_record(snapshot, policy, plan, str(path))
    if plan.videos and videos_to is not None:
        add_videos(record, snapshot, policy, plan, videos_to)
    return record


def evaluate_checkpoints(
    given: list[str],
    options: EvalOptions,
    device: torch.device,
    every: bool = False,
    curve: bool = False,
    say: Callable[[str], None] = print,
    quiet: bool = False,
) -> list[EvalResult]:
    """Each checkpoint file given, or each run directory's latest checkpoint (every: all it
    keeps), evaluated in turn, on a CPU with one thread as every evaluation is there (so the
    numbers logged in training repeat); videos go to the run's videos/, and with `curve` the run
    keeps the return-conditioning curve (conditioning.py), whose file is said; unless quiet, so
    is each checkpoint's time."""
    evaluation_threads(device.type)
    records = []
    for name in given:
        try:
            paths = checkpoints_to_evaluate(name, every)
        except CheckpointError as err:  # a missing file or a folder that is no run
            records.append(EvalResult(-1, name, error=str(err)))
            continue
        records += evaluate_each(paths, options, device, curve, say, quiet)
    return records


def evaluate_each(
    paths: list[Path],
    options: EvalOptions,
    device: torch.device,
    curve: bool,
    say: Callable[[str], None],
    quiet: bool,
) -> list[EvalResult]:
    """evaluate_checkpoints' loop: a checkpoint that cannot be used becomes an error record (step
    -1) and the others are still evaluated."""
    records = []
    for path in paths:
        try:
            record = evaluate_checkpoint(path, options, device, folder_of(path).videos, say)
        except CheckpointError as err:
            records.append(EvalResult(-1, str(path), error=str(err)))
            continue
        if not quiet:
            say(f"evaluated {path} in {record.seconds:.1f} s")
        if curve:
            say(f"return-conditioning curve: {write_curve(folder_of(path), record)}")
        records.append(record)
    return records
