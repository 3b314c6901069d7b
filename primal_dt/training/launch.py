"""Assembling a run: a new one in its run directory, or an interrupted one resumed from its
checkpoint. Everything is checked before anything is written."""

from __future__ import annotations

import copy
import dataclasses
import random
import re
import time
from pathlib import Path

import numpy as np
import torch

from primal_dt.common.config import Config, flat_settings
from primal_dt.common.cpu import training_threads
from primal_dt.common.device import (
    Precision,
    adamw,
    machine_name,
    precision_chosen,
    precision_note,
    recorded_precision,
    resolve_device,
    resolve_precision,
)
from primal_dt.common.errors import CheckpointError, ConfigError, check_folder
from primal_dt.data.episodes import TaskData, WindowSampler, load_task_data
from primal_dt.data.tasks import Task
from primal_dt.evaluation.evaluators import make_evaluator
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import check_kinds, check_settings_by_task
from primal_dt.store.atomic import atomic_copy
from primal_dt.store.locks import RunLock
from primal_dt.store.results import drop_results_after, final_missing
from primal_dt.store.runconfig import RunConfig, read_run_config, write_run_config
from primal_dt.store.rundir import RunDir, folder_of, run_dir_name, run_of, step_of
from primal_dt.store.snapshots import Snapshot, read_snapshot, unsealed_note
from primal_dt.training.memory import check_step_fits
from primal_dt.training.pack import Pack, check_packable
from primal_dt.training.step import warmup_schedule
from primal_dt.training.trainer import Trainer


def kept_checkpoint(run: RunDir, given: Path) -> Path:
    """The kept checkpoint --from names: its file, or its step as a number or a file name with
    any zero padding (--from 1000 and step_1000.pt both name checkpoints/step_00001000.pt)."""
    match = re.fullmatch(r"(?:step_)?(\d+)(?:\.pt)?", given.name)
    beside = given.parent.resolve() in (Path().resolve(), run.checkpoints.resolve())
    if match and beside and not given.is_file():
        return run.step_checkpoint(int(match.group(1)))
    return given


def kept_steps(run: RunDir) -> str:
    """The steps of a run's kept checkpoints, for messages: "1000, 2000" or "none kept"."""
    return ", ".join(str(step_of(path)) for path in run.saved_checkpoints()) or "none kept"


def read_resumable(run: RunDir, rollback: Path | None) -> Snapshot:
    """The snapshot a resume continues from: the run's ckpt.pt, or the kept checkpoint rolled back
    to. A checkpoint that cannot be read is an error that says how to start from another one."""
    if rollback is not None:
        if not rollback.is_file() or rollback.resolve().parent != run.checkpoints.resolve():
            raise ConfigError(
                f"--from takes one of {run}'s kept checkpoints, by step or file "
                f"({kept_steps(run)}), not {rollback}"
            )
        return read_snapshot(rollback)
    try:
        return read_snapshot(run.path)
    except CheckpointError as err:
        kept = run.saved_checkpoints()
        if not kept:
            raise
        raise CheckpointError(
            f"{err}; to continue from the newest of them: primal-dt train --resume {run.path} "
            f"--from {kept[-1]}"
        ) from None


# What a resume may set otherwise than the run was started with (--steps, --offline).
RESUME_SETS = ("train.steps", "data.download")


def record_machine(run: RunDir, started: RunConfig | None, trainer: Trainer) -> None:
    """A run resumed on another machine than it last trained on says so, and config.json lists
    it after the others (another CPU gives other bits: a result is then of more than one)."""
    if started is None:
        return
    machine = machine_name(trainer.device)
    if started.machines and started.machines[-1] != machine:
        trainer.notes.append(
            f"this run trained on {started.machines[-1]} and goes on on {machine}: its results "
            "are of both (another CPU or GPU gives other bits)"
        )
    if not started.machines or started.machines[-1] != machine:
        started.machines.append(machine)
        write_run_config(run, started)


def check_unedited(run: RunDir, started_with: RunConfig | None, config: Config) -> None:
    """A resumed run keeps the settings it was saved with; config.json, which says what it was
    started with, must still agree, or the resume is refused naming the settings that differ
    (an edited config.json would otherwise be ignored without a word). train.steps and
    data.download are left out: --steps and --offline change them on resume; so is
    train.precision where either says "auto", which older runs recorded and a resume resolves
    (recorded_precision). started_with is None where config.json was removed: nothing to
    compare."""
    if started_with is None:
        return
    started, saved = flat_settings(started_with.config), flat_settings(config)
    settings_file = run.config_file.name
    edited = [
        f"{key} ({saved.get(key)!r} in the checkpoint, {started.get(key)!r} in {settings_file})"
        for key in sorted(started.keys() | saved.keys())
        if key not in RESUME_SETS
        and started.get(key) != saved.get(key)
        and not (key == "train.precision" and "auto" in (started[key], saved[key]))
    ]
    if edited:
        raise ConfigError(
            f"{run.config_file} differs from the settings {run} was trained with: "
            f"{', '.join(edited)}; a resumed run keeps its checkpoint's settings, so put "
            f"{settings_file} back, or train a new run with the new settings (--set KEY=VALUE)"
        )


def length_of(run: RunDir) -> int | None:
    """The steps a run's latest checkpoint trains to (train.steps, which --steps extends), or None
    where it cannot be read."""
    try:
        return read_snapshot(run.checkpoint).config.train.steps
    except CheckpointError:
        return None


def with_precision(config: Config, precision: Precision) -> Config:
    """A copy of config whose train.precision is the resolved one (the caller's is left as it
    was asked)."""
    return dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def assemble(config: Config, data: TaskData, run_dir: Path) -> Trainer:
    """A trainer at step 0: the device, thread count and seeds set, the model (compiled where
    train.compile asks), its optimiser, scheduler and sampler, and the run's evaluator, chosen
    here once (eval.service). Every setting is checked before anything is written."""
    device = resolve_device(config.train.device, "train.device")
    # Resolved once: the run records what "auto" resolved to (config.json, hparams, checkpoints,
    # eval records), and everything after reads that (device.as_precision).
    config = with_precision(config, resolve_precision(config.train.precision, device))
    check_step_fits(config, data.state_dim, data.act_dim, device)
    evaluator = make_evaluator(config, RunDir(run_dir))
    if device.type == "cpu":
        # One count for the whole run: the weights' bits depend on it (cpu.py).
        torch.set_num_threads(training_threads(config.train.threads))
    seed_everything(config.train.seed)
    state_mean, state_std = data.state_stats()
    longest = max(len(ep.rewards) for ep in data.episodes)
    model = DecisionTransformer(
        config.model, data.state_dim, data.act_dim, max(data.max_episode_steps, longest)
    ).to(device)
    train = config.train
    optimizer = adamw(model.parameters(), device, lr=train.lr, weight_decay=train.weight_decay)
    scheduler = warmup_schedule(optimizer, train.warmup_steps)
    sampler = WindowSampler(
        data.episodes,
        state_mean,
        state_std,
        config.model.context_len,
        train.return_scale,
        device,
        seed=train.seed,
    )
    return Trainer(
        config,
        data,
        RunDir(run_dir),
        device,
        model,
        optimizer,
        scheduler,
        sampler,
        evaluator,
        state_mean,
        state_std,
    )


def default_run_dir(task: str, config_name: str, seed: int) -> Path:
    """runs/<task>/<config>-s<seed>-<time>."""
    return Path("runs") / run_dir_name(task, config_name, seed, time.strftime("%Y%m%d-%H%M%S"))


def check_free(run_dir: Path) -> None:
    """A new run may start in run_dir: no live run holds it, and it holds no run."""
    check_folder(run_dir, "--run-dir")
    run = RunDir(run_dir)
    lock = RunLock(run, "train")
    holder = lock.holder()
    if holder is not None:  # a live run, whether or not it has saved a checkpoint yet
        raise lock.busy(holder)
    if run.checkpoint.exists():
        raise CheckpointError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir} "
            f"or choose another --run-dir"
        )


def start_run(
    config: Config,
    task: Task,
    run_dir: Path,
    config_name: str = "default",
    data: TaskData | None = None,
) -> Trainer:
    """A new run in run_dir, which must not already hold one; config_name names the config file
    the run came from, for reports. data: the task's data where it is loaded already."""
    run = RunDir(run_dir)
    check_free(run_dir)
    check_kinds(config.model)  # before the dataset is loaded
    check_settings_by_task(config.attention_settings_by_task)
    data = data or load_task_data(task, config.data.download)
    asked = config.train.precision
    trainer = assemble(config, data, run_dir)  # everything is checked: now write
    trainer.notes.append(precision_chosen(asked, trainer.device))
    trainer.hold()
    if run.checkpoint.exists():  # another train got here first
        trainer.release()
        raise CheckpointError(f"{run_dir} already holds a run; choose another --run-dir")
    if run.unsaved_start:
        run.clear_start()
        trainer.notes.append(f"cleared an earlier start in {run_dir} that saved no checkpoint")
    machine = machine_name(trainer.device)
    write_run_config(run, RunConfig(task.name, config_name, trainer.config, [machine]))
    return trainer


def resume_run(
    path: Path,
    steps: int | None = None,
    download: bool | None = None,
    rollback: Path | None = None,
    data: TaskData | None = None,
    snapshot: Snapshot | None = None,
) -> Trainer:
    """Continue the run in `path` (a run directory or its ckpt.pt) from its checkpoint, to its
    configured or to `steps` steps, or only to its final evaluation where that is what is left.
    With `rollback` (one of the run's checkpoints/step_N.pt), continue from that step instead: what
    the run did after it (checkpoints, evaluations, logs) is dropped, and the run goes on as if it
    had been stopped there, bit for bit. data: the task's data where it is loaded already;
    snapshot: its checkpoint where it is read already (a pack's)."""
    run = run_of(path)
    rollback = kept_checkpoint(run, rollback) if rollback is not None else None
    if path.is_file() and path != run.checkpoint:
        raise ConfigError(
            f"--resume takes a run directory, and {path} is a checkpoint file; to roll its run "
            f"back to it: primal-dt train --resume {folder_of(path).path} --from {path}"
        )
    lock = RunLock(run, "train")
    holder = lock.holder()
    if holder is not None:  # also before its first checkpoint, when nothing else says it is a run
        raise lock.busy(holder)
    snapshot = snapshot or read_resumable(run, rollback)
    config = snapshot.config
    started = read_run_config(run) if run.config_file.is_file() else None  # config.json
    check_unedited(run, started, config)
    latest_steps = None if rollback is None else length_of(run)
    continue_to(run, snapshot, config, steps, download)
    record = snapshot.task
    data = data or load_task_data(record.task(), config.data.download)
    if data.env_id != record.env_id:
        raise CheckpointError(
            f"{run} was trained on {record.env_id} but its dataset is now for {data.env_id}"
        )
    # A run keeps the precision it started in (older checkpoints say "auto": recorded_precision).
    device = resolve_device(config.train.device, "train.device")
    config = with_precision(config, recorded_precision(config.train.precision, device))
    trainer = assemble(config, data, run.path)
    note = precision_note(config.train.precision, trainer.device)
    trainer.notes.extend([note] if note else [])
    trainer.restore(snapshot)
    if not snapshot.sealed:
        trainer.notes.append(unsealed_note(rollback or run.checkpoint))
    trainer.hold()
    record_machine(run, started, trainer)
    if rollback is not None:
        longer = steps is None and latest_steps is not None and latest_steps > config.train.steps
        roll_back(run, rollback, trainer, latest_steps if longer else None)
    # The steps after the checkpoint are trained again, and evaluated again with them.
    drop_results_after(run, trainer.step)
    for queued in run.queued_snapshots():
        if step_of(queued) > trainer.step:
            queued.unlink()
    return trainer


def continue_to(
    run: RunDir, snapshot: Snapshot, config: Config, steps: int | None, download: bool | None
) -> None:
    """Set config to what resuming asks (`--steps`, `--download`), refusing, before anything is
    loaded or written, a length before the checkpoint and a run with nothing left to do (at its
    end, with its final evaluation)."""
    if steps is not None:
        if steps < snapshot.step:
            raise ConfigError(
                f"--steps {steps} is before {run}'s step {snapshot.step}; pass --steps N with "
                f"N > {snapshot.step} to train further, or roll the run back to a kept checkpoint "
                f"with --from STEP, one of {kept_steps(run)}"
            )
        config.train.steps = steps
    if download is not None:
        config.data.download = download
    at_end = snapshot.step >= config.train.steps
    if at_end and not final_missing(run, snapshot.step, config.eval.final_episodes):
        raise ConfigError(
            f"{run} has trained all its {config.train.steps} steps; "
            f"pass --steps N with N > {snapshot.step} to train further"
        )


def roll_back(run: RunDir, rollback: Path, trainer: Trainer, extended_to: int | None) -> None:
    """Make rollback (restored into trainer) the run's checkpoint and drop the later ones, with a
    note (and the length the run had since been extended to, where it was): ckpt.pt first, so
    that a run stopped meanwhile resumes from the step rolled to."""
    atomic_copy(rollback, run.checkpoint)
    for later in run.saved_checkpoints():
        if step_of(later) > trainer.step:
            later.unlink()
    trainer.notes.append(
        f"rolled back to step {trainer.step}: what the run did after it is dropped; it trains "
        f"to step {trainer.config.train.steps}, the length that checkpoint was saved with"
        + (
            f" (the run had since been extended to {extended_to} steps: pass --steps "
            f"{extended_to} to train as far)"
            if extended_to is not None
            else ""
        )
    )


def with_seeds(config: Config, seeds: list[int]) -> list[Config]:
    """One copy of config per seed, train.seed set to it."""
    configs = []
    for seed in seeds:
        run_config = copy.deepcopy(config)
        run_config.train.seed = seed
        configs.append(run_config)
    return configs


def start_pack(configs: list[Config], task: Task, run_dirs: list[Path], config_name: str) -> Pack:
    """New runs, one per config (of one task, packable: pack.check_packable), each in its run
    directory, trained as one pack (pack.py). Every directory and setting is checked before
    anything is written; the data loads once."""
    seeds = [config.train.seed for config in configs]
    if len(seeds) != len(set(seeds)):
        raise ConfigError(f"a pack's seeds must differ, got {seeds}")
    check_packable(configs, [str(run_dir) for run_dir in run_dirs])
    for run_dir in run_dirs:
        check_free(run_dir)
    check_kinds(configs[0].model)
    data = load_task_data(task, configs[0].data.download)
    trainers, rng_states = [], []
    for config, run_dir in zip(configs, run_dirs, strict=True):
        trainers.append(start_run(config, task, run_dir, config_name, data))
        rng_states.append(torch.get_rng_state())  # as the lone run's, right after assemble
        trainers[-1].sampler.share_data(
            trainers[0].sampler
        )  # one copy of the dataset (no-op for the first)
    return Pack(trainers, rng_states)


def resume_pack(paths: list[Path], steps: int | None = None, download: bool | None = None) -> Pack:
    """Continue runs trained as one pack (or any runs that can be packed: one task, one step,
    one config but for pack.PACK_FREE's values) from their checkpoints, as one pack again."""
    runs = [run_of(path) for path in paths]
    snapshots = [read_resumable(run, None) for run in runs]
    names = [str(run) for run in runs]
    for run, snapshot in zip(runs[1:], snapshots[1:], strict=True):
        first = snapshots[0]
        if (snapshot.task.name, snapshot.step) != (first.task.name, first.step):
            raise ConfigError(
                f"{run} cannot be resumed in a pack with {runs[0]}: it is at step "
                f"{snapshot.step} of {snapshot.task.name}, and {runs[0]} at step {first.step} of "
                f"{first.task.name}; resume them separately"
            )
    check_packable([snapshot.config for snapshot in snapshots], names)
    trainers: list[Trainer] = []
    rng_states = []
    data = None
    for path, snapshot in zip(paths, snapshots, strict=True):
        trainer = resume_run(path, steps, download, data=data, snapshot=snapshot)
        if trainers:
            trainer.sampler.share_data(trainers[0].sampler)  # one copy of the dataset
        data = trainer.data
        trainers.append(trainer)
        rng_states.append(torch.get_rng_state())  # restore() set the run's own
    return Pack(trainers, rng_states)
