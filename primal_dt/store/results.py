"""Evaluation results: one EvalResult per evaluation, a line of RUN_DIR/eval.jsonl each.

The evaluator appends records (one write per line, so concurrent writers never interleave); the
trainer tails the file to print them as they arrive; `primal-dt eval --json`, sweeps and reports
read them. A line cut short by a crash is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primal_dt.data.episodes import ReferenceScores
from primal_dt.store.atomic import append_line, atomic_write
from primal_dt.store.rundir import RunDir


@dataclass
class TargetSummary:
    """The episodes of one target return: means and spreads of returns and normalised scores."""

    target: float
    return_mean: float
    return_std: float
    normalized_mean: float | None
    normalized_std: float | None
    length_mean: float
    episodes: int


@dataclass
class EvalResult:
    """One evaluation of one checkpoint, or (error set) why it could not be evaluated.

    score is the evaluation's one score, target_score: the normalised return at its first
    target; best says that this evaluation made the run's best.pt (the best score so far).
    """

    step: int
    checkpoint: str
    task: str = "?"
    dataset_ids: list[str] = field(default_factory=list)
    env_id: str = ""
    episodes: int = 0
    seed: int = 0
    final: bool = False
    reference: ReferenceScores | None = None
    results: list[TargetSummary] = field(default_factory=list)
    score: float | None = None
    seconds: float = 0.0
    # the runs rolled out together in one batched pass (a pack's: evaluation/packed.py), whose
    # `seconds` are the pass's; 1 for a run evaluated alone (and in records older than this field)
    pack: int = 1
    # the wall-clock time it ended (seconds since the epoch; None in records older than this
    # field): what ends a training session whose last act it was (training_log.training_sessions)
    finished_at: float | None = None
    dataset_best_return: float | None = None
    device: str = ""  # where the policy acted ("" in records older than this field)
    precision: str = ""  # the precision it acted in, the run's: fp32, or bf16 (autocast)
    videos: list[str] = field(default_factory=list)  # MP4 files of rendered episodes
    video_error: str | None = None  # why videos asked for were not made
    best: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"step": self.step, "checkpoint": self.checkpoint, "error": self.error}
        data = dataclasses.asdict(self)
        del data["error"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        if "error" in data:
            return cls(int(data["step"]), str(data["checkpoint"]), error=str(data["error"]))
        reference = data.get("reference")
        return cls(
            **{
                **data,
                "best": bool(data.get("best", False)),
                "reference": ReferenceScores(**reference) if reference else None,
                "results": [TargetSummary(**s) for s in data["results"]],
            }
        )


def target_score(record: EvalResult) -> float | None:
    """An evaluation's one score, wherever a score is printed, plotted, logged or compared (the
    report, the sweep, TensorBoard, best.pt): the normalised return at its first target (the run's
    eval.targets[0], else envs/<env>.toml eval_targets[0], the Decision Transformer paper's target
    for the task), or the return there where no reference scores are known. Never the best of the
    targets, which would pick the target after seeing the scores. Records written before the
    score was defined so are read by this definition too."""
    if not record.results:
        return record.score
    first = record.results[0]
    return first.return_mean if first.normalized_mean is None else first.normalized_mean


def read_results(run: RunDir) -> list[EvalResult]:
    """Every record in eval.jsonl; a line cut short by a crash is skipped."""
    return _parse(run.eval_log.read_bytes()) if run.eval_log.exists() else []


def _parse(data: bytes) -> list[EvalResult]:
    """The records of eval.jsonl lines; a line cut short by a crash (and continued by the next
    append) is skipped."""
    records = []
    for line in data.decode(errors="replace").splitlines():
        try:
            records.append(EvalResult.from_dict(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            continue
    return records


def final_missing(run: RunDir, step: int, final_episodes: int) -> bool:
    """Whether the checkpoint at `step` still lacks the final evaluation the run asks for
    (eval.final_episodes > 0): what --resume and sweeps complete for a run at its last step."""
    return final_episodes > 0 and not any(r.final and r.step == step for r in read_results(run))


def append_result(run: RunDir, record: EvalResult) -> None:
    """One line (atomic.append_line: never interleaved, never cut short by a full disk)."""
    append_line(run.eval_log, json.dumps(record.to_dict()) + "\n")


def drop_results_after(run: RunDir, step: int) -> None:
    """A resumed run trains those steps again, and their evaluations with them."""
    if run.eval_log.exists():
        records = read_results(run)
        kept = [r for r in records if r.step <= step]
        if len(kept) == len(records):
            return  # nothing after the checkpoint: the file stays as it was
        text = "".join(json.dumps(r.to_dict()) + "\n" for r in kept)
        atomic_write(run.eval_log, lambda file: file.write(text.encode()))


class ResultsTail:
    """The records of eval.jsonl not yet handed out: how the trainer hears of evaluations. The
    first `shown` records count as handed out already (None: all the file holds now)."""

    def __init__(self, run: RunDir, shown: int | None = None) -> None:
        self.path, self.offset = run.eval_log, 0
        present = self._read()
        self.shown = len(present) if shown is None else min(shown, len(present))
        self._unshown = present[self.shown :]

    def _read(self) -> list[EvalResult]:
        """The records of the complete lines appended since the last read."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return _parse(complete)

    def new(self) -> list[EvalResult]:
        records, self._unshown = self._unshown + self._read(), []
        self.shown += len(records)
        return records


def describe(record: EvalResult) -> str:
    """One line for the progress output."""
    if record.error is not None:
        return f"step {record.step}: evaluation failed: {record.error}"
    parts = []
    for s in record.results:
        score = "" if s.normalized_mean is None else f" (normalized {s.normalized_mean:.1f})"
        parts.append(f"target {s.target:g}: return {s.return_mean:.1f}{score}")
    kind = "final evaluation" if record.final else "evaluation"
    together = f" (its pack's {record.pack} runs at once)" if record.pack > 1 else ""
    line = f"step {record.step}: {kind} over {record.episodes} episodes{together}, "
    line += ", ".join(parts)
    if record.videos:
        line += f"; {len(record.videos)} videos in {Path(record.videos[0]).parent}"
    if record.video_error:
        line += f"; no videos: {record.video_error}"
    return line


def _mean_std(mean: float | None, std: float | None) -> str:
    if mean is None or std is None or not math.isfinite(mean):
        return "n/a"
    return f"{mean:.1f} ± {std:.1f}"


def format_table(records: list[EvalResult]) -> str:
    """One table for evaluation records of any runs: a row per checkpoint and target, with the
    reference scores each normalised score was computed from as numbered notes below it."""
    header = ["checkpoint", "task", "step", "target", "return", "normalized", "episodes", "ref"]
    rows, sources = [], []
    for record in records:
        ref = record.reference
        note = "-"
        if ref is not None:
            text = f"random {ref.random:.2f}, expert {ref.expert:.2f}: {ref.source}"
            if text not in sources:
                sources.append(text)
            note = f"[{sources.index(text) + 1}]"
        if record.error is not None:
            rows.append(
                [
                    record.checkpoint,
                    record.task,
                    str(record.step),
                    "-",
                    "evaluation failed: " + record.error,
                    "",
                    "",
                    "",
                ]
            )
            continue
        for s in record.results:
            rows.append(
                [
                    record.checkpoint,
                    record.task,
                    str(record.step),
                    f"{s.target:.1f}",
                    _mean_std(s.return_mean, s.return_std),
                    _mean_std(s.normalized_mean, s.normalized_std),
                    str(s.episodes),
                    note,
                ]
            )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {"step", "target", "return", "normalized", "episodes"}
    lines = [
        "  ".join(
            cell.rjust(width) if name in right else cell.ljust(width)
            for name, cell, width in zip(header, row, widths, strict=True)
        ).rstrip()
        for row in [header, *rows]
    ]
    lines += [f"[{i}] reference scores: {text}" for i, text in enumerate(sources, 1)]
    if any(record.reference is None and record.error is None for record in records):
        lines.append("-: no reference scores known for this environment, no normalised score")
    trained_on = {(r.task, " + ".join(r.dataset_ids)) for r in records if r.dataset_ids}
    lines += [f"{task} was trained on {ids}" for task, ids in sorted(trained_on)]
    return "\n".join(lines)
