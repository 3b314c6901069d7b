"""`primal-dt sweep`: the grid that grid.py plans, each cell trained into the ordinary run directory
RUNS_DIR/<task>/<config>-s<seed> by its own `primal-dt train` subprocess, or, with --pack N (the
default on CUDA: grid.pack_size), up to N cells of one task and config by one `primal-dt train`
subprocess that trains them as one pack (training/pack.py); a pack writes its first run's log.

Here, up to --parallel runs train at once (the models are small, so several share one GPU), each
with usable cores // --parallel threads (at least one). With --ray ADDRESS every run is a Ray task
on that cluster asking for --cpus-per-run CPUs (and as many threads) and --gpus-per-run GPUs, by
default GPUS_PER_CUDA_RUN when the runs train on CUDA and none when they train on CPUs; RUNS_DIR
must then be a folder every node sees, and the cluster's GPUs are checked before anything is
written. One sweep at a time holds a runs directory's lock.

Each run writes its output to RUN_DIR/train.log. A run is finished when its ckpt.pt is at its
steps and eval.jsonl has its final evaluation (or eval.final_episodes is 0); its curves are then
copied for RUNS_DIR's TensorBoard dashboards (store/dashboards.py). A failing run is reported with
the last line of its log, and the sweep exits non-zero once the others end. SIGINT or SIGTERM stops
every run with a checkpoint saved; the same command then resumes them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from primal_dt.common.cpu import usable_cores
from primal_dt.common.errors import PrimalDTError, first_line
from primal_dt.common.signals import sigterm_interrupts
from primal_dt.store.locks import lock_file
from primal_dt.store.results import read_results, target_score
from primal_dt.store.rundir import RunDir
from primal_dt.tools.grid import (
    GPUS_PER_CUDA_RUN,
    GridCell,
    SweepError,
    SweepOptions,
    describe_packs,
    group_packs,
    pack_command,
    pack_size,
    plan,
    with_action,
)


class SweepFailed(PrimalDTError):
    """Some runs of the sweep failed; the others finished."""

    exit_code = 1


class SweepInterrupted(PrimalDTError):
    """SIGINT/SIGTERM: the runs were stopped with their checkpoints saved."""

    exit_code = 130


def thread_env(threads: int) -> dict[str, str]:
    """Environment variables that give a run's torch (and its BLAS) this many threads."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def local_thread_env(parallel: int, cores: int | None = None) -> dict[str, str]:
    """thread_env for each of `parallel` runs sharing this machine's cores (default: the usable
    ones): an equal share, at least one thread."""
    cores = usable_cores() if cores is None else cores
    return thread_env(max(1, cores // parallel))


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
    at = f" at target {record.results[0].target:g}" if record.results else ""
    return f"final {kind}{at} {target_score(record):.1f}"


class Sweep:
    """Trains the planned grid and reports on each run as it starts and ends."""

    def __init__(
        self, options: SweepOptions, cells: list[GridCell], out: Callable[[str], None]
    ) -> None:
        self.options = options
        self.todo = [cell for cell in cells if cell.action != "finished"]
        self.packs = [[cell] for cell in self.todo]  # train_grid packs them where it should
        self.out = out
        self.failed: list[tuple[GridCell, str]] = []
        self.started: dict[str, float] = {}

    def prepare(self, pack: list[GridCell]) -> Path:
        """A run started afresh gets a clean directory (what a failed start left is removed).
        Returns the log the pack's process writes: its first run's; the others' logs say so."""
        for cell in pack:
            if cell.action == "start" and cell.run_dir.path.exists():
                shutil.rmtree(cell.run_dir.path)
            cell.run_dir.path.mkdir(parents=True, exist_ok=True)
            if cell is not pack[0]:
                with open(cell.run_dir.log, "a") as log:
                    log.write(f"trained in a pack; its log is {pack[0].run_dir.log}\n")
        return pack[0].run_dir.log

    def begin_pack(self, pack: list[GridCell]) -> None:
        for cell in pack:
            self.begin(cell)

    def end_pack(
        self, pack: list[GridCell], returncode: int | None, reason: str | None = None
    ) -> None:
        for cell in pack:
            self.end(cell, returncode, reason, pack[0].run_dir.log)

    def begin(self, cell: GridCell) -> None:
        self.started[cell.name] = time.monotonic()
        what = {
            "start": "start",
            "resume": f"resume from step {cell.from_step}",
            "evaluate": "final evaluation",
        }[cell.action]
        self.out(f"[{len(self.started)}/{len(self.todo)}] {cell.name}: {what}")

    def end(
        self,
        cell: GridCell,
        returncode: int | None,
        reason: str | None = None,
        log: Path | None = None,
    ) -> None:
        seconds = time.monotonic() - self.started[cell.name]
        done = returncode == 0 and with_action(cell).action == "finished"
        if done:
            self.out(f"done {cell.name} in {seconds:.0f} s: {final_summary(cell.run_dir)}")
            return
        log = log or cell.run_dir.log
        if reason is None:
            reason = last_line(log)
            if returncode == 0:
                reason = "ended without finishing its steps and final evaluation"
        code = "" if returncode is None else f" (exit {returncode})"
        self.failed.append((cell, reason))
        self.out(f"FAILED {cell.name}{code}: {reason} (log: {log})")

    def launch_here(self) -> None:
        """Up to --parallel subprocesses at once; SIGINT/SIGTERM stop them with a checkpoint."""
        env = local_thread_env(self.options.parallel)
        pending = list(self.packs)
        running: dict[subprocess.Popen[bytes], list[GridCell]] = {}
        try:
            while pending or running:
                while pending and len(running) < self.options.parallel:
                    pack = pending.pop(0)
                    log = self.prepare(pack)
                    self.begin_pack(pack)
                    running[start_logged(pack_command(pack, self.options), log, env)] = pack
                for process in [p for p in running if p.poll() is not None]:
                    self.end_pack(running.pop(process), process.returncode)
                time.sleep(0.2)
        except KeyboardInterrupt:
            _stop(list(running))
            raise SweepInterrupted(
                f"sweep interrupted; {len(running)} running runs saved a checkpoint; run the "
                f"same command again to resume"
            ) from None

    def launch_on_ray(self, ray: Any, gpus: float) -> None:
        """Every run, or every pack, a Ray task asking for `gpus` GPUs (a pack on CUDA: one
        whole GPU, unless --gpus-per-run says otherwise) and --cpus-per-run CPUs (connected by
        ray_cluster, checked by ray_gpus)."""
        options = self.options
        env = thread_env(options.cpus_per_run)
        refs: dict[Any, list[GridCell]] = {}
        try:
            for pack in self.packs:
                log = self.prepare(pack)
                self.begin_pack(pack)
                pack_gpus = gpus
                if len(pack) > 1 and gpus and options.gpus_per_run is None:
                    pack_gpus = 1.0
                task = ray.remote(num_gpus=pack_gpus, num_cpus=options.cpus_per_run)(logged_command)
                refs[task.remote(pack_command(pack, options), str(log), env)] = pack
            while refs:
                (ready,), _ = ray.wait(list(refs), num_returns=1)
                pack = refs.pop(ready)
                try:
                    self.end_pack(pack, ray.get(ready))
                except ray.exceptions.RayError as err:
                    reason = f"Ray task failed: {first_line(err) or type(err).__name__}"
                    self.end_pack(pack, None, reason)
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
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError) as err:
            raise SweepError(
                f"cannot connect to the Ray cluster at {address}: {first_line(err)}"
            ) from None
    try:
        yield ray
    finally:
        if not connected:
            ray.shutdown()


def ray_gpus(options: SweepOptions, cells: list[GridCell], cluster_gpus: float) -> float:
    """The GPUs each run asks Ray for: --gpus-per-run where given, else GPUS_PER_CUDA_RUN when a
    run trains on CUDA (train.device cuda, or auto on a cluster with GPUs) and 0 when they all
    train on CPUs. A request the cluster cannot satisfy is a SweepError."""
    where = f"the Ray cluster at {options.ray_address}"
    cuda = [cell.device for cell in cells if cell.device.startswith("cuda")]
    if cuda and not cluster_gpus:
        raise SweepError(
            f"train.device is {cuda[0]} but {where} has no GPUs; use --device cpu or auto"
        )
    on_cuda = bool(cuda) or (cluster_gpus > 0 and any(cell.device == "auto" for cell in cells))
    gpus = options.gpus_per_run
    if gpus is None:
        gpus = GPUS_PER_CUDA_RUN if on_cuda else 0.0
    if gpus > cluster_gpus:
        hint = f"give at most {cluster_gpus:g}" if cluster_gpus else "leave it out to train on CPUs"
        raise SweepError(
            f"{where} has {cluster_gpus:g} GPUs but --gpus-per-run asks for {gpus:g} per run; {hint}"
        )
    return gpus


def start_logged(cmd: list[str], log: Path | str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start cmd with its output appended to log and env added to this process's environment. It
    gets its own session: a Ctrl-C reaches it once, forwarded by the sweep (_stop)."""
    with open(log, "ab") as file:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )


def logged_command(cmd: list[str], log: str, env: dict[str, str]) -> int:
    """The body of a Ray task, on the worker: cmd run by start_logged (so with the worker's
    environment plus env), its exit status returned; an interrupt stops it with a checkpoint."""
    process = start_logged(cmd, log, env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        _stop([process])
        return process.wait()


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
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


def train_grid(options: SweepOptions, out: Callable[[str], None] = print) -> list[GridCell]:
    """Plan the grid and check it (and the Ray cluster's GPUs) before writing anything; then take
    the runs directory's lock and train what is left. Returns the
    grid as planned; raises SweepFailed if any run failed (after the others ended)."""
    from primal_dt.store.dashboards import remove_root_layout

    options.validate()
    cells = plan(options)
    sweep = Sweep(options, cells, out)
    on_ray = bool(options.ray_address and sweep.todo)
    cluster: AbstractContextManager[Any] = (
        ray_cluster(options.ray_address) if on_ray else nullcontext()
    )
    with cluster as ray:  # connected first: the cluster's GPUs are checked before any writing
        gpus = ray_gpus(options, sweep.todo, ray.cluster_resources().get("GPU", 0)) if on_ray else 0
        counts = {
            a: sum(c.action == a for c in cells)
            for a in ("finished", "resume", "start", "evaluate")
        }
        size = pack_size(options, sweep.todo, cuda_here(options, gpus, on_ray))
        sweep.packs = group_packs(sweep.todo, size)
        where = f"{options.parallel} at a time"
        if options.ray_address:
            where = f"on Ray at {options.ray_address}"
        if on_ray:
            where += f", {gpus:g} GPUs per run"
        out(
            f"sweep: {len(cells)} runs in {options.runs_dir} ({len(options.tasks)} tasks x "
            f"{len(options.configs)} configs x {len(options.seeds)} seeds): {counts['finished']} "
            f"finished, {counts['resume']} to resume, {counts['start']} to start, "
            f"{counts['evaluate']} to evaluate; {where}"
        )
        with sigterm_interrupts(), sweep_lock(options.runs_dir):
            remove_root_layout(options.runs_dir)
            if sweep.todo:
                log = RunDir(Path("RUN_DIR")).log
                out(f"each run logs to {log}; watch: tensorboard --logdir {options.runs_dir}")
            if size > 1 and sweep.todo:
                out(describe_packs(sweep.packs))
            if on_ray:
                sweep.launch_on_ray(ray, gpus)
            elif sweep.todo:
                sweep.launch_here()
    if sweep.failed:
        names = ", ".join(cell.name for cell, _ in sweep.failed)
        raise SweepFailed(
            f"{len(sweep.failed)} of {len(cells)} runs failed ({names}); see the lines above and "
            f"each run's log; run the same command again to retry them"
        )
    out(
        f"sweep: all {len(cells)} runs finished; tables and figures: primal-dt report {options.runs_dir}"
    )
    return cells


def cuda_here(options: SweepOptions, gpus: float, on_ray: bool) -> bool:
    """Whether runs with train.device auto would train on CUDA: the Ray cluster's GPUs asked
    for, or this machine's."""
    if on_ray:
        return gpus > 0
    if options.pack is not None:
        return False  # not needed: --pack decides
    import torch

    return torch.cuda.is_available()


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
