"""Causal softmax attention, the masked (causal) Primal-Attention, and the KSVD loss.

Both attention layers take tokens x (B, L, D) and a padding mask (B, L), true for real tokens,
and guarantee that a real token's output depends only on real tokens at or before it. With
last_only=True they return the output of the last token alone (B, 1, D), which is all that acting
needs: the same numbers, without the work for the other positions' outputs.

Primal-Attention is the asymmetric-kernel-SVD attention of Chen, Tao, Tonin and Suykens
(NeurIPS 2023, arXiv 2305.19798), in its causal form for the Decision Transformer: queries and
keys are replaced by their running means over the prefix, mapped to the unit sphere and projected
onto s left (We) and s right (Wr) singular directions per head. It costs O(L) in the sequence
length: prefix means are cumulative sums, and no L x L tensor exists anywhere.

One deliberate departure from the public code: there the running mean divides by the position
index and includes padded tokens, so left padding leaks zeros into every mean. Here the means run
over the real tokens of the prefix only, which makes outputs independent of padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def causal_padding_mask(mask: Tensor) -> Tensor:
    """(B, 1, L, L) boolean mask for SDPA: query i sees keys j <= i that are real tokens.

    Every token also sees itself, so a padded query never has an empty row (which would give NaN);
    a real query never sees a padded key, so padding cannot reach real outputs.
    """
    length = mask.shape[1]
    eye = torch.eye(length, dtype=torch.bool, device=mask.device)
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    keys = mask.bool()[:, None, None, :] | eye
    return causal & keys


class CausalSelfAttention(nn.Module):
    """Canonical multi-head causal softmax attention through scaled_dot_product_attention."""

    def __init__(self, embed_dim: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, last_only: bool = False) -> tuple[Tensor, None]:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        attn_mask = causal_padding_mask(mask)
        if last_only:
            q, attn_mask = q[:, :, -1:], attn_mask[:, :, -1:]
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).reshape(batch, q.shape[2], dim)
        return self.resid_dropout(self.proj(y)), None


def masked_prefix_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Running mean over the real tokens of each prefix: sum_{j<=i} m_j x_j / max(1, sum_{j<=i} m_j).

    x: (B, H, L, d), mask: (B, L). Summed in at least float32, so bf16 does not erode long sums.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    weights = mask.to(dtype)[:, None, :, None]
    total = (x.to(dtype) * weights).cumsum(dim=2)
    count = weights.cumsum(dim=2).clamp(min=1.0)
    return total / count


class PrimalAttention(nn.Module):
    """Masked (causal) Primal-Attention, DESIGN.md section 1.

    forward returns the layer output (B, L, D) and the per-sequence KSVD objective J (B,), whose
    square the model averages into its KSVD loss.
    """

    def __init__(self, embed_dim: int, n_head: int, rank: int, dropout: float) -> None:
        super().__init__()
        head_dim = embed_dim // n_head
        self.n_head = n_head
        self.query = nn.Linear(embed_dim, embed_dim)
        self.key = nn.Linear(embed_dim, embed_dim)
        self.we = nn.Parameter(torch.empty(n_head, head_dim, rank))
        self.wr = nn.Parameter(torch.empty(n_head, head_dim, rank))
        # Orthogonal per head; the public code's orthogonal_ on (H, d, s) mixes heads together.
        for head in range(n_head):
            nn.init.orthogonal_(self.we.data[head])
            nn.init.orthogonal_(self.wr.data[head])
        self.lam = nn.Parameter(torch.rand(n_head, rank))
        self.concat = nn.Linear(2 * rank, head_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.resid_dropout = nn.Dropout(dropout)

    def scores(self, x: Tensor, mask: Tensor, last_only: bool = False) -> tuple[Tensor, Tensor]:
        """The e- and r-scores (B, H, L, s) of DESIGN.md section 1, steps 1-4 (L = 1: the last)."""
        batch, length, _ = x.shape
        q = self.query(x).view(batch, length, self.n_head, -1).transpose(1, 2)
        k = self.key(x).view(batch, length, self.n_head, -1).transpose(1, 2)
        q_mean, k_mean = masked_prefix_mean(q, mask), masked_prefix_mean(k, mask)
        if last_only:
            q_mean, k_mean = q_mean[:, :, -1:], k_mean[:, :, -1:]
        q_bar = F.normalize(q_mean, p=2, dim=-1).to(q.dtype)
        k_bar = F.normalize(k_mean, p=2, dim=-1).to(k.dtype)
        e = torch.einsum("bhld,hds->bhls", q_bar, self.we)
        r = torch.einsum("bhld,hds->bhls", k_bar, self.wr)
        return e, r

    def forward(
        self, x: Tensor, mask: Tensor, last_only: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Output (B, L, D) and J (B,); with last_only, the last token's output and no J."""
        batch, _, dim = x.shape
        e, r = self.scores(x, mask, last_only)
        y = self.concat(torch.cat([e, r], dim=-1))  # (B, H, L, d), shared across heads
        y = y.transpose(1, 2).reshape(batch, e.shape[2], dim)
        y = self.resid_dropout(self.proj(y))
        if last_only:
            return y, None
        return y, ksvd_objective(e, r, self.lam, self.we, self.wr, mask)


def ksvd_objective(
    e: Tensor, r: Tensor, lam: Tensor, we: Tensor, wr: Tensor, mask: Tensor
) -> Tensor:
    """Per-sequence KSVD objective J (B,) over real tokens only, DESIGN.md section 2.

    J = 1/2 mean_{h,i} ||lam_h * e_hi||^2 + 1/2 mean_{h,i} ||lam_h * r_hi||^2 - mean_h Tr(We_h^T Wr_h).
    The paper shows J = 0 at the KSVD stationary point, so training drives J^2 towards zero.
    """
    dtype = torch.promote_types(e.dtype, torch.float32)  # bf16 scores are summed in float32
    valid = mask.to(dtype)[:, None, :]  # (B, 1, L)
    n_head = e.shape[1]
    count = valid.sum(dim=(1, 2)).clamp(min=1.0) * n_head
    lam = lam.to(dtype)[None, :, None, :]
    energy_e = ((lam * e.to(dtype)) ** 2).sum(dim=-1)  # (B, H, L)
    energy_r = ((lam * r.to(dtype)) ** 2).sum(dim=-1)
    mean_e = (energy_e * valid).sum(dim=(1, 2)) / count
    mean_r = (energy_r * valid).sum(dim=(1, 2)) / count
    trace = (we.to(dtype) * wr.to(dtype)).sum(dim=(1, 2)).mean()  # Tr(A^T B) = sum(A * B)
    return 0.5 * mean_e + 0.5 * mean_r - trace
