"""How many CPU threads training uses, and how they wait, so that sharing the CPU costs about
its share and never collapses.

torch runs its CPU work in OpenMP parallel regions. By default an OpenMP thread that reaches the
end of a region spins, waiting for the others; when another process holds one of the cores, the
spinning threads wait for a thread the scheduler has parked, at every region, and a run slows
down several-fold (measured in scripts/bench_contention.py). So primal-dt:

- makes OpenMP threads sleep instead of spin (OMP_WAIT_POLICY=PASSIVE), unless the user set a
  wait policy: see quiet_waits, which must run before torch is imported (the command line does);
- trains with train.threads threads, or, when that is 0 (automatic), with OMP_NUM_THREADS where it
  is set (sweeps set it to cores // parallel), else one per core this process may use;
- while its own evaluation process evaluates on the same CPU, leaves that process its core
  (one thread fewer, at least one), and takes the core back when the evaluation is done.
"""

from __future__ import annotations

import os


def quiet_waits() -> None:
    """OpenMP threads that sleep when idle (OMP_WAIT_POLICY=PASSIVE) unless a policy is set.
    Only effective before torch (which loads OpenMP) is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def training_threads(setting: int, evaluation_beside: bool = False) -> int:
    """The intra-op threads for training: `setting` (train.threads) when > 0; else automatic, as
    the module docstring says, one fewer while an evaluation runs beside training on this CPU."""
    if setting > 0:
        return setting
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or usable_cores()
    return max(1, threads - 1) if evaluation_beside else threads
