"""The arithmetic of one training step: its floating-point operations as torch counts them, and
the rate of its matrix products alone, replayed at the step's shapes (what the hardware does at
those shapes; bench_train.py's precision table sets it beside the whole step's rate)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from primal_dt.training.trainer import Trainer


def step_flops(trainer: Trainer) -> int:
    """Floating-point operations of one training step (forward and backward), as torch counts."""
    batch = trainer.sampler.sample(trainer.config.train.batch_size)
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(batch)
    return counter.get_total_flops()


MATRIX_PRODUCTS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


class TensorSpec(NamedTuple):
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype


class MatrixProductRecorder(TorchDispatchMode):
    """The matrix products an operation calls: each op with its arguments, tensors as their
    shapes, strides and dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATRIX_PRODUCTS:
            spec = [
                TensorSpec(a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                for a in args
            ]
            self.calls.append((func, spec))
        return func(*args, **(kwargs or {}))


def matrix_product_rate(trainer: Trainer, repeats: int = 20) -> float:
    """GFLOP/s of one training step's matrix products alone: each replayed `repeats` times on
    random tensors of its shapes, strides and dtype (so what the hardware does at those shapes)."""
    with MatrixProductRecorder() as recorder:
        trainer.train_step(trainer.sampler.sample(trainer.config.train.batch_size))

    def tensor(spec: TensorSpec) -> torch.Tensor:
        """Random values laid out as the recorded tensor, broadcast (stride 0) ones included."""
        size, stride = spec[:2]
        storage = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True) if n > 0)
        values = torch.randn(storage, dtype=spec.dtype, device=trainer.device)
        return values.as_strided(size, stride)

    replays = [
        (func, [tensor(a) if isinstance(a, TensorSpec) else a for a in spec])
        for func, spec in recorder.calls
    ]
    with FlopCounterMode(display=False) as counter:
        for func, args in replays:
            func(*args)
    for func, args in replays:  # warm-up
        func(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        for func, args in replays:
            func(*args)
    seconds = (time.perf_counter() - start) / repeats
    return counter.get_total_flops() / seconds / 1e9
