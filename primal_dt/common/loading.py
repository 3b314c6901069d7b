"""Configuration files and overrides: a TOML file read into the Config dataclasses (config.py),
`--set section.key=value` overrides parsed as TOML values, and a Config saved with to_dict read
back, each key checked against its annotated type with a message that names it. Older keys are
read as today's by migrate.py, the loader's first step: the dataclasses know today's keys alone.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from primal_dt.common.config import Config, ModelConfig
from primal_dt.common.errors import ConfigError, did_you_mean
from primal_dt.common.migrate import (
    LEGACY_SETTINGS,
    RENAMED_KEYS,
    fold_older,
    forget_older,
    is_older,
    reshaped,
    stash_older,
)
from primal_dt.common.resources import resource_dir


def check_type(value: Any, hint: Any, key: str) -> Any:
    """Return value converted to the annotated type, or raise ConfigError naming the key."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return check_type(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key} has the wrong type: {value!r} is not {_type_name(hint)}")
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list of {item.__name__}, got {value!r}")
        return [check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return {str(k): check_type(v, item, f"{key}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if not isinstance(value, hint):
        raise ConfigError(f"{key} must be {_type_name(hint)}, got {value!r}")
    return value


def _type_name(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if hint in names:
        return names[hint]
    return str(hint).replace("typing.", "")


def _apply(target: Any, values: dict[str, Any], prefix: str) -> None:
    hints = typing.get_type_hints(type(target))
    for name, value in values.items():
        if not prefix:
            name, value = reshaped(name, value)
        key = RENAMED_KEYS.get(f"{prefix}{name}", f"{prefix}{name}")
        name = key.rsplit(".", 1)[-1]
        if isinstance(target, ModelConfig) and is_older(name):
            hint = str | list[int] if name == "primal_blocks" else Any
            stash_older(target, name, check_type(value, hint, key))
            continue  # folded in once everything is applied (migrate.fold_older)
        if isinstance(target, ModelConfig) and name == "attention_settings":
            forget_older(target, value)  # a later setting wins over an earlier older key
        if name not in hints:
            known = [f"{prefix}{n}" for n in hints]
            raise ConfigError(
                f"unknown config key {key!r}{did_you_mean(key, known)}; known keys: "
                f"{', '.join(known)}"
            )
        current = getattr(target, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a section; set its keys, e.g. {key}.<key>=<value>")
            _apply(current, value, f"{key}.")
        elif isinstance(current, dict) and isinstance(value, dict):  # tables merge, key by key
            setattr(target, name, _merged(current, check_type(value, hints[name], key)))
        else:
            setattr(target, name, check_type(value, hints[name], key))


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """new over old, tables within tables merged too (--set model.attention_settings.primal.rank=8
    keeps the file's other Primal settings)."""
    merged = dict(old)
    for key, value in new.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def packaged_config_names() -> list[str]:
    """The configs that can be named without a path: configs/*.toml, by file stem."""
    return sorted(p.stem for p in resource_dir("configs").glob("*.toml"))


def named_config_path(name_or_path: str) -> Path:
    """A config given as a file path, or by name from the packaged configs/ (e.g. "dt")."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    packaged = resource_dir("configs") / f"{name_or_path}.toml"
    if not packaged.is_file():
        known = packaged_config_names()
        raise ConfigError(
            f"unknown config {name_or_path!r}{did_you_mean(name_or_path, known)}; use a .toml "
            f"file or one of {known}"
        )
    return packaged


# How a value that is TOML and not a bare word begins: a list, a table or a quoted string.
TOML_OPENERS = ("[", "{", '"', "'")


def parse_override(text: str) -> tuple[str, Any]:
    """Parse 'section.key=value' with a TOML value; bare words are taken as strings, and a value
    that opens a list, table or string but is not TOML is refused with TOML's own reason."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (e.g. train.lr=3e-4), got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    if not key:
        raise ConfigError(f"--set expects key=value (e.g. train.lr=3e-4), got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as err:
        if raw[:1] in TOML_OPENERS:  # meant as a TOML list, table or string: say what is wrong
            raise ConfigError(
                f"--set {key}: {raw} is not a TOML value ({err}); e.g. "
                f"""--set 'model.attention=["softmax","primal","primal"]'"""
            ) from None
        value = raw
    return key, value


def option_overrides(
    *,
    steps: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    final_episodes: int | None = None,
    offline: bool = False,
    compile: bool = False,
) -> list[str]:
    """The `train` options that stand for config keys, as --set overrides: the one mapping from
    options to keys, used by `primal-dt train` and by each run of a sweep."""
    values = {
        "train.steps": steps,
        "train.seed": seed,
        "train.device": device,
        "eval.final_episodes": final_episodes,
        "data.download": False if offline else None,
        "train.compile": compile or None,
    }
    return [f"{key}={json.dumps(value)}" for key, value in values.items() if value is not None]


def nest(key: str, value: Any) -> dict[str, Any]:
    """'a.b.c', v -> {'a': {'b': {'c': v}}}."""
    result: Any = value
    for part in reversed(key.split(".")):
        result = {part: result}
    return result


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    task: str | None = None,
) -> Config:
    """Defaults, then the TOML file, then each --set override; then the task's settings from
    attention_settings_by_task, for the kinds a block has, where no override gave them."""
    config = Config()
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"cannot read config {path}: {err}") from err
        _apply(config, data, "")
    from_file = set(config.model.attention_settings)
    parsed = [parse_override(text) for text in overrides]
    for key, value in parsed:
        _apply(config, nest(key, value), "")
    fold_older(config.model)
    config.validate()
    if any(key == "model.attention" for key, _ in parsed):
        _drop_replaced_settings(config.model, from_file, [key for key, _ in parsed])
    if task is not None:
        _task_settings(config, task, [key for key, _ in parsed])
    return config


def _given(kind: str, setting: str, keys: list[str]) -> bool:
    """Whether --set gave a kind's setting: by its key, its table's, or its older key."""
    own = f"model.attention_settings.{kind}.{setting}"
    older = [f"model.{name}" for name, found in LEGACY_SETTINGS.items() if found == (kind, setting)]
    tables = [key for key in keys if key.startswith("model.attention_settings")]
    return any(own == key or own.startswith(f"{key}.") for key in tables) or bool(
        set(older) & set(keys)
    )


def _task_settings(config: Config, task: str, keys: list[str]) -> None:
    """attention_settings_by_task's values for task, for the kinds a block has, where --set gave
    none of them."""
    for kind, settings in config.attention_settings_by_task.items():
        if not config.model.blocks_of(kind):
            continue
        for setting, by_task in settings.items():
            if task in by_task and not _given(kind, setting, keys):
                table = config.model.attention_settings.setdefault(kind, {})
                table[setting] = by_task[task]


def _drop_replaced_settings(model: ModelConfig, from_file: set[str], keys: list[str]) -> None:
    """--set model.attention replaces the file's kinds, and with them the file's settings of the
    kinds no block has now (configs/primal-dt.toml --set model.attention="softmax" is the paper's
    sizes with softmax everywhere); a table given by --set stays, to be refused if unused."""
    given = {key.split(".")[2] for key in keys if key.startswith("model.attention_settings.")}
    for kind in from_file - set(model.block_kinds()) - given:
        del model.attention_settings[kind]


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config saved with to_dict (checkpoints), with the same checks as a file."""
    config = Config()
    _apply(config, data, "")
    fold_older(config.model)
    return config.validate()
