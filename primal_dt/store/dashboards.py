"""TensorBoard's Custom Scalars tab: for one run, its action loss and its auxiliary (KSVD) loss
each on a chart of its own (the auxiliary loss is orders of magnitude smaller, and TensorBoard's
charts have one axis; each chart's log-scale button is the reader's), and its returns per target;
for a runs directory, per task, every run's normalised returns in one chart and their auxiliary
losses in another.

A custom-scalars chart selects tags by regular expression but always draws every run, so charts
per task need tags that name the task. When a run finishes (`primal-dt train`, alone or in a
pack, and so every run of a sweep), its `eval/<target>/normalized_return` and its auxiliary loss
are copied into its own directory as `by_task/<task>/...` (an extra event file, rewritten on each
copy; `report` copies again, for runs made before); each run's own layout (written when it
starts) has, beside its own charts, a category for its task that selects those, and TensorBoard
merges the categories of the same title over runs. `tensorboard --logdir RUNS_DIR` then shows DT against Primal-DT per task,
with nothing written into RUNS_DIR itself (an event file there is a run named ".").
A run's settings go to the HPARAMS tab (write_hparams).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from primal_dt.common.config import Config

LAYOUT_SUFFIX = ".layout"
COPY_SUFFIX = ".by_task"
# The normalised returns, and the auxiliary loss (train/<name>_loss, the kind's name for it).
COPIED_TAGS = re.compile(r"eval/.*/normalized_return|train/(?!action_loss$)\w+_loss")


def _remove(folder: Path, suffix: str) -> None:
    for old in folder.glob(f"events.out.tfevents.*{suffix}"):
        old.unlink(missing_ok=True)


def _escape(task: str) -> str:
    """re.escape, but leaving "-" alone, so the layout stays readable."""
    return re.sub(r"([^A-Za-z0-9_-])", r"\\\1", task)


def run_layout(task: str, aux_loss_name: str) -> dict[str, dict[str, list]]:
    """A single run's layout (the trainer writes it into the run): the action loss, the
    auxiliary loss (the model's aux_loss_name: Primal's ksvd_loss) on a chart of its own, and
    the returns, normalised returns and episode lengths of every target; and its task's
    category, which TensorBoard merges with the other runs' of that task."""
    return {
        **layout([task]),
        "primal-dt run": {
            "action loss": ["Multiline", [r"^train/action_loss$"]],
            f"auxiliary loss ({aux_loss_name})": ["Multiline", [f"^train/{aux_loss_name}$"]],
            "normalised return per target": ["Multiline", [r"^eval/[^/]+/normalized_return$"]],
            "return per target": ["Multiline", [r"^eval/[^/]+/return$"]],
            "episode length per target": ["Multiline", [r"^eval/[^/]+/episode_length$"]],
        },
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
            "auxiliary loss (every run)": [
                "Multiline",
                [prefix + r"train/(?!action_loss$)\w+_loss$"],
            ],
        }
    return charts


def remove_root_layout(runs_dir: Path) -> None:
    """Remove the layout file that earlier versions of primal-dt wrote into RUNS_DIR itself, which
    TensorBoard lists as a run named "." (each run now carries its task's category)."""
    _remove(runs_dir, LAYOUT_SUFFIX)


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar series TensorBoard finds in folder's event files, by tag: all its points, as
    (step, value, wall_time)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def copy_run(run_dir: Path, task: str) -> int:
    """Copy a run's normalised returns and auxiliary loss under by_task/<task>/; returns the
    points."""
    from torch.utils.tensorboard import SummaryWriter

    _remove(run_dir, COPY_SUFFIX)
    series = {t: s for t, s in read_scalars(run_dir).items() if COPIED_TAGS.fullmatch(t)}
    points = 0
    with SummaryWriter(str(run_dir), filename_suffix=COPY_SUFFIX) as writer:
        for tag, scalars in series.items():
            for step, value, wall_time in scalars:
                writer.add_scalar(f"by_task/{task}/{tag}", value, step, wall_time)
                points += 1
    return points


def write_hparams(writer: Any, task: str, config: Config) -> None:
    """A run's settings in TensorBoard's HPARAMS tab, in the run's own directory."""
    from torch.utils.tensorboard.summary import hparams

    flat: dict[str, Any] = {"task": task}
    for section in ("model", "train", "eval"):
        for key, value in getattr(config, section).__dict__.items():
            flat[f"{section}.{key}"] = (
                value if isinstance(value, int | float | str | bool) else str(value)
            )
    experiment, session_start, session_end = hparams(
        flat, {"eval/final_normalized_return": float("nan")}
    )
    for summary in (experiment, session_start, session_end):
        writer.file_writer.add_summary(summary)
