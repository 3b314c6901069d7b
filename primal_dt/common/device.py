"""Which torch device a setting names (checked before any work starts), and the precision and
optimizer a run uses on it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch

from primal_dt.common.errors import ConfigError


def resolve_device(name: str, setting: str) -> torch.device:
    """ "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"; a CUDA device this machine lacks is a
    ConfigError naming `setting`, the option or config key the user gave it with."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{setting} is {name} but no CUDA device is available; use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{setting} is {name} but this machine has {torch.cuda.device_count()} CUDA "
                f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype matrix products run in: "auto" is bf16 on CUDA and float32 (no autocast) on a
    CPU, where bf16 is slower on most cores; "bf16" and "fp32" force one or the other."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast to bf16 where autocast_dtype says so, else nothing. (The KSVD loss and the
    prefix means sum in float32 inside it: see attention.py.)"""
    dtype = autocast_dtype(precision, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def adamw(
    parameters: Iterable[torch.nn.Parameter], device: torch.device, **settings: float
) -> torch.optim.AdamW:
    """AdamW, fused into one kernel wherever the installed torch has it for this device (CUDA,
    and the CPU since torch 2.4), else its multi-tensor form."""
    parameters = list(parameters)
    try:
        return torch.optim.AdamW(parameters, fused=True, **settings)
    except RuntimeError:  # "fused=True requires all the params to be ... on a supported device"
        return torch.optim.AdamW(parameters, **settings)
