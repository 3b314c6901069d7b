"""Everything primal-dt writes to TensorBoard, and the only module that writes it: the trainer's
scalars (train/*), the evaluator's (eval/*, and its episodes as GIFs), a run's settings (HPARAMS)
and its Custom Scalars layout, and the per-task copies below. Nothing reads TensorBoard's files
back: the report reads the runs' records (eval.jsonl, training.jsonl), and so do the copies.

The Custom Scalars tab: for one run, its action loss and its auxiliary (KSVD) loss each on a chart
of its own (the auxiliary loss is orders of magnitude smaller, and TensorBoard's charts have one
axis; each chart's log-scale button is the reader's), and its returns per target; for a runs
directory, per task, every run's normalised returns in one chart and their auxiliary losses in
another.

A custom-scalars chart selects tags by regular expression but always draws every run, so charts
per task need tags that name the task. When a run finishes (`primal-dt train`, alone or in a
pack, and so every run of a sweep), its normalised returns (eval.jsonl) and its auxiliary loss
(training.jsonl) are written into its own directory as `by_task/<task>/...` (an extra event file,
rewritten on each copy; `report` copies again, for runs made before); each run's own layout
(written when it starts) has, beside its own charts, a category for its task that selects those,
and TensorBoard merges the categories of the same title over runs. `tensorboard --logdir RUNS_DIR`
then shows DT against Primal-DT per task, with nothing written into RUNS_DIR itself (an event
file there is a run named ".").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primal_dt.common.config import Config
from primal_dt.store.results import EvalResult, read_results
from primal_dt.store.rundir import EVAL_EVENTS_SUFFIX, RunDir
from primal_dt.store.training_log import current, read_points

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

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


def copy_run(run_dir: Path, task: str) -> int:
    """Write a run's normalised returns (eval.jsonl) and auxiliary loss (training.jsonl) under
    by_task/<task>/, replacing the last copy; returns the points."""
    run = RunDir(run_dir)
    series: dict[str, list[tuple[int, float, float | None]]] = {}
    for record in read_results(run):
        for s in record.results if record.error is None else []:
            if s.normalized_mean is not None:
                tag = f"eval/{s.target:g}/normalized_return"
                series.setdefault(tag, []).append(
                    (record.step, s.normalized_mean, record.finished_at)
                )
    for point in current(read_points(run.training_log)):  # as the run now stands
        for name, value in point.scalars.items():
            if COPIED_TAGS.fullmatch(f"train/{name}"):
                series.setdefault(f"train/{name}", []).append((point.step, value, point.time))
    _remove(run_dir, COPY_SUFFIX)
    points = 0
    with _writer(run_dir, COPY_SUFFIX) as writer:
        for tag, scalars in series.items():
            for step, value, wall_time in scalars:
                writer.add_scalar(f"by_task/{task}/{tag}", value, step, wall_time)
                points += 1
    return points


def _writer(run_dir: Path, suffix: str = "", purge_step: int | None = None) -> SummaryWriter:
    """A SummaryWriter on run_dir (imported here: TensorBoard loads only where it is written)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir), purge_step=purge_step, filename_suffix=suffix)


def training_writer(
    run_dir: Path, step: int, task: str, config: Config, aux_loss_name: str
) -> SummaryWriter:
    """The trainer's writer for a session starting at `step`: a new run's gets its settings and
    layout. A resumed one drops every event (train/* and eval/*) logged after the checkpoint by
    the interrupted session. Only this writer purges: TensorBoard reads a run's event files in
    the order they were created and a purge drops the points of every file read before it, so it
    must come from the first file the resumed session creates."""
    writer = _writer(run_dir, purge_step=step + 1 if step else None)
    if step == 0:
        write_hparams(writer, task, config)
        writer.add_custom_scalars(run_layout(task, aux_loss_name))
    return writer


def log_training(writer: SummaryWriter, step: int, scalars: dict[str, float]) -> None:
    """One log point's means, as train/<name>."""
    for name, value in scalars.items():
        writer.add_scalar(f"train/{name}", value, step)


def evaluation_writer(run_dir: Path) -> SummaryWriter:
    """The evaluator's writer: never with a purge_step (training_writer says why)."""
    return _writer(run_dir, EVAL_EVENTS_SUFFIX)


def log_evaluation(writer: SummaryWriter, record: EvalResult) -> None:
    """One evaluation's returns, normalised returns and episode lengths per target, and the final
    evaluation's score."""
    for s in record.results:
        tag = f"eval/{s.target:g}"
        writer.add_scalar(f"{tag}/return", s.return_mean, record.step)
        writer.add_scalar(f"{tag}/episode_length", s.length_mean, record.step)
        if s.normalized_mean is not None:
            writer.add_scalar(f"{tag}/normalized_return", s.normalized_mean, record.step)
    if record.final and record.reference is not None:
        writer.add_scalar("eval/final_normalized_return", record.score, record.step)
    writer.flush()


def log_spectrum(writer: SummaryWriter, step: int, images: list[tuple[int, Any]]) -> None:
    """Each block's attention spectrum (spectrum.spectrum_images): `spectrum/block_<i>/rank_90`
    and the image `spectrum/block_<i>`."""
    for i, (rank, _) in enumerate(images):
        writer.add_scalar(f"spectrum/block_{i}/rank_90", rank, step)
    for i, (_, image) in enumerate(images):
        writer.add_image(f"spectrum/block_{i}", image, step, dataformats="HWC")


def log_summary(writer: SummaryWriter, summary: Any, step: int) -> None:
    """A summary made elsewhere (video.py's GIFs), at step."""
    writer._get_file_writer().add_summary(summary, step)


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
