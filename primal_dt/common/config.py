"""Training configuration as data: TOML files read into typed dataclasses, overridable by key=value.

A configuration file has the sections [model], [train], [eval] and [data]; any key left out keeps
the default below (the Decision Transformer paper's settings). `--set section.key=value` overrides a
single value, parsed as a TOML value (so `--set model.primal_blocks=[0,2]` and
`--set train.lr=3e-4` both work). Unknown keys, wrong types and out-of-range values are refused with
a message that names the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primal_dt.common.errors import ConfigError, did_you_mean
from primal_dt.common.resources import resource_dir

PRIMAL_BLOCK_CHOICES = ("none", "last", "all")  # the older form, model.primal_blocks (_fold_legacy)
PRECISIONS = ("auto", "bf16", "fp32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

#: Keys of [model] from before each kind owned its settings, read from older config files,
#: checkpoints and --set as the setting they became, (kind, setting). Each applied only where a
#: block has that kind, as they were (older checkpoints carry every kind's, with defaults).
LEGACY_SETTINGS = {
    "primal_rank": ("primal", "rank"),
    "primal_init": ("primal", "init"),
    "performer_features": ("performer", "features"),
    "performer_redraw": ("performer", "redraw"),
    "reformer_buckets": ("reformer", "buckets"),
    "reformer_chunk": ("reformer", "chunk"),
    "reformer_hashes": ("reformer", "hashes"),
}


@dataclass
class ModelConfig:
    """The [model] section: the Decision Transformer's sizes and which attention each block uses.

    The defaults are the Decision Transformer paper's (embed 128, 3 layers, 1 head, K = 20, plain
    softmax attention); configs/primal-dt.toml sets the Primal paper's. Every key, with its type,
    default and meaning, is in the documentation's configuration reference, and so is each
    kind's own settings (declared by the kind itself, method/registry.py checks them).
    """

    embed_dim: int = 128  #: D, the width of every token (heads split it)
    n_layer: int = 3  #: transformer blocks
    n_head: int = 1  #: attention heads per block (must divide embed_dim)
    dropout: float = 0.1  #: dropout of embeddings, attention and residuals, in [0, 1)
    #: K, the steps in a window. It stays under [model] although the sampler and the evaluator read it:
    #: a policy acts only with the window length it was trained on, so it belongs to the model.
    context_len: int = 20
    #: The attention of every block, a kind of method/registry.py (softmax, primal, linear,
    #: reformer, performer, cosformer, flowformer); or a list of one kind per block, first to last
    #: (the Primal paper's Primal.+DT: ``["softmax", "softmax", "primal"]``).
    attention: str | list[str] = "softmax"
    #: Each kind's own settings, a table per kind that a block uses, e.g.
    #: ``[model.attention_settings.primal]`` with ``rank = 64``; a setting left out keeps the
    #: kind's default (the tables below).
    attention_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Whether the return-to-go reaches the model. false: behaviour cloning with the same network
    #: (every return token embeds 0), the baseline that says what conditioning on returns adds.
    return_conditioning: bool = True

    def block_kinds(self) -> list[str]:
        """The attention kind of each block, first to last."""
        if isinstance(self.attention, list):
            return list(self.attention)
        return [self.attention] * self.n_layer

    def primal_indices(self) -> list[int]:
        """Indices of the transformer blocks whose attention is Primal-Attention."""
        return [i for i, kind in enumerate(self.block_kinds()) if kind == "primal"]

    def settings_of(self, kind: str) -> dict[str, Any]:
        """The settings given for a kind (its table; empty: all its defaults)."""
        return dict(self.attention_settings.get(kind, {}))

    def validate(self) -> None:
        _fold_legacy(self)
        _positive(self, "model", "embed_dim", "n_layer", "n_head", "context_len")
        if isinstance(self.attention, list) and len(self.attention) != self.n_layer:
            raise ConfigError(
                f"model.attention lists {len(self.attention)} kinds for {self.n_layer} blocks "
                f"(model.n_layer); give one kind per block, or one kind for all"
            )
        if self.embed_dim % self.n_head:
            raise ConfigError(
                f"model.embed_dim ({self.embed_dim}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")


def _fold_legacy(model: ModelConfig) -> None:
    """Older keys set on this section (_apply keeps them aside until every file and override has
    been applied): model.primal_blocks becomes the list of kinds, and each LEGACY_SETTINGS key the
    setting of its kind where a block has that kind (whichever of the older key and the table
    was set last wins)."""
    legacy: dict[str, Any] = model.__dict__.pop("_legacy", {})
    blocks = legacy.pop("primal_blocks", "none")
    if blocks != "none":
        if isinstance(model.attention, list):
            raise ConfigError(
                "model.attention lists a kind per block, so model.primal_blocks (its older form) "
                f'must be left out (write "primal" in the list instead), got {blocks!r}'
            )
        indices = _primal_block_indices(blocks, model.n_layer)
        model.attention = [
            "primal" if i in indices else model.attention for i in range(model.n_layer)
        ]
    kinds = set(model.block_kinds())
    for name, value in legacy.items():
        kind, setting = LEGACY_SETTINGS[name]
        if kind in kinds:
            model.attention_settings.setdefault(kind, {})[setting] = value


def _primal_block_indices(blocks: str | list[int], n_layer: int) -> list[int]:
    """The blocks an older model.primal_blocks value names: "last", "all" or indices."""
    if isinstance(blocks, str):
        if blocks not in PRIMAL_BLOCK_CHOICES:
            raise ConfigError(
                f"model.primal_blocks must be one of {', '.join(PRIMAL_BLOCK_CHOICES)} "
                f"or a list of block indices, got {blocks!r}"
            )
        return [n_layer - 1] if blocks == "last" else list(range(n_layer))
    if any(not 0 <= i < n_layer for i in blocks):
        raise ConfigError(
            f"model.primal_blocks {blocks} has an index outside 0..{n_layer - 1} "
            f"(model.n_layer = {n_layer})"
        )
    return sorted(set(blocks))


@dataclass
class TrainConfig:
    steps: int = 100_000  #: training steps (batches)
    batch_size: int = 64  #: windows per batch
    lr: float = 1e-4  #: AdamW's peak learning rate, reached after the warm-up
    weight_decay: float = 1e-4  #: AdamW's decoupled weight decay
    warmup_steps: int = 10_000  #: linear warm-up of the learning rate from 0, then constant
    grad_clip: float = 0.25  #: the gradients' global norm is clipped to this
    ksvd_weight: float = 0.05  #: eta: weight of the KSVD loss (ignored when no block is Primal)
    return_scale: float = 1000.0  #: returns-to-go are divided by this
    seed: int = 0  #: seeds weights, sampling, dropout and evaluation episodes (0..2^32-1)
    device: str = "auto"  #: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    log_every: int = 100  #: steps between TensorBoard points and progress lines
    eval_every: int = 10_000  #: 0 disables evaluation during training
    ckpt_every: int = 10_000  #: steps between checkpoints (ckpt.pt and checkpoints/step_N.pt)
    keep_checkpoints: int = 3  #: step checkpoints kept in checkpoints/ besides ckpt.pt and best.pt
    #: torch.compile the model for training (static shapes: every batch is batch_size x K).
    compile: bool = False
    #: torch.compile mode: default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs.
    compile_mode: str = "default"
    #: "auto": bf16 autocast where the device multiplies bf16 in hardware (CUDA since Ampere, CPUs
    #: with AMX or AVX-512 BF16), else float32; "bf16" or "fp32" force one (device.py). A run
    #: records what "auto" resolved to, and keeps it when resumed.
    precision: str = "auto"
    #: CPU threads for training, fixed for the whole run; 0: automatic (cpu.py: OMP_NUM_THREADS,
    #: else one per usable core).
    threads: int = 0

    def validate(self) -> None:
        _positive(self, "train", "steps", "batch_size", "log_every", "ckpt_every")
        _positive(self, "train", "lr", "return_scale", "grad_clip")
        for name in (
            "weight_decay",
            "ksvd_weight",
            "warmup_steps",
            "eval_every",
            "keep_checkpoints",
            "threads",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        check_device_name(self.device, "train.device")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"train.seed must be in 0..{2**32 - 1}, got {self.seed}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"train.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}, "
                f"got {self.compile_mode!r}"
            )


EVAL_SERVICES = ("process", "inline", "external")


@dataclass
class EvalConfig:
    episodes: int = 10  #: episodes per target return at each evaluation during training
    final_episodes: int = 100  #: episodes per target at the end of training; 0: none
    targets: list[float] = field(
        default_factory=list
    )  #: empty: the task's targets (``envs/*.toml``)
    #: 0 or 1: the episodes' environments step in the evaluating process (SyncVectorEnv);
    #: N > 1: each in its own process, N stepping at once (AsyncVectorEnv), for machines with cores.
    workers: int = 0
    #: "process": a process beside training evaluates each snapshot; "inline": the training process
    #: evaluates it, training waiting meanwhile; "external": snapshots are only queued in the run
    #: directory, for `primal-dt eval --watch RUN_DIR` (e.g. on another machine).
    service: str = "process"
    device: str = "auto"  #: where the evaluating model runs: auto (train.device), cpu, cuda, cuda:N
    #: Episodes per target rendered to RUN_DIR/videos (and TensorBoard) at the final evaluation.
    video_episodes: int = 0

    def validate(self) -> None:
        _positive(self, "eval", "episodes")
        for name in ("final_episodes", "workers", "video_episodes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"eval.{name} must be >= 0, got {getattr(self, name)}")
        if self.service not in EVAL_SERVICES:
            raise ConfigError(
                f"eval.service must be one of {', '.join(EVAL_SERVICES)}, got {self.service!r}"
            )
        check_device_name(self.device, "eval.device")


@dataclass
class DataConfig:
    download: bool = True  #: fetch a missing official dataset from Minari's remote (needs network)

    def validate(self) -> None:
        pass


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)  #: the [model] section
    train: TrainConfig = field(default_factory=TrainConfig)  #: the [train] section
    eval: EvalConfig = field(default_factory=EvalConfig)  #: the [eval] section
    data: DataConfig = field(default_factory=DataConfig)  #: the [data] section
    #: The Primal paper tunes the rank per dataset: a task listed here gets this Primal rank
    #: (model.attention_settings.primal.rank) where a block is Primal, unless --set gives one.
    primal_rank_by_task: dict[str, int] = field(default_factory=dict)

    def validate(self) -> Config:
        for name in ("model", "train", "eval", "data"):
            section = getattr(self, name)
            _finite(section, name)
            section.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _finite(section: Any, prefix: str) -> None:
    """No NaN or infinity in any number of a section (nan > 0 is False, inf > 0 is True: the
    range checks alone would let inf through, to fail later as a diverged run)."""
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{prefix}.{item.name} must be a finite number, got {value}")


def _positive(section: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value <= 0:
            raise ConfigError(f"{prefix}.{name} must be > 0, got {value}")


def check_device_name(device: str, key: str) -> None:
    """The forms a device setting may take (whether this machine has it is device.py's question)."""
    if not (device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device)):
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N, got {device!r}")


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
        key = f"{prefix}{name}"
        if isinstance(target, ModelConfig) and (name in LEGACY_SETTINGS or name == "primal_blocks"):
            hint = str | list[int] if name == "primal_blocks" else Any
            target.__dict__.setdefault("_legacy", {})[name] = check_type(value, hint, key)
            continue  # folded in when the section is validated (_fold_legacy)
        if isinstance(target, ModelConfig) and name == "attention_settings":
            _forget_legacy(target, value)  # a later setting wins over an earlier older key
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


def _forget_legacy(model: ModelConfig, tables: Any) -> None:
    """Drop the older keys that these settings tables set anew."""
    legacy = model.__dict__.get("_legacy", {})
    for name, (kind, setting) in LEGACY_SETTINGS.items():
        if isinstance(tables, dict) and setting in (tables.get(kind) or {}):
            legacy.pop(name, None)


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


def parse_override(text: str) -> tuple[str, Any]:
    """Parse 'section.key=value' with a TOML value; bare words are taken as strings."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (e.g. train.lr=3e-4), got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    if not key:
        raise ConfigError(f"--set expects key=value (e.g. train.lr=3e-4), got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
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
    values = {"train.steps": steps, "train.seed": seed, "train.device": device,
              "eval.final_episodes": final_episodes,
              "data.download": False if offline else None, "train.compile": compile or None}  # fmt: skip
    return [f"{key}={json.dumps(value)}" for key, value in values.items() if value is not None]


def nest(key: str, value: Any) -> dict[str, Any]:
    """'a.b.c', v -> {'a': {'b': {'c': v}}}."""
    result: Any = value
    for part in reversed(key.split(".")):
        result = {part: result}
    return result


# The --set keys that give the Primal rank, which then wins over primal_rank_by_task.
RANK_KEYS = ("model.attention_settings.primal.rank", "model.primal_rank")


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    task: str | None = None,
) -> Config:
    """Defaults, then the TOML file, then each --set override; then the task's Primal rank from
    primal_rank_by_task, where a block is Primal and no override gave the rank."""
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
    config.validate()
    if any(key == "model.attention" for key, _ in parsed):
        _drop_replaced_settings(config.model, from_file, [key for key, _ in parsed])
    rank_given = any(key.startswith(RANK_KEYS) for key, _ in parsed)
    if task in config.primal_rank_by_task and config.model.primal_indices() and not rank_given:
        primal = config.model.attention_settings.setdefault("primal", {})
        primal["rank"] = config.primal_rank_by_task[task]
    return config


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
    return config.validate()
