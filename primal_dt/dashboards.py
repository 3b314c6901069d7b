"""TensorBoard's Custom Scalars tab: for one run, its losses together and its returns per target;
for a runs directory, per task, every run's normalised returns in one chart and their KSVD losses
in another.

A custom-scalars chart selects tags by regular expression but always draws every run, so charts
per task need tags that name the task. When a run finishes, its `eval/<target>/normalized_return`
and `train/ksvd_loss` are copied into its own directory as `by_task/<task>/...` (an extra event
file, rewritten on each copy); the layout, written into RUNS_DIR itself, has one category per task
that selects those. `tensorboard --logdir RUNS_DIR` then shows DT against Primal-DT per task.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

LAYOUT_SUFFIX = ".layout"
COPY_SUFFIX = ".by_task"
COPIED_TAGS = re.compile(r"eval/.*/normalized_return|train/ksvd_loss")


def _remove(folder: Path, suffix: str) -> None:
    for old in folder.glob(f"events.out.tfevents.*{suffix}"):
        old.unlink(missing_ok=True)


def _escape(task: str) -> str:
    """re.escape, but leaving "-" alone, so the layout stays readable."""
    return re.sub(r"([^A-Za-z0-9_-])", r"\\\1", task)


def run_layout() -> dict[str, dict[str, list]]:
    """A single run's layout (the trainer writes it into the run): the action and KSVD losses in
    one chart, and the returns, normalised returns and episode lengths of every target."""
    return {
        "primal-dt run": {
            "action and KSVD losses": ["Multiline", [r"^train/(action|ksvd)_loss$"]],
            "normalised return per target": ["Multiline", [r"^eval/[^/]+/normalized_return$"]],
            "return per target": ["Multiline", [r"^eval/[^/]+/return$"]],
            "episode length per target": ["Multiline", [r"^eval/[^/]+/episode_length$"]],
        }
    }


def layout(tasks: Iterable[str]) -> dict[str, dict[str, list]]:
    """The add_custom_scalars layout: a category per task with two Multiline charts."""
    charts = {}
    for task in sorted(set(tasks)):
        prefix = f"^by_task/{_escape(task)}/"
        charts[task] = {
            "normalised return (every run and target)": [
                "Multiline",
                [prefix + r"eval/.*/normalized_return$"],
            ],
            "KSVD loss (every run)": ["Multiline", [prefix + "train/ksvd_loss$"]],
        }
    return charts


def write_layout(runs_dir: Path, tasks: Iterable[str]) -> None:
    """Replace RUNS_DIR's custom-scalars layout with one for these tasks."""
    from torch.utils.tensorboard import SummaryWriter

    runs_dir.mkdir(parents=True, exist_ok=True)
    _remove(runs_dir, LAYOUT_SUFFIX)
    with SummaryWriter(str(runs_dir), filename_suffix=LAYOUT_SUFFIX) as writer:
        writer.add_custom_scalars(layout(tasks))


def copy_run(run_dir: Path, task: str) -> int:
    """Copy a run's normalised returns and KSVD loss under by_task/<task>/; returns the points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    _remove(run_dir, COPY_SUFFIX)
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if COPIED_TAGS.fullmatch(tag)]
    points = 0
    with SummaryWriter(str(run_dir), filename_suffix=COPY_SUFFIX) as writer:
        for tag in tags:
            for event in events.Scalars(tag):
                writer.add_scalar(f"by_task/{task}/{tag}", event.value, event.step, event.wall_time)
                points += 1
    return points
