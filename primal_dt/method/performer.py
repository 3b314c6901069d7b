"""Causal Performer attention (FAVOR+), Choromanski et al., "Rethinking Attention with Performers"
(ICLR 2021, arXiv 2009.14794): softmax attention through positive orthogonal random features.

  R1. q, k, v = x Wq, x Wk, x Wv (with biases), H heads of size d; x' = x d^(-1/4) for q and k,
      so that E[phi(q') . phi(k')] = exp(q . k / sqrt(d)), the softmax kernel.
  R2. phi(x') = exp(W x' - ||x'||^2 / 2) / sqrt(m) with W (m, d), m = features (its setting):
      blocks of d orthonormal rows (QR of a Gaussian matrix), each row scaled by the norm of an
      independent Gaussian d-vector (the paper's orthogonal random features, ortho_scaling 0).
      One W for all heads of a layer.
  R3. o_i = sum_{j<=i} A_ij v_j / sum_{j<=i} A_ij, A_ij = m_j phi(q_i') . phi(k_j') (0 where no
      real key precedes i); heads merged, output projection, residual dropout. Cost O(L m d)
      through causal_linear.py.
  R4. Stabilisers, exact: a query's features are divided by exp of their largest exponent (it
      cancels in o_i); a key's by exp(s_j), s_j its largest exponent, and put back as the weight
      exp(s_j) that causal_linear.py's weighted sums carry relative to the running maximum of
      s over the prefix. Both change no value of o_i; the exponents and features are float32.
  R5. W is redrawn every `redraw` training steps (its setting; 0: never), from the layer's seed
      and the step; evaluation uses the W of the checkpoint.

Where it departs from the public code (google-research performer/fast_attention,
lucidrains/performer-pytorch), and why: both stabilise keys with a maximum over the whole
sequence, through which a later token can underflow an earlier token's sums, and both add a small
epsilon to every feature (1e-4, 1e-6), which the ratio above does without; here the running
maximum keeps it causal and padding-exact. Google's code redraws W at every call from a seed made
of the sum of all queries (the whole batch, later tokens included); redrawing every 1000 steps,
from the step, is performer-pytorch's default interval (feature_redraw_interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from primal_dt.common.config import ModelConfig
from primal_dt.method.causal_linear import sums_and_normaliser
from primal_dt.method.layer import ProjectedAttention, Redrawn, register, step_generator


def orthogonal_features(m: int, d: int, generator: torch.Generator) -> Tensor:
    """W (m, d) of step R2, float32."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        gaussian = torch.randn(d, d, generator=generator, dtype=torch.float64, device="cpu")
        q, _ = torch.linalg.qr(gaussian)
        blocks.append(q.T)
    rows = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64, device="cpu").norm(dim=1)
    return (rows * norms[:, None]).float()


def exponents(x: Tensor, features: Tensor) -> Tensor:
    """W x' - ||x'||^2 / 2 of step R2 for x (B, H, L, d), in float32 at least: (B, H, L, m)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        scaled = x.to(dtype) * x.shape[-1] ** -0.25
        return scaled @ features.to(dtype).T - 0.5 * scaled.square().sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class PerformerSettings:
    """Performer's own settings, [model.attention_settings.performer]."""

    features: int = 256  #: m, random features per head (google-research's default)
    redraw: int = 1000  #: training steps between redraws of the features; 0: never

    def check(self) -> None:
        if self.features <= 0:
            raise ValueError(f"features must be > 0, got {self.features}")
        if self.redraw < 0:
            raise ValueError(f"redraw must be >= 0, got {self.redraw}")


@register("performer")
class PerformerAttention(ProjectedAttention, Redrawn):
    """Causal FAVOR+ attention, steps R1-R5 of the module docstring."""

    label = "Performer"
    settings_class = PerformerSettings
    features: Tensor  # W (m, d), a buffer

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        dropout: float = 0.0,
        features: int = PerformerSettings.features,
        redraw_every: int = PerformerSettings.redraw,
    ) -> None:
        super().__init__(embed_dim, n_head, dropout)  # the seed first (Redrawn), then q, k, v
        if features <= 0 or redraw_every < 0:
            raise ValueError(
                f"{type(self).__name__}: features must be positive and redraw_every >= 0, got "
                f"{features} and {redraw_every}"
            )
        self.num_features = features
        self.redraw_every = redraw_every
        head_dim = embed_dim // n_head
        self.register_buffer("features", self._draw(0, head_dim).to(torch.get_default_device()))

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> PerformerAttention:
        own = settings or PerformerSettings()
        return cls(config.embed_dim, config.n_head, config.dropout, own.features, own.redraw)

    def _draw(self, step: int, head_dim: int) -> Tensor:
        return orthogonal_features(self.num_features, head_dim, step_generator(self.seed, step))

    def redraw(self, step: int) -> bool:
        if self.redraw_every and step > 0 and step % self.redraw_every == 0:
            self.features.copy_(self._draw(step, self.features.shape[1]))
            return True
        return False

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        q, k, v = self.heads(x)
        query_exp, key_exp = exponents(q, self.features), exponents(k, self.features)
        query = torch.exp(query_exp - query_exp.amax(dim=-1, keepdim=True)).to(v.dtype)
        key_max = key_exp.amax(dim=-1)  # s_j
        key = torch.exp(key_exp - key_max[..., None]).to(v.dtype)
        log_weights = key_max.masked_fill(~mask[:, None, :].bool(), float("-inf"))
        sums, normaliser = sums_and_normaliser(query, key, v, log_weights)
        # A query with no real key yet (padding) has sums of 0: its output is 0, its gradient too.
        y = sums / torch.where(normaliser > 0, normaliser, 1.0)
        return self.output(y, rows), None
