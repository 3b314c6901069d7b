"""Causal linear attention, the Linear Transformer of Katharopoulos et al., "Transformers are RNNs"
(ICML 2020, arXiv 2006.16236), its Eq. (9) in causal form.

  L1. q, k, v = x Wq, x Wk, x Wv (with biases), split into H heads of size d.
  L2. phi(u) = elu(u) + 1, positive; padded keys are zeroed, phi(k_j) m_j.
  L3. o_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps), S_i = sum_{j<=i} m_j phi(k_j) v_j^T,
      z_i = sum_{j<=i} m_j phi(k_j), eps = 1e-6; heads merged, output projection, residual dropout.
  The explicit form it factorises: o_i = sum_{j<=i} A_ij v_j / (sum_{j<=i} A_ij + eps),
  A_ij = m_j phi(q_i) . phi(k_j). Cost O(L d^2) through causal_linear.py's chunks.

As idiap/fast-transformers (CausalLinearAttention): the same feature map, eps and no 1/sqrt(d)
scale. There the padding mask is a length mask (right padding); here any 0/1 mask zeroes keys.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from primal_dt.method.causal_linear import sums_and_normaliser
from primal_dt.method.layer import ProjectedAttention, register

EPS = 1e-6


@register("linear")
class LinearAttention(ProjectedAttention):
    """Causal linear attention, steps L1-L3 of the module docstring."""

    label = "Linear"

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        q, k, v = self.heads(x)
        keys = (F.elu(k) + 1.0) * mask[:, None, :, None].to(k.dtype)
        sums, normaliser = sums_and_normaliser(F.elu(q) + 1.0, keys, v)
        return self.output(sums / (normaliser + EPS), rows), None
