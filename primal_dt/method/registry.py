"""The attention kinds by name: a block's `model.attention` names one of these.

A kind is one file in this folder: its class (an AttentionLayer, layer.py), marked with
``@register("name")``, with its settings class where it has settings; and its float64
reference in tests/test_efficient_attention.py (a test fails for a kind without one). Importing
this module imports every module of the folder, and of the folders $PRIMAL_DT_KINDS names
(load_kinds), so each kind is registered, and the
package's exports, the configuration reference and the configs' checks find it from here
(docs/development.md, "Adding an attention").
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
import typing
from typing import Any

from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import ConfigError, did_you_mean
from primal_dt.common.loading import check_type
from primal_dt.method.layer import ATTENTIONS, AttentionLayer, register

__all__ = [
    "ATTENTIONS",
    "AttentionLayer",
    "attention_class",
    "attention_label",
    "aux_loss_name",
    "build_attention",
    "check_kinds",
    "kind_settings",
    "load_kinds",
    "register",
]


#: Folders of kinds kept outside the package ($PRIMAL_DT_KINDS, separated by os.pathsep): their
#: modules are imported as this package's own, in every process (the evaluator's included).
KINDS_VARIABLE = "PRIMAL_DT_KINDS"


def load_kinds() -> None:
    """Import every module of this package, and of the folders $PRIMAL_DT_KINDS names, where each
    kind registers itself."""
    package = sys.modules[__package__]
    for folder in filter(None, os.environ.get(KINDS_VARIABLE, "").split(os.pathsep)):
        if folder not in package.__path__:
            package.__path__.append(folder)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")


def attention_class(kind: str) -> type[AttentionLayer]:
    """The class of a kind, or a ConfigError naming the kinds there are."""
    if kind not in ATTENTIONS:
        raise ConfigError(
            f"model.attention: unknown attention {kind!r}{did_you_mean(kind, ATTENTIONS)}; "
            f"one of {', '.join(ATTENTIONS)}"
        )
    return ATTENTIONS[kind]


def check_kinds(config: ModelConfig) -> None:
    """Every block's kind is known, every settings table names a kind that a block uses, and each
    used kind's settings are its own, of their types and in range: a ConfigError naming the key
    otherwise, before anything is built."""
    kinds = config.block_kinds()
    for kind in kinds:
        attention_class(kind)
    for kind in config.attention_settings:
        key = f"model.attention_settings.{kind}"
        if kind not in ATTENTIONS:
            raise ConfigError(
                f"{key}: unknown attention {kind!r}{did_you_mean(kind, ATTENTIONS)}; one of "
                f"{', '.join(ATTENTIONS)}"
            )
        if kind not in kinds:
            raise ConfigError(
                f"{key}: no block uses {kind} (model.attention = {config.attention!r}), so its "
                f"settings would be ignored; remove them or give a block that kind"
            )
    for kind in dict.fromkeys(kinds):
        kind_settings(kind, config)


def check_settings_by_task(by_task: dict[str, dict[str, Any]]) -> None:
    """attention_settings_by_task names known kinds and their own settings: a ConfigError naming
    the key otherwise (a misspelt kind would otherwise be ignored without a word)."""
    for kind, settings in by_task.items():
        key = f"attention_settings_by_task.{kind}"
        if kind not in ATTENTIONS:
            raise ConfigError(
                f"{key}: unknown attention {kind!r}{did_you_mean(kind, ATTENTIONS)}; one of "
                f"{', '.join(ATTENTIONS)}"
            )
        cls = attention_class(kind).settings_class
        fields = [item.name for item in dataclasses.fields(cls)] if cls is not None else []
        for name in settings:
            if name not in fields:
                raise ConfigError(
                    f"unknown setting {key}.{name}{did_you_mean(name, fields)}; {kind}'s "
                    f"settings: {', '.join(fields) or 'none'}"
                )


def kind_settings(kind: str, config: ModelConfig) -> Any:
    """A kind's settings: its settings class (the kind's `settings_class`) filled from
    model.attention_settings.<kind>, the rest defaults, checked; None for a kind without
    settings. The one reader of those tables: a ConfigError names the key that is wrong."""
    cls = attention_class(kind)
    given = config.settings_of(kind)
    key = f"model.attention_settings.{kind}"
    if cls.settings_class is None:
        if given:
            raise ConfigError(f"{key}: {kind} has no settings, got {', '.join(given)}")
        return None
    fields = {item.name: item for item in dataclasses.fields(cls.settings_class)}
    hints = typing.get_type_hints(cls.settings_class)
    values = {}
    for name, value in given.items():
        if name not in fields:
            raise ConfigError(
                f"unknown setting {key}.{name}{did_you_mean(name, fields)}; {kind}'s settings: "
                f"{', '.join(fields)}"
            )
        values[name] = check_type(value, hints[name], f"{key}.{name}")
    settings = cls.settings_class(**values)
    try:
        settings.check()
    except ValueError as err:
        raise ConfigError(f"{key}.{err}") from None
    return settings


def build_attention(kind: str, config: ModelConfig) -> AttentionLayer:
    """A layer of the named kind, sized and set up by a model config (its width, heads, dropout
    and the kind's own settings, kind_settings); a ConfigError for an unknown kind or a bad
    setting."""
    return attention_class(kind).from_config(config, kind_settings(kind, config))


def aux_loss_name(kinds: list[str]) -> str | None:
    """The name a model of these blocks' kinds logs its auxiliary loss under (train/<name>): its
    kinds' where every kind with one agrees (Primal's ksvd_loss), "aux_loss" where kinds with
    different ones are mixed; None where no kind has one."""
    names = {name for kind in kinds if (name := attention_class(kind).aux_loss_name) is not None}
    return names.pop() if len(names) == 1 else "aux_loss" if names else None


def attention_label(kind: str) -> str:
    """How reports and spectra name a kind ("Primal", "softmax", "Flowformer", ...)."""
    return ATTENTIONS[kind].label if kind in ATTENTIONS else kind


load_kinds()
