"""The attention kinds by name: a block's `model.attention` names one of these.

Adding an attention takes one class in this folder (an AttentionLayer: layer.py), one line here,
and a config in configs/ that names it.
"""

from __future__ import annotations

from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import ConfigError, did_you_mean
from primal_dt.method.attention import CausalSelfAttention, PrimalAttention
from primal_dt.method.cosformer import CosformerAttention
from primal_dt.method.flowformer import FlowAttention
from primal_dt.method.layer import AttentionLayer
from primal_dt.method.linear_attention import LinearAttention
from primal_dt.method.performer import PerformerAttention
from primal_dt.method.reformer import ReformerAttention

#: Every attention kind by the name that ``model.attention`` gives it, to its AttentionLayer class.
ATTENTIONS: dict[str, type[AttentionLayer]] = {
    "softmax": CausalSelfAttention,
    "primal": PrimalAttention,
    "linear": LinearAttention,
    "reformer": ReformerAttention,
    "performer": PerformerAttention,
    "cosformer": CosformerAttention,
    "flowformer": FlowAttention,
}


def attention_class(kind: str) -> type[AttentionLayer]:
    """The class of a kind, or a ConfigError naming the kinds there are."""
    if kind not in ATTENTIONS:
        raise ConfigError(
            f"model.attention: unknown attention {kind!r}{did_you_mean(kind, ATTENTIONS)}; "
            f"one of {', '.join(ATTENTIONS)}"
        )
    return ATTENTIONS[kind]


def check_kinds(config: ModelConfig) -> None:
    """Every block's kind is known (a ConfigError otherwise), before anything is built."""
    for kind in config.block_kinds():
        attention_class(kind)


def build_attention(kind: str, config: ModelConfig) -> AttentionLayer:
    """A layer of the named kind, sized and set up by a model config (its width, heads, dropout
    and the kind's own keys); a ConfigError for an unknown kind."""
    return attention_class(kind).from_config(config)


def attention_label(kind: str) -> str:
    """How reports and spectra name a kind ("Primal", "softmax", "Flowformer", ...)."""
    return ATTENTIONS[kind].label if kind in ATTENTIONS else kind
