"""Causal Flow-Attention, Wu et al., "Flowformer: Linearizing Transformers with Conservation
Flows" (ICML 2022, arXiv 2202.06258), as its reinforcement-learning code computes it
(thuml/Flowformer, Flowformer_RL/decision_transformer/models/flowformer_attention.py).

Tokens are sinks (queries) and sources (keys); only real tokens take part, and n_i is the count
of real tokens up to i (at least 1). With eps = 1e-6 added to every vector before a dot product:
  F1. q, k, v = x Wq, x Wk, x Wv (with biases), H heads; phi = sigmoid, padding zeroed:
      Q_i = m_i phi(q_i), K_j = m_j phi(k_j).
  F2. Incoming flow of sink i and outgoing flow of source j, over the causal prefix:
      I_i = n_i / <Q_i + eps, sum_{j<=i} K_j + eps>,  O_j = n_j / <K_j + eps, sum_{i<=j} Q_i + eps>.
  F3. Conservation (the flows with the other side fixed at 1):
      I'_i = <Q_i + eps, sum_{j<=i} K_j O_j + eps> / n_i,
      O'_j = clip(<K_j + eps, sum_{i<=j} Q_i I_i + eps> / n_j, -10, 10).
  F4. Allocation a_i = sigmoid(I'_i); competition among the sources so far,
      c_j = n_j exp(O'_j) / sum_{j'<=j} m_j' exp(O'_j').
  F5. o_i = a_i sum_{j<=i} <Q_i, K_j> c_j v_j / <Q_i + eps, sum_{j<=i} K_j + eps>; heads merged,
      output projection, residual dropout. Cost O(L d^2) through causal_linear.py's chunks.

Where it departs from that code, and why: it ignores the padding mask and counts positions (it
right-pads, so a prefix never holds padding); here padded tokens are zeroed and n counts real
tokens, which makes the outputs blind to padding on either side. The clip at +-10 is the RL code's
(its root Flow_Attention.py clips at +-1). Its final sum keeps all positions' (L d d) outer
products; causal_linear.py chunks them. The flows are computed in float32 (under bf16 autocast the
value sums are bf16 products).
"""

from __future__ import annotations

import torch
from torch import Tensor

from primal_dt.method.causal_linear import causal_linear_attention
from primal_dt.method.layer import ProjectedAttention, register

EPS = 1e-6
CLIP = 10.0


def dot(a: Tensor, b: Tensor) -> Tensor:
    """<a + eps, b + eps> over the last dimension."""
    return ((a + EPS) * (b + EPS)).sum(dim=-1)


def flows(queries: Tensor, keys: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Steps F2-F4 for Q, K (B, H, L, d) in float32 and the mask (B, L): the factor of each
    query, 1 / <Q_i + eps, sum K + eps>, the allocation a (B, H, L) and the competition c."""
    real = mask[:, None, :].to(queries.dtype)
    count = real.cumsum(dim=-1).clamp(min=1.0)  # n_i
    to_sink = dot(queries, keys.cumsum(dim=2)).reciprocal()  # I_i / n_i
    from_source = dot(keys, queries.cumsum(dim=2)).reciprocal()  # O_j / n_j
    incoming = dot(queries, (keys * (from_source * count)[..., None]).cumsum(dim=2)) / count
    outgoing = dot(keys, (queries * (to_sink * count)[..., None]).cumsum(dim=2)) / count
    outgoing = outgoing.clamp(-CLIP, CLIP)
    allocation = torch.sigmoid(incoming)
    weight = torch.exp(outgoing) * real  # |O'| <= 10: no stabiliser needed in float32
    competition = weight / weight.cumsum(dim=-1).clamp_min(torch.finfo(weight.dtype).tiny) * count
    return to_sink, allocation, competition


@register("flowformer")
class FlowformerAttention(ProjectedAttention):
    """Causal Flow-Attention, steps F1-F5 of the module docstring."""

    label = "Flowformer"

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        q, k, v = self.heads(x)
        flow_dtype = torch.promote_types(q.dtype, torch.float32)
        real = mask[:, None, :, None].to(flow_dtype)
        queries = torch.sigmoid(q.to(flow_dtype)) * real
        keys = torch.sigmoid(k.to(flow_dtype)) * real
        to_sink, allocation, competition = flows(queries, keys, mask)
        dtype = v.dtype  # bf16 under autocast: the value sums are the layer's products
        y = causal_linear_attention(
            (queries * to_sink[..., None]).to(dtype),
            keys.to(dtype),
            v * competition[..., None].to(dtype),
        )
        return self.output(y * allocation[..., None].to(dtype), rows), None
