"""The method: the attention layers (each usable on its own), their registry, the KSVD objective
and loss of Primal-Attention, and the Decision Transformer built from them."""

from primal_dt.common.config import ModelConfig
from primal_dt.method.attention import (
    PrimalAttention,
    SoftmaxAttention,
    ksvd_loss,
    ksvd_objective,
)
from primal_dt.method.cosformer import CosformerAttention
from primal_dt.method.flowformer import FlowformerAttention
from primal_dt.method.linear_attention import LinearAttention
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.performer import PerformerAttention
from primal_dt.method.reformer import ReformerAttention
from primal_dt.method.registry import ATTENTIONS, build_attention

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
