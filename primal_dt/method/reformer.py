"""Causal LSH attention, the Reformer of Kitaev et al., "Reformer: The Efficient Transformer"
(ICLR 2020, arXiv 2001.04451), with chunks whose membership depends on earlier tokens alone.

  H1. Shared query-key: q = x Wqk (with bias), keys k_j = q_j / ||q_j||; v = x Wv; H heads of d.
  H2. n_r = hashes (a setting) hash rounds; in round r, h_r(i) = argmax [q_i R_r ; -q_i R_r]
      with R_r (d, b/2) Gaussian per head, b = buckets (a setting); padded tokens get a bucket
      of their own (b), so they never share one with a real token.
  H3. Query i's candidates in round r: the c most recent real tokens j < i with h_r(j) = h_r(i)
      (c = chunk, a setting), and i itself with the score -1e5, so that it counts only where
      there is no other (trax's value).
  H4. Per round, softmax over the candidates of q_i . k_j / sqrt(d) (dropout on the
      probabilities), o_i^r and its log-sum-exp l_i^r; the rounds combine as
      o_i = sum_r o_i^r exp(l_i^r - logsumexp_r l^r), a softmax over the union of the rounds'
      candidates (a pair in several rounds counts in each). Heads merged, output projection,
      residual dropout.
  H5. Cost O(n_r L c): per round, the tokens are sorted by (bucket, position) and cut into chunks
      of c; a chunk's queries score against their own and the previous chunk (the paper's
      look-one-back), which holds every one of the c sorted places before a query. Sorting, the
      chunks and the masks build no L x L tensor.
  H6. The rotations are redrawn at every training step, from the layer's seed and the step (the
      paper's and its public code's choice, a new hash each call); evaluation uses those of the
      checkpoint.

Where it departs from the paper and its public code (google/trax LSHSelfAttention,
lucidrains/reformer-pytorch), and why: there a query sees its whole chunk and the previous one,
cut at fixed places of the sorted order; a later token hashed into a lower bucket moves those cuts,
so a later token changes which earlier keys an earlier query sees, and the layer is not causal.
Here a query's window is the c sorted places before it, which, tokens being sorted by position
inside a bucket, are its bucket's c most recent earlier tokens whatever comes later (H3). The
count of buckets is fixed by the config (not by L as there), the first chunk does not wrap around
to the last, and padding takes its own bucket (trax's choice; reformer-pytorch hashes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_dt.common.config import ModelConfig
from primal_dt.method.dropout import Dropout, dropout
from primal_dt.method.layer import (
    Redrawn,
    at_rows,
    check_arguments,
    merge_heads,
    register,
    split_heads,
    step_generator,
)

SELF_PENALTY = 1e5


def hash_buckets(q: Tensor, rotations: Tensor, mask: Tensor) -> Tensor:
    """h_r of step H2 for q (B, H, L, d), rotations (n_r, H, d, b/2): (B, H, n_r, L)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        rotated = torch.einsum("bhld,rhdn->bhrln", q.to(dtype), rotations.to(dtype))
    buckets = torch.cat((rotated, -rotated), dim=-1).argmax(dim=-1)
    return buckets.masked_fill(~mask[:, None, None, :].bool(), 2 * rotations.shape[-1])


def look_one_back(t: Tensor, fill: float | int) -> Tensor:
    """(..., N, c, X) -> (..., N, 2c, X): each chunk after its previous one (the first after
    `fill`)."""
    previous = F.pad(t[..., :-1, :, :], (0, 0, 0, 0, 1, 0), value=fill)
    return torch.cat((previous, t), dim=-2)


@dataclass(frozen=True)
class ReformerSettings:
    """Reformer's own settings, [model.attention_settings.reformer]."""

    buckets: int = 8  #: b, hash buckets per round (even: a hash is an argmax over [xR; -xR])
    chunk: int = 16  #: c, the earlier same-bucket tokens a query may see per round
    hashes: int = 4  #: n_r, hash rounds

    def check(self) -> None:
        if self.buckets < 2 or self.buckets % 2:
            raise ValueError(
                f"buckets must be even and at least 2 (a hash is an argmax over [xR; -xR]), "
                f"got {self.buckets}"
            )
        for name in ("chunk", "hashes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@register("reformer")
class ReformerAttention(Redrawn):
    """Causal LSH attention, steps H1-H6 of the module docstring."""

    label = "Reformer"
    settings_class = ReformerSettings
    rotations: Tensor  # (n_r, H, d, b/2), a buffer

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        dropout: float = 0.0,
        buckets: int = ReformerSettings.buckets,
        chunk: int = ReformerSettings.chunk,
        hashes: int = ReformerSettings.hashes,
    ) -> None:
        super().__init__()
        check_arguments(type(self).__name__, embed_dim, n_head, dropout)
        if buckets < 2 or buckets % 2 or chunk <= 0 or hashes <= 0:
            raise ValueError(
                f"{type(self).__name__}: buckets must be even and >= 2, chunk and hashes "
                f"positive, got {buckets}, {chunk} and {hashes}"
            )
        self.n_head = n_head
        self.dropout = dropout
        self.chunk = chunk
        self.shape = (hashes, n_head, embed_dim // n_head, buckets // 2)
        self.qk = nn.Linear(embed_dim, embed_dim)
        self.value = nn.Linear(embed_dim, embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.resid_dropout = Dropout(dropout)
        self.register_buffer("rotations", self._draw(0).to(torch.get_default_device()))

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> ReformerAttention:
        own = settings or ReformerSettings()
        return cls(
            config.embed_dim, config.n_head, config.dropout, own.buckets, own.chunk, own.hashes
        )

    def _draw(self, step: int) -> Tensor:
        return torch.randn(self.shape, generator=step_generator(self.seed, step), device="cpu")

    def redraw(self, step: int) -> bool:
        if step > 0:
            self.rotations.copy_(self._draw(step))
        return step > 0

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, None]:
        batch, length, _ = x.shape
        q, v = split_heads(self.qk(x), self.n_head), split_heads(self.value(x), self.n_head)
        hashes, _, head_dim, _ = self.shape
        buckets = hash_buckets(q, self.rotations, mask)  # (B, H, n_r, L)
        order = (buckets * length + torch.arange(length, device=x.device)).argsort(dim=-1)
        # Every round's tokens in (bucket, position) order, cut into chunks of c at the end.
        chunk = self.chunk
        pad = -length % chunk
        order = F.pad(order, (0, pad), value=0)
        sorted_buckets = buckets.gather(-1, order[..., :length])
        sorted_buckets = F.pad(sorted_buckets, (0, pad), value=-1)  # the tail matches nothing
        index = order[..., None].expand(-1, -1, -1, -1, head_dim)

        def arranged(t: Tensor) -> Tensor:  # (B, H, L, d) -> (B, H, n_r, N, c, d), sorted
            t = t[:, :, None].expand(-1, -1, hashes, -1, -1).gather(3, index)
            return t.unflatten(3, (-1, chunk))

        queries = arranged(q)
        keys = look_one_back(arranged(F.normalize(q, dim=-1)), 0.0)
        values = look_one_back(arranged(v), 0.0)
        scores = torch.matmul(queries, keys.transpose(-2, -1))
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * head_dim**-0.5
        # Which candidates each sorted query has (step H3), by sorted place t and bucket.
        place = torch.arange(length + pad, device=x.device).view(-1, chunk)  # (N, c)
        key_place = look_one_back(place[..., None], -2 * chunk).squeeze(-1)  # (N, 2c)
        distance = place[..., :, None] - key_place[..., None, :]  # (N, c, 2c)
        query_bucket = sorted_buckets.unflatten(-1, (-1, chunk))
        key_bucket = look_one_back(query_bucket[..., None], -1).squeeze(-1)
        same = query_bucket[..., :, None] == key_bucket[..., None, :]
        earlier = same & (distance > 0) & (distance <= chunk)
        scores = scores.masked_fill(~earlier, float("-inf"))
        scores = torch.where(distance == 0, scores.new_tensor(-SELF_PENALTY), scores)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - lse)
        probs = dropout(probs, self.dropout, self.training and self.dropout > 0.0)
        out = torch.matmul(probs.to(values.dtype), values).flatten(3, 4)[..., :length, :]
        lse = lse.flatten(3, 4)[..., :length, 0]
        # Back to positions, and the rounds combined (step H4).
        unsort = order[..., :length].argsort(dim=-1)
        out = out.gather(3, unsort[..., None].expand(-1, -1, -1, -1, head_dim))
        lse = lse.gather(3, unsort)
        weights = torch.softmax(lse, dim=2).to(out.dtype)  # over the rounds
        y = (out * weights[..., None]).sum(dim=2)
        return self.resid_dropout(self.proj(at_rows(merge_heads(y), rows))), None
