"""Causal cosFormer attention, Qin et al., "cosFormer: Rethinking Softmax in Attention" (ICLR 2022,
arXiv 2202.08791), its Eqs. (9)-(11) in causal form.

  C1. q, k, v = x Wq, x Wk, x Wv (with biases), split into H heads of size d.
  C2. ReLU features, padded keys zeroed: relu(q_i), m_j relu(k_j).
  C3. The re-weighting cos(pi/2 (i - j) / M), decomposed as cos a_i cos a_j + sin a_i sin a_j with
      a_i = pi i / (2 M): features [relu(q_i) cos a_i, relu(q_i) sin a_i] and likewise for k_j.
  C4. o_i = sum_{j<=i} A_ij v_j / max(sum_{j<=i} A_ij, eps), eps = 1e-6,
      A_ij = m_j (relu(q_i) . relu(k_j)) cos(pi/2 (i - j) / M); heads merged, output projection,
      residual dropout. Cost O(L d^2) through causal_linear.py's chunks.

Where it departs from the authors' code (OpenNLPLab/cosFormer), and why: there M is the length of
the sequence given, so the weight of every pair changes when a token is added, and a causal layer
would give a token a different output in acting (3K - 1 tokens) from training (3K). Here M is
fixed, the model's window of 3K tokens (model.context_len), so that the weights depend on i - j
alone, which also makes them blind to how much left padding there is; M >= L keeps every weight
positive, and a longer input is refused. Positions count from 1, as there.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_dt.common.config import ModelConfig
from primal_dt.method.causal_linear import sums_and_normaliser
from primal_dt.method.layer import ProjectedAttention, register

EPS = 1e-6


@register("cosformer")
class CosformerAttention(ProjectedAttention):
    """Causal cosFormer attention, steps C1-C4 of the module docstring; max_length is M."""

    label = "cosFormer"

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        dropout: float = 0.0,
        max_length: int = 3 * ModelConfig.context_len,
    ) -> None:
        super().__init__(embed_dim, n_head, dropout)
        if max_length <= 0:
            raise ValueError(
                f"{type(self).__name__}: max_length must be positive, got {max_length}"
            )
        self.max_length = max_length

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> CosformerAttention:
        return cls(config.embed_dim, config.n_head, config.dropout, 3 * config.context_len)

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        length = x.shape[1]
        if length > self.max_length:
            raise ValueError(
                f"{type(self).__name__}: {length} tokens, more than its M = {self.max_length}"
            )
        q, k, v = self.heads(x)
        positions = torch.arange(1, length + 1, device=x.device, dtype=torch.float64)
        angle = positions * (math.pi / (2 * self.max_length))
        cos, sin = (f(angle)[:, None].to(q.dtype) for f in (torch.cos, torch.sin))
        q, k = F.relu(q), F.relu(k) * mask[:, None, :, None].to(k.dtype)
        features_q = torch.cat((q * cos, q * sin), dim=-1)
        features_k = torch.cat((k * cos, k * sin), dim=-1)
        sums, normaliser = sums_and_normaliser(features_q, features_k, v)
        return self.output(sums / normaliser.clamp_min(EPS), rows), None
