"""Older configs, config.json files and checkpoints read as today's, at the loader's edge: the
core (config.py) knows today's keys alone.

- Renamed keys (RENAMED_KEYS): read as their new names (train.ksvd_weight is train.aux_weight).
- [primal_rank_by_task]: read as [attention_settings_by_task.primal.rank] (reshaped).
- [model] keys from before each kind owned its settings (LEGACY_SETTINGS: model.primal_rank and
  the like) and model.primal_blocks (the older form of model.attention's list): kept aside while
  the file and the overrides are applied (stash_older), and folded in once they all are
  (fold_older), since where they apply depends on the final list of kinds; a later settings table
  wins over an earlier older key (forget_older).
"""

from __future__ import annotations

from typing import Any

from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import ConfigError, did_you_mean

PRIMAL_BLOCK_CHOICES = ("none", "last", "all")  # model.primal_blocks' named values

#: Keys renamed, read as their new names from older config files, checkpoints and --set.
RENAMED_KEYS = {"train.ksvd_weight": "train.aux_weight"}

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


def reshaped(key: str, value: Any) -> tuple[str, Any]:
    """An older top-level table as today's: [primal_rank_by_task] (task -> rank) is
    [attention_settings_by_task.primal.rank]; any other key as it is."""
    if key == "primal_rank_by_task":
        return "attention_settings_by_task", {"primal": {"rank": value}}
    return key, value


def is_older(name: str) -> bool:
    """Whether a [model] key is one of the older ones fold_older reads."""
    return name in LEGACY_SETTINGS or name == "primal_blocks"


def stash_older(model: ModelConfig, name: str, value: Any) -> None:
    """Keep an older [model] key aside for fold_older."""
    model.__dict__.setdefault("_older", {})[name] = value


def forget_older(model: ModelConfig, tables: Any) -> None:
    """Drop the older keys that these settings tables set anew."""
    older = model.__dict__.get("_older", {})
    for name, (kind, setting) in LEGACY_SETTINGS.items():
        if isinstance(tables, dict) and setting in (tables.get(kind) or {}):
            older.pop(name, None)


def fold_older(model: ModelConfig) -> None:
    """The older keys kept aside (stash_older), once every file and override is applied:
    model.primal_blocks becomes the list of kinds, and each LEGACY_SETTINGS key the setting of
    its kind where a block has that kind (whichever of the older key and the table was set last
    wins)."""
    legacy: dict[str, Any] = model.__dict__.pop("_older", {})
    blocks = legacy.pop("primal_blocks", "none")
    if isinstance(blocks, str) and blocks not in PRIMAL_BLOCK_CHOICES:
        raise ConfigError(
            f"model.primal_blocks must be one of {', '.join(PRIMAL_BLOCK_CHOICES)} or a list of "
            f"block indices, got {blocks!r}{did_you_mean(blocks, PRIMAL_BLOCK_CHOICES)}"
        )
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
        return [n_layer - 1] if blocks == "last" else list(range(n_layer))
    if any(not 0 <= i < n_layer for i in blocks):
        raise ConfigError(
            f"model.primal_blocks {blocks} has an index outside 0..{n_layer - 1} "
            f"(model.n_layer = {n_layer})"
        )
    return sorted(set(blocks))
