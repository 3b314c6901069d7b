"""Which torch device a setting names, checked before any work starts."""

from __future__ import annotations

import torch

from primal_dt.errors import ConfigError


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
