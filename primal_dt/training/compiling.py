"""torch.compile for training: primal-dt's own compile cache, and one recompile where a cached
kernel is damaged.

Inductor keeps the kernels it compiles in a cache folder that later processes trust: the C++
kernels of a CPU run are shared libraries (`<hash>.main.so`), built under a file lock by the
first process that needs them and loaded by every later one without a check. A process killed
while the compiler wrote one leaves a truncated library behind, and from then on every run that
needs that kernel failed ("ImportError: ... file too short") until someone deleted the file.

So primal-dt:

- compiles into a cache of its own, per user and torch version: $PRIMAL_DT_COMPILE_CACHE where
  it is set, else $XDG_CACHE_HOME/primal-dt/compile/torch-<version> ($XDG_CACHE_HOME defaults
  to ~/.cache), never torch's shared default in /tmp (compile_cache);
- runs the first compiled training step (where the kernels are compiled or loaded) so that a
  kernel that cannot be loaded is recognised (damaged_files: an error that names a file in the
  cache), says so in one line naming the file and the cache folder, starts the cache afresh, and
  compiles and runs that step once more (trainer.py). The
  failed attempt changed nothing (no optimiser step; the random generators are put back), so
  the run ends with the same bits as one that never met the fault. A second failure is an
  error that says how to clear the cache or train without --compile.

A cache per process would never be damaged by another, but pays the whole compile every run,
where a warm cache only reads the kernels; a damaged library is rare and recognised, so the
shared cache is kept, and started afresh where it is damaged.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from primal_dt.common.errors import PrimalDTError

CACHE_VARIABLE = "PRIMAL_DT_COMPILE_CACHE"


class CompileCacheError(PrimalDTError):
    """A compiled kernel could not be loaded, even after the cache was repaired."""


def compile_cache() -> Path:
    """The folder torch.compile's kernels are cached in (the module docstring says where)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    version = re.sub(r"[^\w.+-]", "_", torch.__version__)
    return base / "primal-dt" / "compile" / f"torch-{version}"


def prepare_compile(device: torch.device) -> None:
    """What every torch.compile of primal-dt's sets first: its kernels cached in compile_cache();
    on a CPU the random keys of dropout.py's masks drawn by torch's own generator in compiled
    code too (inductor's fallback_random), so compiled and eager runs drop the same elements;
    kernels that give the same bits at every run (deterministic_kernels)."""
    cache = compile_cache()
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # inductor reads it at every compile
    if device.type == "cpu":
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    deterministic_kernels(device)


def compile_model(model: torch.nn.Module, mode: str, device: torch.device) -> Callable[..., Any]:
    """torch.compile(model) with static shapes, prepared as prepare_compile says: the model
    alone, where training compiles its whole step (step.py); the benchmarks compare the two."""
    prepare_compile(device)
    return torch.compile(model, mode=mode, dynamic=False)


def deterministic_kernels(device: torch.device) -> None:
    """Compiled kernels that give the same bits at every run. Inductor writes a scatter with
    accumulation (the timestep embedding's backward, for one) as atomic adds from parallel
    threads, whose order, and so whose rounding, changes from run to run; with torch's
    deterministic algorithms on, it calls ATen's sequential kernel instead. Ops that have no
    deterministic kernel warn rather than fail (warn_only), and empty tensors are not filled.
    On CUDA, cuBLAS needs a fixed workspace for reproducible products (set where the user has
    not chosen one)."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


def _messages(error: BaseException) -> Iterator[str]:
    """The messages of error and of the errors that caused it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        current = current.__cause__ or current.__context__


def damaged_files(error: BaseException, cache: Path) -> list[Path]:
    """The files of the cache that an error of a compiled step names, where it names any: the
    sign of a cached kernel that cannot be loaded (or an error of a file of the cache)."""
    pattern = re.compile(re.escape(str(cache)) + r"[^\s:'\"]*")
    found = {Path(match) for text in _messages(error) for match in pattern.findall(text)}
    return sorted(path for path in found if path != cache)


def repair(cache: Path) -> None:
    """Start the cache afresh (its folder moved aside, then deleted: a process that holds a
    kernel open keeps it), and forget every compiled graph and kernel this process holds, so
    that the next compile builds every kernel again. Deleting only the file named would do for
    one damaged kernel, but an interrupted compile can leave several."""
    import torch._inductor.utils as inductor_utils

    aside = cache.with_name(f"{cache.name}.damaged-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):  # another process moved it first
        cache.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    torch._dynamo.reset()
    inductor_utils.clear_caches()
    _forget_vector_instructions()


def _forget_vector_instructions() -> None:
    """Forget which vector instructions inductor found the compiler and CPU support: it finds
    out by building and loading a small library in the cache, and a damaged one made it decide,
    for the rest of the process, to generate scalar kernels (other results, to the last bit).
    Its answers are functools caches on the module's functions and classes."""
    import torch._inductor.cpu_vec_isa as vector_isa

    for value in list(vars(vector_isa).values()):
        members = list(vars(value).values()) if isinstance(value, type) else []
        for candidate in (value, *members):
            clear = getattr(candidate, "cache_clear", None)
            if callable(clear):
                clear()


def damaged_note(files: list[Path], cache: Path) -> str:
    shown = ", ".join(str(path) for path in files)
    return (
        f"a compiled kernel in the compile cache could not be loaded ({shown}); compiling again "
        f"into a fresh cache, {cache}"
    )


def still_damaged(cache: Path, error: BaseException) -> CompileCacheError:
    lines = [line for text in _messages(error) for line in text.splitlines() if str(cache) in line]
    reason = lines[-1].strip() if lines else type(error).__name__
    return CompileCacheError(
        f"torch.compile failed again with a fresh cache ({reason}); clear it with "
        f"rm -rf {cache}, or train without --compile (train.compile = false)"
    )
