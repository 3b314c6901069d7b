"""Training configuration as data: the typed dataclasses of each section, with their checks.

A configuration file has the sections [model], [train], [eval] and [data]; any key left out keeps
the default below (the Decision Transformer paper's settings). loading.py reads TOML files and
`--set section.key=value` overrides (parsed as TOML values, so `--set train.lr=3e-4` and
`--set 'model.attention=["softmax","softmax","primal"]'` both work) into them. Unknown keys, wrong
types and out-of-range values are refused with a message that names the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from primal_dt.common.errors import ConfigError, did_you_mean

PRECISIONS = ("auto", "bf16", "fp32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Settings that change how a run is executed, not what it computes: a sweep may differ in these
# from the runs it finds (e.g. resumed on another device, or asked to go to more steps).
MECHANICS = {
    "train": {
        "steps",
        "device",
        "compile",
        "log_every",
        "ckpt_every",
        "keep_checkpoints",
        "threads",
    },
    "eval": {"device", "workers", "service"},
    "data": {"download"},
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

    def blocks_of(self, kind: str) -> list[int]:
        """Indices of the transformer blocks whose attention is `kind`."""
        return [i for i, found in enumerate(self.block_kinds()) if found == kind]

    def settings_of(self, kind: str) -> dict[str, Any]:
        """The settings given for a kind (its table; empty: all its defaults)."""
        return dict(self.attention_settings.get(kind, {}))

    def validate(self) -> None:
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


@dataclass
class TrainConfig:
    steps: int = 100_000  #: training steps (batches)
    batch_size: int = 64  #: windows per batch
    lr: float = 1e-4  #: AdamW's peak learning rate, reached after the warm-up
    weight_decay: float = 1e-4  #: AdamW's decoupled weight decay
    warmup_steps: int = 10_000  #: linear warm-up of the learning rate from 0, then constant
    grad_clip: float = 0.25  #: the gradients' global norm is clipped to this
    #: eta: the weight of the auxiliary loss, the kind's own (Primal's KSVD loss; a kind without
    #: one has none). Read from ``train.ksvd_weight`` too, its older name.
    aux_weight: float = 0.05
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
            "aux_weight",
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
                f"{did_you_mean(self.precision, PRECISIONS)}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}, "
                f"got {self.compile_mode!r}{did_you_mean(self.compile_mode, COMPILE_MODES)}"
            )


EVAL_SERVICES = ("process", "inline", "external")


@dataclass
class EvalConfig:
    episodes: int = 10  #: episodes per target return at each evaluation during training
    final_episodes: int = 100  #: episodes per target at the end of training; 0: none
    #: empty: the task's targets (``envs/*.toml``)
    targets: list[float] = field(default_factory=list)
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
                f"{did_you_mean(self.service, EVAL_SERVICES)}"
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
    #: A kind's settings per task, ``[attention_settings_by_task.<kind>.<setting>]`` with a value
    #: per task: a task listed gets that setting (model.attention_settings.<kind>.<setting>) where
    #: a block has the kind, unless --set gives it. The Primal paper tunes its rank per dataset
    #: (``[attention_settings_by_task.primal.rank]``, configs/primal-dt.toml).
    attention_settings_by_task: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

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


def flat_settings(config: Config) -> dict[str, Any]:
    """{"model.embed_dim": 128, ...}: every setting by its --set key."""
    return {
        f"{section}.{key}": value
        for section, values in config.to_dict().items()
        for key, value in values.items()
    }
