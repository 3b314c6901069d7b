"""Causal softmax attention, the masked (causal) Primal-Attention, and the KSVD loss.

This docstring is the specification that the code and its tests follow; the README's method section
states the same steps. Equation numbers are those of Chen, Tao, Tonin and Suykens, "Primal-Attention:
Self-attention through Asymmetric Kernel SVD in Primal Representation" (NeurIPS 2023, arXiv
2305.19798).

Both layers take tokens x (B, L, D) and a padding mask m (B, L), 1 for real tokens, and guarantee
that a real token's output depends only on real tokens at or before it. Given rows (a slice of
positions, R of them) they return the outputs at those positions alone (B, R, D), computed from
every token as before: the model's last block asks for the state tokens in training (the only
outputs the loss reads) and for the last token in acting. With objective=False the Primal layer skips J (and,
given rows, computes e and r at those rows alone).

Masked Primal-Attention, H heads of size d = D/H, rank s::

  P1. q = x Wq + bq, k = x Wk + bk, split into heads (B, H, L, d). No value projection: the
      kernel of Eq. (2) is evaluated through the features of q and k alone.
  P2. Causal ("masked") means over the real tokens of each prefix:
      q_bar_i = sum_{j<=i} m_j q_j / max(1, sum_{j<=i} m_j), and k_bar likewise.
  P3. Feature map phi(v) = v / ||v||_2 per head vector (the paper's cosine-similarity kernel).
  P4. Scores, the primal representation of Eq. (8) with data-independent weights:
      e_i = phi(q_bar_i) We[h], r_i = phi(k_bar_i) Wr[h]; We, Wr (H, d, s), orthogonal per head.
  P5. Output o_i = W_o [e_i; r_i] (the paper's Algorithm 1): a Linear(2s -> d) shared by the heads,
      heads merged to (B, L, D) (or (B, R, D) at R rows), an output projection Linear(D -> D),
      residual dropout.
  P6. Lambda (H, s), learned, enters only the KSVD loss.
  Cost O(B H L d s): prefix means are cumulative sums, and no L x L tensor exists anywhere.

KSVD loss, per Primal layer and per sequence b, over its real tokens R_b::

  K1. J_b = 1/2 mean_{h, i in R_b} ||Lambda_h * e_hi||^2 + 1/2 mean_{h, i in R_b} ||Lambda_h * r_hi||^2
            - mean_h Tr(We[h]^T Wr[h]),
      the objective of the primal KSVD problem, Eq. (6), averaged over heads and tokens.
  K2. The layer's loss is mean_b(J_b^2), the model's the mean over its Primal layers, and training
      minimises action MSE + eta * KSVD (Eq. (10), eta = 0.05). By Lemma 4.2 the stationary
      solution of the KSVD problem has J = 0, so driving J^2 to zero imposes it (and a low-rank
      attention output) without computing any decomposition.

How the authors' public code (PrimalAttention_RL) differs, and what this project does instead:

- Its pipeline right-pads training windows and does not pad at evaluation, so its running mean
  (a cumulative sum divided by the position index, with the mask ignored) never mixes padding into
  a real token: its real-token outputs are clean. primal-dt left-pads, as the DT paper's code does,
  so P2 masks the means; the outputs are then independent of padding on either side.
- Its KSVD objective averages the e and r energies over all 3K positions, padded ones included.
  K1 counts real tokens only, so padding changes neither J nor its gradients.
- Its ``orthogonal_`` on the whole (H, d, s) tensor makes the H flattened head blocks orthonormal
  rows: each head's block has Frobenius norm 1, entries about 1/sqrt(d s). Here, by default
  (init = "per-head", of [model.attention_settings.primal]), each head's (d, s) block has
  orthonormal columns, Frobenius norm sqrt(s): e(x), r(x) and the trace term of J start sqrt(s)
  times larger (8 at s = 64). init = "public" reproduces the public code's initialisation.
- The paper writes the energies with Lambda (e^T Lambda e); the public code and K1 square it
  (||Lambda * e||^2), which keeps them non-negative whatever Lambda's sign.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import did_you_mean
from primal_dt.method.dropout import Dropout, dropout
from primal_dt.method.layer import (
    AttentionLayer,
    ProjectedAttention,
    check_arguments,
    register,
    split_heads,
)


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


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor, dropout_p: float
) -> Tensor:
    """softmax(q k^T / sqrt(d), masked) v, with dropout on the probabilities, written out: what
    scaled_dot_product_attention computes, for a CPU, where SDPA's kernels are no faster at the
    DT's sizes (scripts/bench_attention.py; docs/benchmarks.md) and, with dropout, draw torch's
    sequential random numbers, where dropout.py draws them in parallel."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)
    probs = torch.softmax(scores.masked_fill_(~attn_mask, float("-inf")), dim=-1)
    return torch.matmul(dropout(probs, dropout_p, dropout_p > 0.0), v)


@register("softmax")
class SoftmaxAttention(ProjectedAttention):
    """Multi-head causal softmax attention over the real tokens of each prefix.

    scaled_dot_product_attention on CUDA, its computation written out on a CPU
    (explicit_attention). It has no auxiliary loss.

    Args:
        embed_dim: D, the channels of x and of the output; a multiple of n_head.
        n_head: H, the heads, each of D / H channels.
        dropout: Dropout on the attention probabilities and on the output, in [0, 1).

    Raises:
        ValueError: An argument is out of range (check_arguments).
    """

    label = "softmax"

    def __init__(self, embed_dim: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__(embed_dim, n_head, dropout)
        self.dropout = dropout

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        """Causal softmax attention over x; the arguments (x, mask, rows, objective) as
        AttentionLayer.forward.

        Returns:
            tuple[Tensor, None]: The output y (B, L, D), or (B, R, D) at rows, and None (this
            kind has no auxiliary loss).
        """
        batch, length, dim = x.shape
        attn_mask = causal_padding_mask(mask)
        if rows is None:
            q, k, v = self.qkv(x).split(dim, dim=2)
        else:  # queries only where an output is wanted; keys and values at every token
            weight, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(x[:, rows], weight[:dim], bias[:dim])
            k, v = F.linear(x, weight[dim:], bias[dim:]).split(dim, dim=2)
            attn_mask = attn_mask[:, :, rows]
        q, k, v = (split_heads(t, self.n_head) for t in (q, k, v))
        dropout_p = self.dropout if self.training else 0.0
        if x.device.type == "cpu":
            y = explicit_attention(q, k, v, attn_mask, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        return self.output(y, None), None


def masked_prefix_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Running mean over the real tokens of each prefix: sum_{j<=i} m_j x_j / max(1, sum_{j<=i} m_j).

    x: (B, L, C), mask: (B, L). Summed in at least float32, so bf16 does not erode long sums.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    weights = mask.to(dtype).unsqueeze(-1)
    total = (x.to(dtype) * weights).cumsum(dim=1)
    count = weights.cumsum(dim=1).clamp(min=1.0)
    return total / count


class UnitNormalize(torch.autograd.Function):
    """phi(v) = v / max(||v||, 1e-12) over the last dimension, as F.normalize, with a backward of
    a few passes over the tensor where autograd's composition makes about seven: at training
    sizes the layer's time goes to such passes as much as to its matrix products.

    The backward is written in differentiable operations of v and of phi(v) (the norm computed
    again from v rather than kept), so second derivatives are autograd's own, exact; and
    torch.func's transforms (vmap over a pack of runs, training/pack.py) derive their rules
    from it (setup_context, generate_vmap_rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(v: Tensor) -> Tensor:
        return v * _inverse_norm(v)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        v, unit = ctx.saved_tensors
        inv_norm = _inverse_norm(v)
        along = torch.linalg.vecdot(grad, unit, dim=-1).unsqueeze(-1)
        return grad * inv_norm - unit * (along * inv_norm)


def unit_normalize(v: Tensor) -> Tensor:
    """phi of P3: UnitNormalize's hand-written backward in eager mode; inside torch.compile,
    autograd's composition, which inductor fuses as well (and which torch.compile can vmap over
    a pack's runs, where it cannot vmap a custom Function)."""
    if torch.compiler.is_compiling():
        return v * _inverse_norm(v)
    return UnitNormalize.apply(v)


def masked_energy(x: Tensor, weights: Tensor, valid: Tensor) -> Tensor:
    """MaskedEnergy in eager mode; inside torch.compile its composition (unit_normalize says
    why)."""
    if torch.compiler.is_compiling():
        with torch.autocast(x.device.type, enabled=False):
            return (torch.matmul(x * x, weights) * valid).sum(dim=1)
    return MaskedEnergy.apply(x, weights, valid)


def _inverse_norm(v: Tensor) -> Tensor:
    """1 / max(||v||, 1e-12) over the last dimension, kept as a dimension of size 1."""
    return torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1e-12).reciprocal()


class MaskedEnergy(torch.autograd.Function):
    """sum_l m_l sum_k w_k x_lk^2 per sequence, for x (B, L, K), w (K,), m (B, L): the KSVD loss's
    energy terms, keeping no tensor but x (which the concat layer keeps anyway) for a backward that
    writes one tensor of x's size where autograd's composition keeps and writes several. Written
    for torch.func's transforms too (setup_context, generate_vmap_rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weights: Tensor, valid: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):  # a float32 sum, not a bf16 matmul
            return (torch.matmul(x * x, weights) * valid).sum(dim=1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)  # in float32, x is the concat input: kept anyway

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weights, valid = ctx.saved_tensors
        per_token = grad[:, None] * valid  # (B, L)
        with torch.autocast(x.device.type, enabled=False):
            grad_weights = torch.einsum("blk,bl->k", x * x, per_token)
        grad_x = (x * weights) * (2.0 * per_token[..., None])
        return grad_x, grad_weights, None


PRIMAL_INITS = ("per-head", "public")  # how We and Wr start (PrimalSettings.init)


@dataclass(frozen=True)
class PrimalSettings:
    """Primal-Attention's own settings, [model.attention_settings.primal]."""

    rank: int = 32  #: s, the rank of each Primal head (We and Wr are d x s)
    #: How We and Wr start: "per-head" (each head's (d, s) block orthonormal columns) or "public"
    #: (the public code's ``orthogonal_`` on the whole (H, d, s) tensor; the method page says more).
    init: str = "per-head"

    def check(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"rank must be > 0, got {self.rank}")
        if self.init not in PRIMAL_INITS:
            raise ValueError(
                f"init must be one of {', '.join(PRIMAL_INITS)}, got {self.init!r}"
                + did_you_mean(self.init, PRIMAL_INITS)
            )


@register("primal")
class PrimalAttention(AttentionLayer):
    """Masked (causal) Primal-Attention with its KSVD loss, steps P1-P6 and K1-K2 of the module
    docstring.

    Per head, the masked prefix means of the queries and keys, normalised to unit length, are
    projected onto We and Wr (H, d, s) to give the scores e and r; the output is a linear map of
    [e; r] per head, heads merged, then an output projection. No L x L tensor is formed: the cost
    is O(B H L d s). Lambda (H, s) enters only the KSVD loss, which forward returns per sequence.

    The running means are taken of x, not of q and k: q = x Wq + bq is affine, so the mean of q
    over a prefix is the mean of x projected, and one prefix sum over D channels replaces two.
    (At a padded position with no real token before it the two differ: such a position has
    nothing to average and its output is never read.) The query and key projections run as one
    matrix product, laid out per head as (q_h, k_h), so that e and r come out of one batched
    product, already side by side for the concat layer.

    Args:
        embed_dim: D, the channels of x and of the output; a multiple of n_head.
        n_head: H, the heads, each of d = D / H channels.
        rank: s, the rank of each head: We and Wr are (H, d, s).
        dropout: Dropout on the output, in [0, 1).
        init: How We and Wr start. Default "per-head": each head's (d, s) block has orthonormal
            columns (Frobenius norm sqrt(s)). "public": ``nn.init.orthogonal_`` on the whole
            (H, d, s) tensor, as the authors' public code does (the H flattened blocks
            orthonormal rows, each of Frobenius norm 1). The paper's configuration,
            configs/primal-dt.toml, uses "public" (PrimalSettings.init); this class and
            ModelConfig default to "per-head".

    Raises:
        ValueError: An argument is out of range (check_arguments).
    """

    label = "Primal"
    settings_class = PrimalSettings
    aux_loss_name = "ksvd_loss"
    reads_every_token = True  # J counts every real token, the last action token included

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        rank: int = PrimalSettings.rank,
        dropout: float = 0.0,
        init: str = PrimalSettings.init,
    ) -> None:
        super().__init__()
        check_arguments(type(self).__name__, embed_dim, n_head, dropout)
        if rank <= 0:
            raise ValueError(f"{type(self).__name__}: rank must be positive, got {rank}")
        if init not in PRIMAL_INITS:
            raise ValueError(
                f"{type(self).__name__}: init must be one of {', '.join(PRIMAL_INITS)}, got "
                f"{init!r}{did_you_mean(init, PRIMAL_INITS)}"
            )
        head_dim = embed_dim // n_head
        self.n_head = n_head
        self.query = nn.Linear(embed_dim, embed_dim)
        self.key = nn.Linear(embed_dim, embed_dim)
        self.we = nn.Parameter(torch.empty(n_head, head_dim, rank))
        self.wr = nn.Parameter(torch.empty(n_head, head_dim, rank))
        for weight in (self.we, self.wr):
            if init == "public":  # the public code: the H flattened (d, s) blocks orthonormal
                nn.init.orthogonal_(weight.data)
            else:  # each head's (d, s) block with orthonormal columns
                for head in range(n_head):
                    nn.init.orthogonal_(weight.data[head])
        self.lam = nn.Parameter(torch.rand(n_head, rank))
        self.concat = nn.Linear(2 * rank, head_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.resid_dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> PrimalAttention:
        primal = settings or PrimalSettings()
        return cls(config.embed_dim, config.n_head, primal.rank, config.dropout, primal.init)

    def scores(self, x: Tensor, mask: Tensor, rows: slice | None = None) -> Tensor:
        """e and r of steps P1-P4, stacked: (B, L, H, 2, s), [..., 0, :] = e, [..., 1, :] = r
        (at rows alone, given rows)."""
        batch, _, dim = x.shape
        heads, head_dim = self.n_head, dim // self.n_head
        # P2 before P1: the projections are affine, so the masked prefix mean of q (or k) is the
        # projection of the masked prefix mean of x; one cumulative sum serves both.
        mean = masked_prefix_mean(x, mask).to(x.dtype)
        if rows is not None:
            mean = mean[:, rows]
        length = mean.shape[1]
        weight = torch.stack(
            (
                self.query.weight.view(heads, head_dim, dim),
                self.key.weight.view(heads, head_dim, dim),
            ),
            dim=1,
        ).view(2 * dim, dim)
        bias = torch.stack(
            (self.query.bias.view(heads, head_dim), self.key.bias.view(heads, head_dim)), dim=1
        ).view(2 * dim)
        # P1: q_bar and k_bar of every head from one product, laid out per head as (q_h, k_h).
        qk_mean = F.linear(mean, weight, bias).view(batch * length, 2 * heads, head_dim)
        unit = unit_normalize(qk_mean)  # P3: phi
        # P4: e = phi(q_bar) We[h] and r = phi(k_bar) Wr[h], all heads in one batched product.
        projections = torch.stack((self.we, self.wr), dim=1).view(2 * heads, head_dim, -1)
        scores = torch.bmm(unit.transpose(0, 1), projections.to(unit.dtype)).transpose(0, 1)
        return scores.reshape(batch, length, heads, 2, -1)

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Primal-Attention over x, and its KSVD loss per sequence.

        J needs e and r at every real token, so with the objective they are computed everywhere
        and only P5 (concat, output projection) is cut to the rows; without it, at the rows alone.

        The arguments (x, mask, rows, objective) as AttentionLayer.forward; with objective, the
        KSVD loss is computed.

        Returns:
            tuple[Tensor, Tensor | None]: The output y (B, L, D), or (B, R, D) at rows, and the
            KSVD loss per sequence J^2 (B,) (ksvd_loss), or None with objective=False.

        Raises:
            ValueError: x is not (B, L, D) or mask not (B, L).
        """
        batch, _, dim = x.shape
        scores = self.scores(x, mask, None if objective else rows)
        wanted = scores[:, rows] if objective and rows is not None else scores
        length, heads, _, rank = wanted.shape[1:]
        # P5: [e; r] per head, one Linear(2s -> d) shared across heads, heads merged, projection.
        y = self.concat(wanted.reshape(batch, length, heads, 2 * rank)).reshape(batch, length, dim)
        y = self.resid_dropout(self.proj(y))
        if not objective:
            return y, None
        return y, ksvd_loss(scores, self.lam, self.we, self.wr, mask)


def ksvd_objective(scores: Tensor, lam: Tensor, we: Tensor, wr: Tensor, mask: Tensor) -> Tensor:
    """The KSVD objective J of each sequence over its real tokens, step K1 of the module docstring.

    J = (E_e + E_r) / 2 - mean_h Tr(We[h]^T Wr[h]), where E_e is the mean over heads h and real
    tokens i of sum_k (lam[h, k] e[i, h, k])^2, and E_r the same of r: the objective of the primal
    KSVD problem (the paper's Eq. 6). The two means share their count, so they are one weighted
    sum of squares. The paper shows J = 0 at the KSVD stationary point (ksvd_loss drives J^2 to
    zero).

    Args:
        scores: e and r stacked, (B, L, H, 2, s), as PrimalAttention.scores returns them:
            e at [..., 0, :], r at [..., 1, :].
        lam: Lambda (H, s).
        we: We (H, d, s).
        wr: Wr (H, d, s).
        mask: Padding mask (B, L), bool or 0/1, true for real tokens; padded tokens count in
            neither mean.

    Returns:
        Tensor: J (B,), in float32, or float64 for float64 scores.
    """
    dtype = torch.promote_types(scores.dtype, torch.float32)  # bf16 scores are summed in float32
    batch, length, heads, _, rank = scores.shape
    valid = mask.to(dtype)
    count = valid.sum(dim=1).clamp(min=1.0) * heads
    lam_squared = lam.to(dtype).square()[:, None, :].expand(heads, 2, rank).reshape(-1)
    flat = scores.to(dtype).reshape(batch, length, -1)
    energy = masked_energy(flat, lam_squared, valid)
    trace = (we.to(dtype) * wr.to(dtype)).sum(dim=(1, 2)).mean()  # Tr(A^T B) = sum(A * B)
    return 0.5 * energy / count - trace


def ksvd_loss(scores: Tensor, lam: Tensor, we: Tensor, wr: Tensor, mask: Tensor) -> Tensor:
    """The KSVD loss of each sequence, J^2 (step K2): PrimalAttention.forward's auxiliary loss.

    Its batch mean is the layer's KSVD loss; training adds train.aux_weight (eta, 0.05 in the
    paper) times the mean of it over the Primal layers to the action loss. By the paper's Lemma
    4.2 the KSVD stationary point has J = 0, so driving J^2 to zero imposes it.

    Args:
        scores: e and r stacked, (B, L, H, 2, s), as PrimalAttention.scores returns them.
        lam: Lambda (H, s).
        we: We (H, d, s).
        wr: Wr (H, d, s).
        mask: Padding mask (B, L), bool or 0/1, true for real tokens.

    Returns:
        Tensor: J^2 (B,), in float32, or float64 for float64 scores (ksvd_objective squared).
    """
    return ksvd_objective(scores, lam, we, wr, mask).square()
