"""The method: the attention layers (each usable on its own), their registry, the KSVD objective
and loss of Primal-Attention, and the Decision Transformer built from them.

The layers are exported by the names of their classes, as the registry lists them (a kind
registered later, from a folder added to this package's path, is found too: `__getattr__`)."""

from typing import Any

from primal_dt.common.config import ModelConfig as ModelConfig
from primal_dt.method.attention import ksvd_loss as ksvd_loss
from primal_dt.method.attention import ksvd_objective as ksvd_objective
from primal_dt.method.model import DecisionTransformer as DecisionTransformer
from primal_dt.method.registry import ATTENTIONS
from primal_dt.method.registry import build_attention as build_attention

#: The names exported besides the kinds' classes.
API = [
    "ATTENTIONS",
    "DecisionTransformer",
    "ModelConfig",
    "build_attention",
    "ksvd_loss",
    "ksvd_objective",
]


def kind_classes() -> dict[str, type]:
    """Each registered kind's class by its class name (PrimalAttention, ...)."""
    return {cls.__name__: cls for cls in ATTENTIONS.values()}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return [*API, *kind_classes()]
    if name in kind_classes():
        return kind_classes()[name]
    raise AttributeError(f"module 'primal_dt.method' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *kind_classes()])
