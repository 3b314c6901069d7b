"""`primal-dt sweep`: a grid of tasks x configs x seeds, trained as ordinary run directories
RUNS_DIR/<task>/<config>-s<seed>, each by its own `primal-dt train` subprocess.

Up to --parallel runs train at once (the models are small, so several share one GPU); on a CPU
each gets cores // parallel threads. A sweep started again skips finished runs, resumes
interrupted ones from their checkpoint, and only evaluates runs whose training ended but whose
final evaluation did not. Every run is an ordinary `primal-dt train` command line: a start (--env, --config, --run-dir and
the run's settings as --set overrides, from the same mapping the command line uses) or a
`--resume`, which also finishes a run that only lacks its final evaluation. With --ray ADDRESS the
same commands are Ray tasks on an existing cluster, each asking for a fraction of a GPU when the
runs train on CUDA and for none when they train on CPUs; RUNS_DIR must then be a folder every node
sees. Everything is checked (the grid, the runs found, the cluster's GPUs) before anything is
written into RUNS_DIR.

A run is finished when its ckpt.pt is at the configured steps and eval.jsonl has its final
evaluation (or eval.final_episodes is 0). Each run writes its output to RUN_DIR/train.log; a failing
run is reported with the last line of its log and the sweep exits non-zero once the others end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primal_dt.config import Config, load_config, named_config_path, option_overrides
from primal_dt.cpu import usable_cores
from primal_dt.errors import PrimalDTError, first_line
from primal_dt.results import final_missing, read_results
from primal_dt.run import RunDir, find_runs, lock_file, read_snapshot
from primal_dt.tasks import resolve_task

# Settings that change how a run is executed, not what it computes: a sweep may differ in these
# from the runs it finds (e.g. resumed on another device, or asked to go to more steps).
MECHANICS = {
    "train": {
        "steps",
        "device",
        "compile",
        "log_every",
        "ckpt_every",
        "keep_checkpoints",
        "threads",
    },
    "eval": {"device", "workers", "service"},
    "data": {"download"},
}

# What a run training on CUDA asks Ray for where --gpus-per-run is not given: 4 runs share a GPU.
GPUS_PER_CUDA_RUN = 0.25


class SweepError(PrimalDTError):
    """A sweep that cannot start: a bad option, or a run directory holding another experiment."""


class SweepFailed(PrimalDTError):
    """Some runs of the sweep failed; the others finished."""

    exit_code = 1


class SweepInterrupted(PrimalDTError):
    """SIGINT/SIGTERM: the runs were stopped with their checkpoints saved."""

    exit_code = 130


@dataclass
class SweepOptions:
    tasks: list[str]
    seeds: list[int]
    configs: list[str]
    runs_dir: Path = Path("runs")
    parallel: int = 1
    steps: int | None = None
    device: str | None = None
    offline: bool = False
    overrides: list[str] = field(default_factory=list)
    ray_address: str | None = None
    gpus_per_run: float | None = None  # None: GPUS_PER_CUDA_RUN for runs on CUDA, 0 on CPUs
    cpus_per_run: int = 1

    def validate(self) -> SweepOptions:
        for name in ("tasks", "seeds", "configs"):
            if not getattr(self, name):
                raise SweepError(f"--{name} is empty; give a comma-separated list")
        if self.parallel < 1:
            raise SweepError(f"--parallel must be >= 1, got {self.parallel}")
        if (self.gpus_per_run or 0) < 0 or self.cpus_per_run < 1:
            raise SweepError("--gpus-per-run must be >= 0 and --cpus-per-run >= 1")
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


@dataclass
class Run:
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
        return f"{self.task}/{self.config}-s{self.seed}"


def _difference(saved: Config, wanted: Config) -> str | None:
    """The first setting (outside MECHANICS) where a saved run's config differs from the sweep's."""
    old_values, new_values = saved.to_dict(), wanted.to_dict()
    for section, values in new_values.items():
        if not isinstance(values, dict) or section == "primal_rank_by_task":
            if old_values[section] != values:
                return f"{section} = {old_values[section]!r} (the sweep asks for {values!r})"
            continue
        for key, value in values.items():
            old = old_values[section][key]
            if key not in MECHANICS.get(section, ()) and old != value:
                return f"{section}.{key} = {old!r} (the sweep asks for {value!r})"
    return None


def inspect(run: Run, config: Config | None = None) -> Run:
    """Decide the run's action from what its directory holds; with config, also check that the
    run found there is the experiment the sweep asks for."""
    if not run.run_dir.checkpoint.exists():
        run.action = "start"
        return run
    snapshot = read_snapshot(run.run_dir.checkpoint)
    if config is not None:
        differs = _difference(snapshot.config, config)
        if differs is not None:
            raise SweepError(
                f"{run.run_dir} holds a run with {differs}; remove that directory or use another "
                f"--runs-dir"
            )
    run.from_step = snapshot.step
    run.device = snapshot.config.train.device
    if run.from_step < run.steps:
        run.action = "resume"
    elif not final_missing(run.run_dir, run.from_step, snapshot.config.eval.final_episodes):
        run.action = "finished"
    else:
        run.action = "evaluate"
    return run


def plan(options: SweepOptions) -> list[Run]:
    """Every run of the grid, seed by seed (so a partial sweep covers every task), checked now:
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
    runs = []
    for seed in options.seeds:
        for task in options.tasks:
            for name, (path, arg) in configs.items():
                overrides = [*options.overrides, *option_overrides(
                    steps=options.steps, seed=seed, device=options.device, offline=options.offline
                )]  # fmt: skip
                config = load_config(path, overrides, task)
                run_dir = RunDir(options.runs_dir.resolve() / task / f"{name}-s{seed}")
                run = Run(task, name, arg, seed, run_dir, config.train.steps, overrides)
                run.device = config.train.device
                runs.append(inspect(run, config))
    return runs


def command(run: Run, options: SweepOptions) -> list[str]:
    """The `primal-dt train` command line that does the run's action."""
    train = [sys.executable, "-m", "primal_dt.cli", "train", "--no-progress"]
    if run.action in ("resume", "evaluate"):
        offline = ["--offline"] if options.offline else []
        return [*train, "--resume", str(run.run_dir), "--steps", str(run.steps), *offline]
    train += ["--env", run.task, "--config", run.config_arg, "--run-dir", str(run.run_dir)]
    for setting in run.overrides:
        train += ["--set", setting]
    return train


def thread_env(threads: int) -> dict[str, str]:
    """Environment variables that give a run's torch (and its BLAS) this many threads."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def last_line(path: Path) -> str:
    """The last non-empty line of a log: where `primal-dt train` says what went wrong."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    return next((line.strip() for line in reversed(lines) if line.strip()), "empty log")


def final_summary(run_dir: RunDir) -> str:
    finals = [r for r in read_results(run_dir) if r.final]
    if not finals:
        return "no final evaluation (eval.final_episodes = 0)"
    record = finals[-1]
    kind = "normalised score" if record.reference else "return"
    return f"final {kind} {record.score:.1f}"


class Sweep:
    """Runs the planned grid and reports on each run as it starts and ends."""

    def __init__(self, options: SweepOptions, runs: list[Run], out: Callable[[str], None]):
        self.options = options
        self.todo = [run for run in runs if run.action != "finished"]
        self.out = out
        self.failed: list[tuple[Run, str]] = []
        self.started: dict[str, float] = {}

    def prepare(self, run: Run) -> Path:
        """A run started afresh gets a clean directory (what a failed start left is removed)."""
        if run.action == "start" and run.run_dir.path.exists():
            shutil.rmtree(run.run_dir.path)
        run.run_dir.path.mkdir(parents=True, exist_ok=True)
        return run.run_dir.log

    def begin(self, run: Run) -> None:
        self.started[run.name] = time.monotonic()
        what = {"start": "start", "resume": f"resume from step {run.from_step}",
                "evaluate": "final evaluation"}[run.action]  # fmt: skip
        self.out(f"[{len(self.started)}/{len(self.todo)}] {run.name}: {what}")

    def end(self, run: Run, returncode: int | None, reason: str | None = None) -> None:
        from primal_dt.dashboards import copy_run

        seconds = time.monotonic() - self.started[run.name]
        done = returncode == 0 and inspect(run).action == "finished"
        if done:
            copy_run(run.run_dir.path, run.task)
            self.out(f"done {run.name} in {seconds:.0f} s: {final_summary(run.run_dir)}")
            return
        if reason is None:
            reason = last_line(run.run_dir.log)
            if returncode == 0:
                reason = "ended without finishing its steps and final evaluation"
        code = "" if returncode is None else f" (exit {returncode})"
        self.failed.append((run, reason))
        self.out(f"FAILED {run.name}{code}: {reason} (log: {run.run_dir.log})")

    def run_local(self) -> None:
        """Up to --parallel subprocesses at once; SIGINT/SIGTERM stop them with a checkpoint."""
        threads = max(1, usable_cores() // self.options.parallel)
        env = {**os.environ, **thread_env(threads)}
        pending, running = list(self.todo), {}
        try:
            while pending or running:
                while pending and len(running) < self.options.parallel:
                    run = pending.pop(0)
                    log = self.prepare(run)
                    self.begin(run)
                    with log.open("ab") as file:
                        # Its own session: a Ctrl-C reaches the runs once, forwarded by the sweep.
                        process = subprocess.Popen(
                            command(run, self.options), stdin=subprocess.DEVNULL, stdout=file,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                        )  # fmt: skip
                    running[process] = run
                for process in [p for p in running if p.poll() is not None]:
                    self.end(running.pop(process), process.returncode)
                time.sleep(0.2)
        except KeyboardInterrupt:
            _stop(list(running))
            raise SweepInterrupted(
                f"sweep interrupted; {len(running)} running runs saved a checkpoint; run the "
                f"same command again to resume"
            ) from None

    def run_ray(self, ray: Any, gpus: float) -> None:
        """Every run a Ray task asking for `gpus` GPUs and --cpus-per-run CPUs (connected by
        ray_cluster, checked by ray_gpus)."""
        options = self.options
        task = ray.remote(num_gpus=gpus, num_cpus=options.cpus_per_run)(run_logged)
        env = thread_env(options.cpus_per_run)
        refs: dict[Any, Run] = {}
        try:
            for run in self.todo:
                log = self.prepare(run)
                self.begin(run)
                refs[task.remote(command(run, options), str(log), env)] = run
            while refs:
                (ready,), _ = ray.wait(list(refs), num_returns=1)
                run = refs.pop(ready)
                try:
                    self.end(run, ray.get(ready))
                except ray.exceptions.RayError as err:
                    self.end(run, None, f"Ray task failed: {first_line(err) or type(err).__name__}")
        except KeyboardInterrupt:
            for ref in refs:
                ray.cancel(ref)  # the task forwards the interrupt to its run
            ray.wait(list(refs), num_returns=len(refs), timeout=120)
            raise SweepInterrupted(
                "sweep interrupted; the running runs were asked to save a checkpoint; run the "
                "same command again to resume"
            ) from None


@contextmanager
def ray_cluster(address: str | None) -> Iterator[Any]:
    """The ray module, connected to the cluster at address while inside (or to the instance this
    process already started, e.g. a notebook's, which is left running)."""
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'primal-dt[ray]'") from None
    connected = ray.is_initialized()
    if not connected:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="warning")
        except (ConnectionError, ValueError) as err:
            raise SweepError(
                f"cannot connect to the Ray cluster at {address}: {first_line(err)}"
            ) from None
    try:
        yield ray
    finally:
        if not connected:
            ray.shutdown()


def ray_gpus(options: SweepOptions, runs: list[Run], cluster_gpus: float) -> float:
    """The GPUs each run asks Ray for: --gpus-per-run where given, else GPUS_PER_CUDA_RUN when a
    run trains on CUDA (train.device cuda, or auto on a cluster with GPUs) and 0 when they all
    train on CPUs. A request the cluster cannot satisfy is a SweepError."""
    where = f"the Ray cluster at {options.ray_address}"
    cuda = [run.device for run in runs if run.device.startswith("cuda")]
    if cuda and not cluster_gpus:
        raise SweepError(
            f"train.device is {cuda[0]} but {where} has no GPUs; use --device cpu or auto"
        )
    on_cuda = bool(cuda) or (cluster_gpus > 0 and any(run.device == "auto" for run in runs))
    gpus = options.gpus_per_run
    if gpus is None:
        gpus = GPUS_PER_CUDA_RUN if on_cuda else 0.0
    if gpus > cluster_gpus:
        hint = f"give at most {cluster_gpus:g}" if cluster_gpus else "leave it out to train on CPUs"
        raise SweepError(
            f"{where} has {cluster_gpus:g} GPUs but --gpus-per-run asks for {gpus:g} per run; {hint}"
        )
    return gpus


def run_logged(cmd: list[str], log: str, env: dict[str, str]) -> int:
    """Run cmd with its output appended to log; an interrupt stops it with a checkpoint. (The body
    of a Ray task: it runs on the worker, with the worker's environment plus env.)"""
    with open(log, "ab") as file:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=file, stderr=subprocess.STDOUT,
            env={**os.environ, **env}, start_new_session=True,
        )  # fmt: skip
    try:
        return process.wait()
    except KeyboardInterrupt:
        _stop([process])
        return process.wait()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the sweep) is handled like Ctrl-C: the runs are stopped with
    a checkpoint before the sweep exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(processes: list[subprocess.Popen]) -> None:
    """Ask each run to stop after its current step (one SIGINT: it saves a checkpoint); a second
    Ctrl-C while waiting stops them at once."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait()
        except KeyboardInterrupt:
            for other in processes:
                if other.poll() is None:
                    other.send_signal(signal.SIGINT)
            process.wait()


def run_sweep(options: SweepOptions, out: Callable[[str], None] = print) -> list[Run]:
    """Plan the grid and check it (and the Ray cluster's GPUs) before writing anything; then take
    the runs directory's lock, write the TensorBoard layout and run what is left. Raises
    SweepFailed if any run failed (after the others ended)."""
    from primal_dt.dashboards import write_layout

    options.validate()
    runs = plan(options)
    sweep = Sweep(options, runs, out)
    on_ray = bool(options.ray_address and sweep.todo)
    cluster: AbstractContextManager[Any] = (
        ray_cluster(options.ray_address) if on_ray else nullcontext()
    )
    with cluster as ray:  # connected first: the cluster's GPUs are checked before any writing
        gpus = ray_gpus(options, sweep.todo, ray.cluster_resources().get("GPU", 0)) if on_ray else 0
        counts = {
            a: sum(r.action == a for r in runs) for a in ("finished", "resume", "start", "evaluate")
        }
        where = f"{options.parallel} at a time"
        if options.ray_address:
            where = f"on Ray at {options.ray_address}"
        if on_ray:
            where += f", {gpus:g} GPUs per run"
        out(
            f"sweep: {len(runs)} runs in {options.runs_dir} ({len(options.tasks)} tasks x "
            f"{len(options.configs)} configs x {len(options.seeds)} seeds): {counts['finished']} "
            f"finished, {counts['resume']} to resume, {counts['start']} to start, "
            f"{counts['evaluate']} to evaluate; {where}"
        )
        with sigterm_interrupts(), sweep_lock(options.runs_dir):
            write_layout(options.runs_dir, [*options.tasks, *_tasks_in(options.runs_dir)])
            if sweep.todo:
                log = RunDir(Path("RUN_DIR")).log
                out(f"each run logs to {log}; watch: tensorboard --logdir {options.runs_dir}")
            if on_ray:
                sweep.run_ray(ray, gpus)
            elif sweep.todo:
                sweep.run_local()
    if sweep.failed:
        names = ", ".join(run.name for run, _ in sweep.failed)
        raise SweepFailed(
            f"{len(sweep.failed)} of {len(runs)} runs failed ({names}); see the lines above and "
            f"each run's log; run the same command again to retry them"
        )
    out(
        f"sweep: all {len(runs)} runs finished; tables and figures: primal-dt report {options.runs_dir}"
    )
    return runs


@contextmanager
def sweep_lock(runs_dir: Path) -> Iterator[None]:
    """One sweep at a time per runs directory: a second one would restart the first one's runs."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    file, holder = lock_file(runs_dir / ".sweep.lock")
    if file is None:
        raise SweepError(
            f"another sweep (pid {holder}) is running in {runs_dir}; wait for it to end or use "
            f"another --runs-dir"
        )
    with file:
        yield


def _tasks_in(runs_dir: Path) -> list[str]:
    """Tasks of the sweep-style runs already in runs_dir (RUNS_DIR/<task>/<run>/)."""
    return [path.parent.name for path in find_runs(runs_dir) if path.parent.parent == runs_dir]
