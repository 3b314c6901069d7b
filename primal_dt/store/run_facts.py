"""What the report reads of a run from its checkpoint, kept as data (RUN_DIR/facts.json): the step
it reached, the steps it trains to, its parameter count and its attention spectra, and its
dataset's own score (the behaviour data's mean return, normalised as its scores are), which a
report made from the copy cannot read where the dataset is not on its machine.

`primal-dt report` writes it into the copy of each run it exports (the report's runs/ folder:
config.json, eval.jsonl, training.jsonl, the return curves and this), so that a study's report
can be made again from small text files, without the checkpoints: the results
page's data in the repository. A run with a checkpoint is read from the checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from primal_dt.store.atomic import atomic_write
from primal_dt.store.rundir import RunDir


@dataclass
class RunFacts:
    """A checkpoint's facts for the report."""

    step: int  # the step the checkpoint is at
    steps: int  # train.steps as its last session set it
    parameters: int  # the model's trainable parameters
    spectra: list[list[float]] | None  # each block's normalised cumulative singular values
    behaviour: float | None = None  # its datasets' mean episode return (None: not known)
    behaviour_normalized: bool = False  # ... normalised with the run's reference scores
    behaviour_episodes: int = 0  # ... over so many episodes


def write_facts(run: RunDir, facts: RunFacts) -> None:
    text = json.dumps(asdict(facts)) + "\n"
    atomic_write(run.facts, lambda file: file.write(text.encode()))


def read_facts(run: RunDir) -> RunFacts | None:
    """facts.json as written by write_facts; None where the run has none."""
    if not run.facts.exists():
        return None
    raw = json.loads(run.facts.read_text())
    spectra = raw["spectra"]
    return RunFacts(
        int(raw["step"]),
        int(raw["steps"]),
        int(raw["parameters"]),
        None if spectra is None else [[float(v) for v in block] for block in spectra],
        None if raw.get("behaviour") is None else float(raw["behaviour"]),
        bool(raw.get("behaviour_normalized", False)),
        int(raw.get("behaviour_episodes", 0)),
    )
