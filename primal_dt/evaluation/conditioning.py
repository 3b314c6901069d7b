"""The return-conditioning curve (the Decision Transformer paper's figure): the return a policy
achieves against the return it is asked for, over a sweep of target returns.

`primal-dt eval --ckpt RUN --target-sweep LOW:HIGH:N` evaluates N evenly spaced targets and keeps
the curve in the run directory as an EvalResult (return_curve_step_N.json) and a PNG of the
normalised return achieved against the normalised target, with the diagonal (a policy that
achieves exactly what it is asked) and the best episode return in the training data marked;
`primal-dt report` draws the runs' curves of a task, DT and Primal-DT, side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from primal_dt.common.errors import ConfigError
from primal_dt.store.atomic import atomic_write
from primal_dt.store.results import EvalResult
from primal_dt.store.rundir import RunDir


def targets_between(text: str) -> list[float]:
    """'LOW:HIGH:N' -> N evenly spaced targets from LOW to HIGH (N >= 2)."""
    usage = "--target-sweep takes LOW:HIGH:N with finite LOW < HIGH and N >= 2 (e.g. 0:4000:9)"
    try:
        low, high, count = text.split(":")
        low_value, high_value, points = float(low), float(high), int(count)
    except ValueError:
        raise ConfigError(f"{usage}, got {text!r}") from None
    if not (np.isfinite([low_value, high_value]).all() and low_value < high_value and points >= 2):
        raise ConfigError(f"{usage}, got {text!r}")
    return [float(t) for t in np.linspace(low_value, high_value, points)]


def curve_points(record: EvalResult) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None]:
    """(targets, achieved mean, achieved std, best dataset return), normalised where the result
    has reference scores, else raw returns."""
    targets = np.array([s.target for s in record.results])
    mean = np.array([s.return_mean for s in record.results])
    std = np.array([s.return_std for s in record.results])
    best = record.dataset_best_return
    ref = record.reference
    if ref is not None:
        scale = 100.0 / (ref.expert - ref.random)
        targets, mean = ref.normalize(targets), ref.normalize(mean)
        std = std * scale
        best = None if best is None else float(ref.normalize(best))
    return targets, mean, std, best


def write_curve(run: RunDir, record: EvalResult) -> Path:
    """Keep a target sweep's record and its figure in the run directory; returns the PNG."""
    from primal_dt.evaluation.plots import conditioning_figure, save

    data, picture = run.return_curve(record.step)
    text = json.dumps(record.to_dict(), indent=1)
    atomic_write(data, lambda file: file.write(text.encode()))
    panel = {f"step {record.step}": [curve_points(record)]}  # the task is the figure's title
    figure = conditioning_figure(panel, record.task, record.reference)
    return save(figure, picture)


def read_curve(run: RunDir) -> EvalResult | None:
    """The run's latest kept curve, if it has one."""
    found = run.return_curves()
    return EvalResult.from_dict(json.loads(found[-1].read_text())) if found else None
