"""primal-dt: a Decision Transformer with masked (causal) Primal-Attention for offline RL.

The package's public API is the method (primal_dt.method): the attention layers, each usable on
its own in any model (x (B, L, D) and an optional padding mask (B, L) in, the output and its
auxiliary loss out), the registry that builds them by name, the KSVD objective and loss, and the
Decision Transformer with its config. Importing it needs torch alone: the environments, datasets
and logging are imported by the modules that use them.

The names load on first use (PEP 562), so that `primal-dt --help` and the modules that need no
torch start without importing it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primal_dt.method import (
        ATTENTIONS,
        CosformerAttention,
        DecisionTransformer,
        FlowformerAttention,
        LinearAttention,
        ModelConfig,
        PerformerAttention,
        PrimalAttention,
        ReformerAttention,
        SoftmaxAttention,
        build_attention,
        ksvd_loss,
        ksvd_objective,
    )

__version__ = "0.1.0"

__all__ = [
    "ATTENTIONS",
    "SoftmaxAttention",
    "CosformerAttention",
    "DecisionTransformer",
    "FlowformerAttention",
    "LinearAttention",
    "ModelConfig",
    "PerformerAttention",
    "PrimalAttention",
    "ReformerAttention",
    "build_attention",
    "ksvd_loss",
    "ksvd_objective",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("primal_dt.method"), name)
    raise AttributeError(f"module 'primal_dt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
