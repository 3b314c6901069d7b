"""config.json: what a run was started with, one dataclass, its writer and its reader."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from primal_dt.common.config import Config
from primal_dt.common.errors import CheckpointError, ConfigError, first_line
from primal_dt.common.loading import config_from_dict
from primal_dt.store.atomic import atomic_write
from primal_dt.store.rundir import RunDir, config_name_of


@dataclass
class RunConfig:
    """What a run was started with: config.json. `config_name` names the config file it came from
    (dt, primal-dt, ...), which reports group runs by; `machines` what it trained on, in order
    (common/device.py's machine_name: another CPU gives other bits), one more each time it was
    resumed on another."""

    task: str
    config_name: str
    config: Config
    machines: list[str] = field(default_factory=list)


def write_run_config(run: RunDir, record: RunConfig) -> None:
    data = {"task": record.task, "config_name": record.config_name, "machines": record.machines}
    data |= record.config.to_dict()
    atomic_write(run.config_file, lambda file: file.write(json.dumps(data, indent=2).encode()))


def read_run_config(run: RunDir) -> RunConfig:
    """config.json as a RunConfig; a missing or foreign file is one CheckpointError."""
    try:
        data = json.loads(run.config_file.read_text())
        task, name = data.pop("task"), data.pop("config_name", None)
        machines = [str(machine) for machine in data.pop("machines", [])]  # none before 2026-12
        config = config_from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as err:
        raise CheckpointError(
            f"{run.config_file} is not a primal-dt run config: {first_line(err)}"
        ) from None
    if name is None:  # a run made before config.json named its config
        name = config_name_of(run.path.name)
    return RunConfig(task, name, config, machines)
