"""Whether one training step can fit in memory, checked before a run directory is made.

The estimate is a floor, not a forecast: the activations a step must keep for its backward pass,
about ACTIVATIONS_PER_TOKEN floats of the width per token and block (the block's input, its
normalised copies, queries, keys and values, the attention's output, the MLP's 4x hidden layer
before and after its activation), at 2 bytes under bf16 and 4 under fp32, plus the batch itself.
Softmax's L x L score matrices, the optimiser's state and the allocator's slack come on top, so
a batch refused here cannot fit, and one accepted may still run out: the trainer then says so in
one line (OutOfMemory) and the start leaves nothing behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from primal_dt.common.config import Config
from primal_dt.common.errors import OutOfMemory, first_line

ACTIVATIONS_PER_TOKEN = 16  # floats of the width kept per token and block (see above)
GIB = 2**30


def step_floor(config: Config, state_dim: int, act_dim: int) -> int:
    """The fewest bytes one training step needs (the module docstring's floor)."""
    model, train = config.model, config.train
    tokens = train.batch_size * 3 * model.context_len  # (return, state, action) per step
    width_bytes = 2 if train.precision == "bf16" else 4
    activations = tokens * model.n_layer * ACTIVATIONS_PER_TOKEN * model.embed_dim * width_bytes
    windows = train.batch_size * model.context_len * (state_dim + act_dim + 3) * 4
    return activations + windows


def available_bytes(device: torch.device) -> int | None:
    """The memory free for a step on device: the GPU's free memory, or the host's available
    memory (Linux's MemAvailable); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_step_fits(config: Config, state_dim: int, act_dim: int, device: torch.device) -> None:
    """Refuse, naming the settings, a step that cannot fit in the device's free memory."""
    need, free = step_floor(config, state_dim, act_dim), available_bytes(device)
    if free is not None and need > free:
        model, train = config.model, config.train
        raise OutOfMemory(
            f"train.batch_size={train.batch_size} needs at least {need / GIB:.3g} GiB for one "
            f"step (windows of {model.context_len} steps, {model.n_layer} blocks of width "
            f"{model.embed_dim}) and {device.type} has {free / GIB:.3g} GiB free; "
            f"lower train.batch_size (or model.embed_dim, model.context_len)"
        )


@contextmanager
def out_of_memory_named(config: Config) -> Iterator[None]:
    """A step that runs out of memory (torch's CUDA error, the CPU allocator's RuntimeError, or
    Python's MemoryError) ends as one OutOfMemory line naming the settings to lower."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
        is_memory = not isinstance(err, RuntimeError) or "can't allocate memory" in str(err)
        if not is_memory:
            raise
        raise OutOfMemory(
            f"training ran out of memory ({first_line(err) or type(err).__name__}) with "
            f"train.batch_size={config.train.batch_size}; lower train.batch_size (or "
            f"model.embed_dim, model.context_len)"
        ) from None
