"""Runs a study need not train: those the matched sections keep (results-data/) of a config, task
and seed the study asks for, with the same settings.

The seven attentions' study has matched-softmax and matched-primal on halfcheetah-medium, and the
initialisations' study has matched-primal (the configs' own initialisation) on the three medium
datasets: the matched study has trained them already, seed for seed. Trained again with the same
settings on the same kind of machine they give the same bits (the page's initialisation paragraph
checked it; so did matched-primal's seed 0 on halfcheetah-medium, trained again on a fresh machine
from a dataset recorded again, whose logged losses and gradient norms were the kept run's to the
bit for the 5,000 steps it ran), so the study reads them from what the matched sections keep,
which saves two of the attentions' seven configs and one of the initialisations' two. A config is
taken only where every task and seed of the study has such a run, finished (its final evaluation
recorded), and with the same settings as the run the sweep would start (grid.config_difference:
the settings that make a result, not how it is logged or checkpointed); else it is trained, so
that a study is never a mix of one config's kept and new runs. `--no-reuse` trains everything.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from primal_dt.common.errors import CheckpointError
from primal_dt.common.loading import load_config, option_overrides
from primal_dt.store.results import final_missing
from primal_dt.store.run_facts import read_facts
from primal_dt.store.runconfig import read_run_config
from primal_dt.store.rundir import RunDir, run_dir_name
from primal_dt.tools.grid import config_difference


@dataclass(frozen=True)
class Reused:
    """A config whose runs the study reads from a kept section instead of training them."""

    config: str  # the config's name (its file's stem), as the runs record it
    runs: list[Path]  # one kept run folder per task and seed
    sections: list[str]  # the kept sections they come from, by name


def _kept_run(
    config: Path, task: str, seed: int, sections: Sequence[Path], overrides: list[str]
) -> Path | None:
    """The first kept run of config on task with seed, finished, whose settings are those the
    sweep would start it with (overrides: the study's, as grid.plan gives them), or None."""
    wanted = load_config(config, [*overrides, *option_overrides(seed=seed)], task)
    for section in sections:
        run = RunDir(section / run_dir_name(task, config.stem, seed))
        if not run.config_file.is_file():
            continue
        try:
            saved = read_run_config(run)
        except CheckpointError:
            continue
        if (saved.task, saved.config_name) != (task, config.stem):
            continue
        if config_difference(saved.config, wanted) is not None:
            continue
        facts = read_facts(run)
        steps = wanted.train.steps
        if (
            facts is not None
            and facts.step == steps
            and not final_missing(run, steps, wanted.eval.final_episodes)
        ):
            return run.path
    return None


def reusable(
    configs: Sequence[Path],
    tasks: Sequence[str],
    seeds: Sequence[int],
    sections: Sequence[Path],
    overrides: list[str],
) -> list[Reused]:
    """The configs every one of whose (task, seed) runs a kept section holds, finished and with
    the same settings (sections searched in order; overrides: the sweep's --set for every run,
    seed apart), with those runs."""
    found = []
    for config in configs:
        runs = [_kept_run(config, t, s, sections, overrides) for s in seeds for t in tasks]
        if runs and all(run is not None for run in runs):
            kept = [run for run in runs if run is not None]
            names = list(dict.fromkeys(run.parents[1].name for run in kept))
            found.append(Reused(config.stem, kept, names))
    return found


def gather(reused: Sequence[Reused], folder: Path) -> Path:
    """The reused runs copied into folder as <task>/<run> (what `primal-dt report` reads beside
    the study's own runs), folder emptied first; returns folder."""
    shutil.rmtree(folder, ignore_errors=True)
    for config in reused:
        for run in config.runs:
            shutil.copytree(run, folder / run.parent.name / run.name)
    return folder


def reuse_note(reused: Sequence[Reused]) -> str:
    """What the section's first line adds: whose runs were read, not trained, and from where (the
    line's minutes count their own training, when the matched sections made them)."""
    return "".join(
        f" {config.config}'s runs are those results-data/{', '.join(config.sections)} keeps (the "
        f"same settings, tasks and seeds): read, not trained again; the minutes of training count "
        f"theirs too, from when those sections made them."
        for config in reused
    )
