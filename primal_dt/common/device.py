"""Which torch device a setting names (checked before any work starts), and the precision and
optimizer a run uses on it."""

from __future__ import annotations

import contextlib
import os
import platform
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

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


def machine_name(device: torch.device) -> str:
    """What a run computes on, for its record: the GPU's name, or the CPU's model and cores (the
    same settings give other bits on another CPU, so a study says which it ran on)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):  # Linux; elsewhere the platform's own word
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:  # the same name can stand for several generations
        model += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    return f"{model}, {cpu_bf16_unit() or 'no bf16 unit'}, {os.cpu_count()} cores"


def cpu_bf16_unit() -> str | None:
    """The unit this CPU multiplies bf16 matrices with, as torch reports it: "AMX" (Intel Xeons
    since Sapphire Rapids), "AVX-512 BF16" (Cooper Lake, AMD since Zen 4), or None, where oneDNN
    converts bf16 to float32 and back and bf16 is slower than float32."""
    for unit, probe in (
        ("AMX", "_is_amx_tile_supported"),
        ("AVX-512 BF16", "_is_avx512_bf16_supported"),
    ):
        supported = getattr(torch.cpu, probe, None)  # private, but torch's own dispatch reads it
        if supported is not None and supported():
            return unit
    return None


#: What a run computes in, resolved once from train.precision (resolve_precision) when it starts,
#: recorded in its config, and read as it is by training, evaluation and rollouts.
Precision = Literal["bf16", "fp32"]


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """ "bf16" or "fp32" for a run's train.precision on device. "auto" is bf16 where the device
    multiplies it in hardware: a CUDA device that supports it (Ampere and later), a CPU with a
    cpu_bf16_unit; else fp32 (docs/benchmarks.md has what bf16 gains). Decided from what the
    hardware is, never from a timing, so the same machine always resolves the same way."""
    if precision in ("bf16", "fp32"):
        return typing.cast(Precision, precision)
    if precision != "auto":
        raise ValueError(f'precision must be "auto", "bf16" or "fp32", got {precision!r}')
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_bf16_unit() else "fp32"


def as_precision(text: str) -> Precision:
    """A run's recorded train.precision, read as the typed value it was resolved to; a
    ValueError for anything else ("auto" included: a run records what it resolved to)."""
    if text not in ("bf16", "fp32"):
        raise ValueError(f'a resolved precision is "bf16" or "fp32", got {text!r}')
    return typing.cast(Precision, text)


def recorded_precision(precision: str, device: torch.device) -> Precision:
    """The precision a checkpoint's run trained in. Runs record the precision "auto" resolved to;
    a checkpoint that still says "auto" was written before that, when "auto" meant bf16 on CUDA
    and fp32 on a CPU, whatever the CPU."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return resolve_precision(precision, device)


def precision_chosen(asked: str, device: torch.device) -> str:
    """The line a new run prints once: the precision it trains and evaluates in, and why."""
    resolved = resolve_precision(asked, device)
    if asked != "auto":
        why = f'train.precision = "{asked}"'
    elif device.type == "cpu":
        unit = cpu_bf16_unit()
        why = f"auto: this CPU has {unit}" if unit else "auto: this CPU has no bf16 unit"
    else:
        why = f"auto on {device.type}"
    return f"precision {resolved} ({why}; set train.precision to force bf16 or fp32)"


def precision_note(precision: str, device: torch.device) -> str | None:
    """A line for a resumed run that keeps its precision where this device would choose another
    ("auto"): it trains slower here than it could, since a run that changed precision could not
    end bit-identical to an uninterrupted one."""
    chosen = resolve_precision("auto", device)
    if precision == chosen:
        return None
    why = "has no bf16 unit" if chosen == "fp32" else "multiplies bf16 in hardware"
    return (
        f"this run trains in {precision}, as it started; this {device.type} {why}, where "
        f'train.precision = "auto" would choose {chosen}, faster'
    )


def autocast_dtype(precision: Precision) -> torch.dtype | None:
    """The dtype matrix products run in: bf16, or None (float32, no autocast). Only a resolved
    precision: a run's, never "auto"."""
    return torch.bfloat16 if as_precision(precision) == "bf16" else None


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast to bf16 for a bf16 run, else nothing. (The KSVD loss and the prefix means
    sum in float32 inside it: see attention.py.)"""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def adamw(
    parameters: Iterable[torch.nn.Parameter],
    device: torch.device,
    *,
    lr: float,
    weight_decay: float,
) -> torch.optim.AdamW:
    """AdamW, fused into one kernel wherever the installed torch has it for this device (CUDA,
    and the CPU since torch 2.4), else its multi-tensor form."""
    parameters = list(parameters)
    try:
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=True)
    except RuntimeError:  # "fused=True requires all the params to be ... on a supported device"
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
