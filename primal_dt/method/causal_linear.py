"""Causal linear attention in chunks: the prefix sums that the linear-cost attentions share.

For features q, k (B, H, L, F) and values v (B, H, L, E) it computes
    out_i = sum_{j <= i} (q_i . k_j) v_j
in O(L (C F + F E)) time and memory, with no L x L tensor: the L tokens are cut into chunks of
C = min(CHUNK, L); inside a chunk the causal products are written out (a C x C matrix, masked to
j <= i), and across chunks a running state S = sum_j k_j v_j^T (F x E) carries the earlier ones.
(The plain form, a cumulative sum over L outer products, keeps L such states: at the DT's sizes
a few hundred MB per layer for its backward.) Masking padded keys is the caller's: a key of
zeros contributes nothing.

With log_weights (B, H, L), key j counts with weight exp(w_j), out_i = sum_{j <= i} exp(w_j)
(q_i . k_j) v_j, computed relative to the running maximum M_i = max_{j <= i} w_j: the result is
exp(-M_i) out_i together with M_i, so that no exponent is positive and nothing overflows, and
M_i depends on tokens at or before i alone (a stabiliser over the whole window would let a later
token's large weight underflow earlier tokens' sums). Performer uses it for its key
stabiliser. Padded keys must have weight -inf there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 64  # tokens per chunk (module docstring); bench_attention measures the layer against L


def _chunked(t: Tensor, chunk: int) -> Tensor:
    """(B, H, L, X) -> (B, H, N, C, X), zero-padded at the end to N * C tokens."""
    pad = -t.shape[2] % chunk
    if pad:
        t = F.pad(t, (0, 0, 0, pad))
    return t.unflatten(2, (-1, chunk))


def _earlier_chunks(states: Tensor) -> Tensor:
    """The sum over the chunks before each chunk (B, H, N, F, E), summed in float32 at least.
    An exclusive sum (the states shifted one chunk on, then summed), never cumsum - states: a
    later chunk's large state would then move earlier outputs by its cancellation error."""
    dtype = torch.promote_types(states.dtype, torch.float32)
    shifted = F.pad(states.to(dtype), (0, 0, 0, 0, 1, 0))[:, :, :-1]
    return shifted.cumsum(dim=2).to(states.dtype)


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """sum_{j <= i} (q_i . k_j) v_j: (B, H, L, E)."""
    length = q.shape[2]
    chunk = min(CHUNK, length)
    qc, kc, vc = (_chunked(t, chunk) for t in (q, k, v))
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = torch.matmul(qc, kc.transpose(-2, -1)).masked_fill(~causal, 0.0)
    earlier = _earlier_chunks(torch.matmul(kc.transpose(-2, -1), vc))  # (B, H, N, F, E)
    out = torch.matmul(scores, vc) + torch.matmul(qc, earlier)
    return out.flatten(2, 3)[:, :, :length]


def _exp_below(a: Tensor, b: Tensor) -> Tensor:
    """exp(a - b) for a <= b, and 0 where b = -inf (then a = -inf too: no weight yet)."""
    finite = torch.isfinite(b)
    return torch.where(finite, torch.exp(a - torch.where(finite, b, 0.0)), 0.0)


def weighted_causal_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, log_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """exp(-M_i) sum_{j <= i} exp(w_j) (q_i . k_j) v_j and M_i = max_{j <= i} w_j (module
    docstring). Positions before the first finite weight give 0 and M = -inf."""
    length = q.shape[2]
    chunk = min(CHUNK, length)
    weights = log_weights.to(torch.promote_types(log_weights.dtype, torch.float32))
    running = torch.cummax(weights, dim=2).values  # M_i
    qc, kc, vc = (_chunked(t, chunk) for t in (q, k, v))
    # The padding at the end of the last chunk: weight -inf and the last maximum, so it adds
    # nothing (its outputs are cut off).
    pad = -length % chunk
    wc = F.pad(weights, (0, pad), value=float("-inf")).unflatten(2, (-1, chunk))
    mc = F.pad(running, (0, pad), mode="replicate").unflatten(2, (-1, chunk))
    # Inside a chunk: exp(w_j - M_i) for j <= i, never above 1.
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    relative = _exp_below(wc[..., None, :], mc[..., :, None]).masked_fill(~causal, 0.0)
    scores = torch.matmul(qc, kc.transpose(-2, -1)) * relative.to(qc.dtype)
    intra = torch.matmul(scores, vc)
    # Across chunks: chunk c's state relative to the maximum at its end, M_end(c); what chunk c
    # receives, relative to M_end(c - 1), is sum_{c' < c} exp(M_end(c') - M_end(c - 1)) state_c',
    # every factor at most 1: one product with an N x N matrix of them.
    end = mc[..., -1]  # (B, H, N)
    local = _exp_below(wc, end[..., None]).to(kc.dtype)
    states = torch.matmul((kc * local[..., None]).transpose(-2, -1), vc)  # (B, H, N, F, E)
    previous_end = F.pad(end[..., :-1], (1, 0), value=float("-inf"))  # M_end(c - 1)
    n = states.shape[2]
    before = torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-1)  # c' < c
    carry = _exp_below(
        end[..., None, :].masked_fill(~before, float("-inf")), previous_end[..., :, None]
    )
    flat = states.flatten(3).to(carry.dtype)
    earlier = torch.matmul(carry, flat).view_as(states).to(qc.dtype)
    to_query = _exp_below(previous_end[..., None], mc).to(qc.dtype)  # exp(M_end(c-1) - M_i)
    out = intra + torch.matmul(qc, earlier) * to_query[..., None]
    return out.flatten(2, 3)[:, :, :length], running


def sums_and_normaliser(
    q: Tensor, k: Tensor, v: Tensor, log_weights: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """sum_{j <= i} (q_i . k_j) v_j and sum_{j <= i} q_i . k_j, (B, H, L, E) and (B, H, L, 1), from
    one pass with the normaliser as a column of ones; with log_weights, the weighted sums of
    weighted_causal_linear_attention (each relative to the same running maximum). Each kind
    divides them as its paper does."""
    values = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)
    if log_weights is None:
        out = causal_linear_attention(q, k, values)
    else:
        out, _ = weighted_causal_linear_attention(q, k, values, log_weights)
    return out[..., :-1], out[..., -1:]
