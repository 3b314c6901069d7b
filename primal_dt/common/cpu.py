"""How many CPU threads training uses, how they wait, and how the evaluation process beside it
yields, so that sharing the CPU costs about its share, never collapses, and never changes a result.

torch runs its CPU work in OpenMP parallel regions. By default an OpenMP thread that reaches the
end of a region spins, waiting for the others; when another process holds one of the cores, the
spinning threads wait for a thread the scheduler has parked, at every region, and a run slows
down several-fold (measured in scripts/bench_contention.py). So primal-dt:

- bounds how long an OpenMP thread spins before it sleeps, unless the user chose (wait_settings;
  quiet_waits must run before torch is imported, and the command line does). GNU OpenMP, which
  torch's Linux wheels use, spins 300,000 times by default; GOMP_SPINCOUNT=SPIN_COUNT keeps a
  short spin, which costs nothing on an idle machine, where sleeping at every region
  (OMP_WAIT_POLICY=PASSIVE) cost 12 to 13%, and keeps a shared CPU's figures as sleeping does. The
  LLVM and Intel runtimes (macOS, some conda builds) get KMP_BLOCKTIME=0, their equivalent of PASSIVE
  (not measured here);
- trains with train.threads threads, or, when that is 0 (automatic), with OMP_NUM_THREADS where it
  is set (sweeps set it to cores // parallel), else one per core this process may use; the count
  is fixed for the whole run, because the order of floating-point sums, and with it every bit of
  the weights, depends on it (a count that followed the evaluations would follow their timing);
- runs its own evaluation process at the lowest scheduling priority (yield_cpu), so that where
  training and evaluation want the same core the scheduler gives it to training;
- evaluates on a CPU with one thread, wherever it evaluates (evaluation_threads).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

LOWEST_PRIORITY = 19  # the highest nice value: runs when nothing of normal priority wants a core


SPIN_COUNT = 1000  # chosen with scripts/bench_contention.py --policies (README, A shared CPU)
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def wait_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP wait settings primal-dt adds to an environment: none where one is set."""
    if any(name in environ for name in WAIT_SETTINGS):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}


def quiet_waits() -> None:
    """Add wait_settings to this process's environment. Only effective before torch (which loads
    OpenMP) is imported."""
    os.environ.update(wait_settings(os.environ))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def training_threads(setting: int) -> int:
    """The intra-op threads for training, for the whole run: `setting` (train.threads) when > 0;
    else automatic, as the module docstring says."""
    if setting > 0:
        return setting
    return int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or usable_cores()


def yield_cpu() -> None:
    """Lower this process (the evaluation beside training) to the lowest priority; its children
    (environment workers) inherit it. Where the system refuses, it keeps its priority."""
    with contextlib.suppress(AttributeError, OSError):
        os.nice(LOWEST_PRIORITY - os.nice(0))


def evaluation_threads(device_type: str) -> None:
    """One thread for an evaluation on a CPU, wherever it runs (the process beside training,
    inline, `eval --watch`, `eval --ckpt`): a snapshot then scores the same bits whenever it is
    evaluated, and training keeps its cores."""
    if device_type == "cpu":
        import torch

        torch.set_num_threads(1)
