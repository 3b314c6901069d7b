"""The plan of `primal-dt sweep` (sweep.py runs it): a grid of tasks x configs x seeds, each cell
a run directory RUNS_DIR/<task>/<config>-s<seed> with the action its directory calls for.

Planning checks everything before anything is written into RUNS_DIR: the tasks, configs, kinds and
--set keys, and each cell's directory (a checkpoint of another experiment there is refused, naming
the setting that differs). Each cell gets an action from what its directory holds: start (no
checkpoint; what a failed start left is removed first), resume (a checkpoint short of its steps),
evaluate (at its steps, without its final evaluation) or finished (skipped), so a sweep started
again carries on where it stopped. A start is `primal-dt train --env --config --run-dir` with the
cell's settings as --set overrides (option_overrides, the mapping the command line uses); resume
and evaluate are `primal-dt train --resume RUN_DIR --steps N`. Cells of one task and config with
one action at one step may be grouped into packs (group_packs), each one such command with
--seeds or with several --resume directories (pack_command).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from primal_dt.common.config import MECHANICS, Config
from primal_dt.common.errors import PrimalDTError, check_folder
from primal_dt.common.loading import load_config, named_config_path, option_overrides
from primal_dt.data.tasks import resolve_task
from primal_dt.method.registry import check_kinds, check_settings_by_task
from primal_dt.store.results import final_missing
from primal_dt.store.rundir import RunDir, run_dir_name
from primal_dt.store.snapshots import read_snapshot

# What a run training on CUDA asks Ray for where --gpus-per-run is not given: 4 runs share a GPU.
GPUS_PER_CUDA_RUN = 0.25


class SweepError(PrimalDTError):
    """A sweep that cannot start: a bad option, or a run directory holding another experiment."""


@dataclass
class SweepOptions:
    tasks: list[str]
    seeds: list[int]
    configs: list[str]
    runs_dir: Path = Path("runs")
    parallel: int = 1
    steps: int | None = None
    device: str | None = None
    final_episodes: int | None = None
    offline: bool = False
    overrides: list[str] = field(default_factory=list)
    ray_address: str | None = None
    gpus_per_run: float | None = None  # None: GPUS_PER_CUDA_RUN for runs on CUDA, 0 on CPUs
    cpus_per_run: int = 1
    pack: int | None = None  # runs per pack; None: packs_by_default

    def validate(self) -> SweepOptions:
        for name in ("tasks", "seeds", "configs"):
            if not getattr(self, name):
                raise SweepError(f"--{name} is empty; give a comma-separated list")
        bad = [seed for seed in self.seeds if not 0 <= seed < 2**32]  # train.seed's range
        if bad:
            raise SweepError(f"--seeds must be in 0..{2**32 - 1}, got {bad[0]}")
        if self.parallel < 1:
            raise SweepError(f"--parallel must be >= 1, got {self.parallel}")
        if self.pack is not None and self.pack < 1:
            raise SweepError(f"--pack must be >= 1 (1: no packs), got {self.pack}")
        if (self.gpus_per_run or 0) < 0 or self.cpus_per_run < 1:
            raise SweepError("--gpus-per-run must be >= 0 and --cpus-per-run >= 1")
        check_folder(self.runs_dir, "--runs-dir")
        return self


def parse_list(text: str, option: str, kind: Callable[[str], Any] = str) -> list[Any]:
    """'a,b,,c' -> [a, b, c], duplicates dropped; a bad item names the option."""
    items = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = kind(part)
        except ValueError:
            raise SweepError(f"{option}: {part!r} is not valid (e.g. {option} 0,1,2)") from None
        if value not in items:
            items.append(value)
    return items


@dataclass(frozen=True)
class GridCell:
    """One cell of the grid and what the sweep has to do with it."""

    task: str
    config: str  # the config's name (file stem), used in the directory name
    config_arg: str  # how to pass it to `primal-dt train --config`
    seed: int
    run_dir: RunDir
    steps: int
    overrides: list[str]  # the run's settings as --set overrides
    device: str = "auto"  # train.device it trains on: the sweep's, or its checkpoint's if resumed
    action: str = "start"  # start | resume | evaluate (resume for the final evaluation) | finished
    from_step: int = 0

    @property
    def name(self) -> str:
        return str(run_dir_name(self.task, self.config, self.seed))


def config_difference(saved: Config, wanted: Config) -> str | None:
    """The first setting (outside MECHANICS) where a saved run's config differs from the sweep's."""
    old_values, new_values = saved.to_dict(), wanted.to_dict()
    for section, values in new_values.items():
        if not isinstance(values, dict) or section == "attention_settings_by_task":
            if old_values[section] != values:
                return f"{section} = {old_values[section]!r} (the sweep asks for {values!r})"
            continue
        for key, value in values.items():
            old = old_values[section][key]
            if (section, key, value) == ("train", "precision", "auto"):
                continue  # a run records what "auto" resolved to where it started, and keeps it
            if key not in MECHANICS.get(section, ()) and old != value:
                return f"{section}.{key} = {old!r} (the sweep asks for {value!r})"
    return None


def with_action(cell: GridCell, config: Config | None = None) -> GridCell:
    """The cell with its action decided from what its directory holds (a new object; cell is left
    as it was); with config, also check that the run found there is the experiment the sweep asks
    for."""
    if not cell.run_dir.checkpoint.exists():
        return replace(cell, action="start")
    snapshot = read_snapshot(cell.run_dir.checkpoint)
    if config is not None:
        differs = config_difference(snapshot.config, config)
        if differs is not None:
            raise SweepError(
                f"{cell.run_dir} holds a run with {differs}; remove that directory or use another "
                f"--runs-dir"
            )
    if snapshot.step < cell.steps:
        action = "resume"
    elif not final_missing(cell.run_dir, snapshot.step, snapshot.config.eval.final_episodes):
        action = "finished"
    else:
        action = "evaluate"
    device = snapshot.config.train.device
    return replace(cell, action=action, from_step=snapshot.step, device=device)


def plan(options: SweepOptions) -> list[GridCell]:
    """Every cell of the grid, seed by seed (so a partial sweep covers every task), checked now:
    unknown tasks, configs and --set keys fail before anything starts."""
    for task in options.tasks:
        resolve_task(task)
    configs = {}
    for given in options.configs:
        path = named_config_path(given)
        if path.stem in configs:
            raise SweepError(f"--configs: two configs are named {path.stem!r}; rename one file")
        arg = str(path.resolve()) if Path(given).suffix == ".toml" else given
        configs[path.stem] = (path, arg)
    cells = []
    for seed in options.seeds:
        for task in options.tasks:
            for name, (path, arg) in configs.items():
                overrides = [
                    *options.overrides,
                    *option_overrides(
                        steps=options.steps,
                        seed=seed,
                        device=options.device,
                        final_episodes=options.final_episodes,
                        offline=options.offline,
                    ),
                ]
                config = load_config(path, overrides, task)
                check_kinds(config.model)  # kinds and their settings, before anything starts
                check_settings_by_task(config.attention_settings_by_task)
                run_dir = RunDir(options.runs_dir.resolve() / run_dir_name(task, name, seed))
                steps, device = config.train.steps, config.train.device
                cell = GridCell(task, name, arg, seed, run_dir, steps, overrides, device)
                cells.append(with_action(cell, config))
    return cells


def command(cell: GridCell, options: SweepOptions) -> list[str]:
    """The `primal-dt train` command line that does the cell's action: the one place a cell
    becomes train's arguments (tests/test_sweep.py parses them back with the CLI's parser)."""
    train = [sys.executable, "-m", "primal_dt.cli", "train", "--no-progress"]
    if cell.action in ("resume", "evaluate"):
        offline = ["--offline"] if options.offline else []
        return [*train, "--resume", str(cell.run_dir), "--steps", str(cell.steps), *offline]
    train += ["--env", cell.task, "--config", cell.config_arg, "--run-dir", str(cell.run_dir)]
    for setting in cell.overrides:
        train += ["--set", setting]
    return train


def pack_size(options: SweepOptions, cells: list[GridCell], cuda_here: bool) -> int:
    """Runs per pack: --pack where given; else, where the runs train on CUDA (train.device cuda,
    or auto on a machine or Ray cluster with a GPU), every seed of a task and config in one pack;
    on CPUs no packs (a pack there is opt-in)."""
    if options.pack is not None:
        return options.pack
    on_cuda = any(c.device.startswith("cuda") or (c.device == "auto" and cuda_here) for c in cells)
    return len(options.seeds) if on_cuda else 1


def group_packs(cells: list[GridCell], size: int) -> list[list[GridCell]]:
    """The cells to train, in packs of at most `size`: a pack holds runs of one task and config
    with one action at one step (runs that differ only in their seed), in the grid's order."""
    groups: dict[tuple[str, str, str, int, int], list[GridCell]] = {}
    for cell in cells:
        groups.setdefault((cell.task, cell.config, cell.action, cell.from_step, cell.steps), [])
        groups[(cell.task, cell.config, cell.action, cell.from_step, cell.steps)].append(cell)
    packs = [
        group[start : start + size]
        for group in groups.values()
        for start in range(0, len(group), size)
    ]
    order = {cell.name: index for index, cell in enumerate(cells)}
    return sorted(packs, key=lambda pack: order[pack[0].name])


def describe_packs(packs: list[list[GridCell]]) -> str:
    """One line: how the runs are packed, and why runs are packed apart."""
    sizes = ", ".join(f"{pack[0].task} x {pack[0].config}: {len(pack)}" for pack in packs)
    return (
        f"packs: {sum(map(len, packs))} runs in {len(packs)} packs ({sizes}); runs of different "
        f"tasks, configs or steps train in separate packs"
    )


def pack_command(cells: list[GridCell], options: SweepOptions) -> list[str]:
    """The `primal-dt train` command line that trains the cells as one pack (command's, for one
    cell): --seeds with --runs-dir to start them, --resume with every run directory to go on."""
    if len(cells) == 1:
        return command(cells[0], options)
    first = cells[0]
    train = [sys.executable, "-m", "primal_dt.cli", "train", "--no-progress"]
    if first.action in ("resume", "evaluate"):
        offline = ["--offline"] if options.offline else []
        dirs = [str(cell.run_dir) for cell in cells]
        return [*train, "--resume", *dirs, "--steps", str(first.steps), *offline]
    seeds = ",".join(str(cell.seed) for cell in cells)
    train += ["--env", first.task, "--config", first.config_arg, "--seeds", seeds]
    train += ["--runs-dir", str(options.runs_dir.resolve())]
    for setting in first.overrides:
        if not setting.startswith("train.seed="):
            train += ["--set", setting]
    return train
