"""The five attentions of the Primal paper's comparison (Linear, Reformer, Performer, cosFormer,
Flowformer) against references written as the explicit masked L x L computation that each one
factorises or approximates, in float64, forward and gradients; their random state (Performer's
features, Reformer's rotations) as part of the model's state. Causality, padding, rows, no L x L
tensor and no NaN are tests/test_attention.py's, for every kind."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from test_attention import EMBED, HEADS, LAYERS, LENGTH, padding_masks
from torch import Tensor

from primal_dt.method import causal_linear
from primal_dt.method.cosformer import CosformerAttention
from primal_dt.method.flowformer import FlowformerAttention
from primal_dt.method.linear_attention import LinearAttention
from primal_dt.method.performer import PerformerAttention, orthogonal_features
from primal_dt.method.reformer import ReformerAttention
from primal_dt.method.registry import ATTENTIONS

CAUSAL = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()


def projected(linear: torch.nn.Module, x: Tensor, parts: int) -> list[Tensor]:
    """x projected and split into `parts` tensors of heads (B, H, L, d)."""
    return [t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in linear(x).chunk(parts, -1)]


def finish(layer: torch.nn.Module, y: Tensor) -> Tensor:
    """Heads merged and the output projection (eval mode: no dropout)."""
    return layer.proj(y.transpose(1, 2).flatten(2))


def pairs(mask: Tensor) -> Tensor:
    """(B, 1, L, L): key j counts for query i (j <= i, j real)."""
    return (CAUSAL & mask[:, None, :])[:, None]


def reference_linear(layer: LinearAttention, x: Tensor, mask: Tensor) -> Tensor:
    q, k, v = projected(layer.qkv, x, 3)
    a = ((F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)) * pairs(mask)
    return finish(layer, (a @ v) / (a.sum(-1, keepdim=True) + 1e-6))


def reference_cosformer(layer: CosformerAttention, x: Tensor, mask: Tensor) -> Tensor:
    q, k, v = projected(layer.qkv, x, 3)
    i = torch.arange(LENGTH, dtype=x.dtype)
    weight = torch.cos(math.pi / 2 * (i[:, None] - i[None, :]) / layer.max_length)
    a = (F.relu(q) @ F.relu(k).transpose(-2, -1)) * weight * pairs(mask)
    return finish(layer, (a @ v) / a.sum(-1, keepdim=True).clamp_min(1e-6))


def reference_performer(layer: PerformerAttention, x: Tensor, mask: Tensor) -> Tensor:
    q, k, v = projected(layer.qkv, x, 3)
    w = layer.features.to(x.dtype)

    def phi(t: Tensor) -> Tensor:  # unstabilised: float64 holds these exponents
        t = t * t.shape[-1] ** -0.25
        return torch.exp(t @ w.T - 0.5 * t.square().sum(-1, keepdim=True)) / math.sqrt(len(w))

    a = (phi(q) @ phi(k).transpose(-2, -1)) * pairs(mask)
    total = a.sum(-1, keepdim=True)
    return finish(layer, (a @ v) / torch.where(total > 0, total, 1.0))


def reference_flowformer(layer: FlowformerAttention, x: Tensor, mask: Tensor) -> Tensor:
    q, k, v = projected(layer.qkv, x, 3)
    eps, m = 1e-6, mask[:, None, :, None].to(x.dtype)
    prefix = CAUSAL.to(x.dtype)  # sum over j <= i as an L x L product
    sinks, sources = torch.sigmoid(q) * m, torch.sigmoid(k) * m
    n = (prefix @ m).clamp_min(1.0)[..., 0]

    def dot(a: Tensor, b: Tensor) -> Tensor:
        return ((a + eps) * (b + eps)).sum(-1)

    incoming = n / dot(sinks, prefix @ sources)
    outgoing = n / dot(sources, prefix @ sinks)
    incoming_refined = dot(sinks, prefix @ (sources * outgoing[..., None])) / n
    outgoing_refined = (dot(sources, prefix @ (sinks * incoming[..., None])) / n).clamp(-10, 10)
    allocation = torch.sigmoid(incoming_refined)
    weight = torch.exp(outgoing_refined) * m[..., 0]
    competition = n * weight / (weight @ prefix.T).clamp_min(1e-300)  # 0 before a real token
    a = (sinks @ sources.transpose(-2, -1)) * prefix
    y = (a @ (v * competition[..., None])) / dot(sinks, prefix @ sources)[..., None]
    return finish(layer, y * allocation[..., None])


def reference_reformer(layer: ReformerAttention, x: Tensor, mask: Tensor) -> Tensor:
    """Steps H1-H4 as a loop over sequences, heads, rounds and queries: each query's candidates
    are its bucket's c most recent earlier real tokens, found by looking back along positions."""
    q, v = projected(layer.qk, x, 1)[0], projected(layer.value, x, 1)[0]
    keys = q / q.norm(dim=-1, keepdim=True)
    rotations = layer.rotations.to(x.dtype)  # (n_r, H, d, b/2)
    batch, heads, length, d = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            rounds, sums = [], []
            for r in range(rotations.shape[0]):
                rotated = q[b, h] @ rotations[r, h]
                bucket = torch.cat((rotated, -rotated), -1).argmax(-1)
                o = torch.zeros(length, d, dtype=x.dtype)
                lse = torch.zeros(length, dtype=x.dtype)
                for i in range(length):
                    if not mask[b, i]:
                        continue
                    found = [j for j in range(i) if mask[b, j] and bucket[j] == bucket[i]]
                    chosen = found[-layer.chunk :] if found else []
                    scores = [q[b, h, i] @ keys[b, h, j] / math.sqrt(d) for j in chosen]
                    scores = torch.stack([*scores, torch.tensor(-1e5, dtype=x.dtype)])
                    probs = torch.softmax(scores, 0)
                    o[i] = probs @ v[b, h, [*chosen, i]]
                    lse[i] = torch.logsumexp(scores, 0)
                rounds.append(o)
                sums.append(lse)
            weights = torch.softmax(torch.stack(sums), 0)  # over the rounds
            out[b, h] = (torch.stack(rounds) * weights[..., None]).sum(0)
    return finish(layer, out)


REFERENCES: dict[str, Callable[..., Tensor]] = {
    "linear": reference_linear,
    "reformer": reference_reformer,
    "performer": reference_performer,
    "cosformer": reference_cosformer,
    "flowformer": reference_flowformer,
}


def test_every_kind_has_a_float64_reference() -> None:
    """softmax and Primal are checked against theirs in test_attention.py; every other kind of the
    registry needs one here, so that a new kind cannot arrive unchecked."""
    missing = set(ATTENTIONS) - set(REFERENCES) - {"softmax", "primal"}
    assert not missing, f"kinds without a float64 reference in REFERENCES: {sorted(missing)}"


@pytest.mark.parametrize("chunk", [4, causal_linear.CHUNK], ids=["chunks-of-4", "one-chunk"])
@pytest.mark.parametrize("kind", REFERENCES)
def test_attention_matches_its_explicit_reference(kind: str, chunk: int, monkeypatch) -> None:
    """Outputs at real tokens and the gradients of a loss over them (input and every parameter)
    agree with the explicit L x L computation, in float64, with left, middle and end padding;
    the LENGTH tokens in one chunk and across chunks of 4 (causal_linear.py)."""
    monkeypatch.setattr(causal_linear, "CHUNK", chunk)
    layer = LAYERS[kind](torch.float64)
    mask = padding_masks()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen, dtype=torch.float64)
    weights = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen, dtype=torch.float64)
    results = []
    for forward in (lambda t: layer(t, mask)[0], lambda t: REFERENCES[kind](layer, t, mask)):
        x_in = x.clone().requires_grad_()
        y = forward(x_in)
        loss = (y * weights)[mask].sum()
        results.append((y.detach(), torch.autograd.grad(loss, [x_in, *layer.parameters()])))
    (y, grads), (y_ref, grads_ref) = results
    torch.testing.assert_close(y[mask], y_ref[mask], atol=1e-10, rtol=1e-10)
    assert len(grads) == 1 + len(list(layer.parameters()))
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("length", [5, 16, 37])
def test_chunked_prefix_sums_match_the_explicit_sums(length: int, monkeypatch) -> None:
    """causal_linear.py in chunks of 4 against the masked L x L products, with key weights far
    apart (exp(50 x) would overflow without the running maximum) and weights of -inf (padding)."""
    monkeypatch.setattr(causal_linear, "CHUNK", 4)
    gen = torch.Generator().manual_seed(length)
    q, k = (torch.rand(2, 3, length, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, length, 5, generator=gen, dtype=torch.float64)
    products = (q @ k.transpose(-2, -1)).tril()
    torch.testing.assert_close(
        causal_linear.causal_linear_attention(q, k, v), products @ v, atol=1e-12, rtol=0
    )
    weights = 50 * torch.randn(2, 3, length, generator=gen, dtype=torch.float64)
    weights[0, 0, : length // 2] = -math.inf
    weights[1, 1, 1:3] = -math.inf
    out, running = causal_linear.weighted_causal_linear_attention(q, k, v, weights)
    assert torch.equal(running, torch.cummax(weights, dim=2).values)
    relative = (weights[..., None, :] - running[..., :, None]).nan_to_num(nan=-math.inf)
    expected = (products * torch.exp(relative).tril()) @ v
    expected = torch.where(torch.isfinite(running)[..., None], expected, 0.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


def test_the_reformer_reference_sees_hash_buckets() -> None:
    """The check can fail: with the rotations changed, some bucket changes and so do outputs."""
    layer = LAYERS["reformer"](torch.float64)
    mask = padding_masks()
    x = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x, mask)[0]
        layer.redraw(1)
        assert (layer(x, mask)[0] - y)[mask].abs().max() > 1e-3


def test_a_reformer_query_sees_at_most_c_earlier_tokens_of_its_bucket() -> None:
    """One hash round, one bucket (every rotation the same sign): each query's window is its c
    predecessors, so a token more than c places back cannot reach it, and one within c does."""
    torch.manual_seed(0)
    layer = ReformerAttention(EMBED, HEADS, 0.0, buckets=2, chunk=3, hashes=1).double().eval()
    with torch.no_grad():
        layer.rotations.zero_()  # every projection 0: argmax picks bucket 0 for all tokens
    mask = torch.ones(1, LENGTH, dtype=torch.bool)
    x = torch.randn(1, LENGTH, EMBED, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x, mask)[0]
        x_new = x.clone()
        x_new[0, 2] += 5.0
        changed = (layer(x_new, mask)[0] - y).abs().amax(-1)[0]
    assert changed[:2].max() == 0  # before it
    assert changed[2:6].min() > 1e-6  # itself and the 3 after it
    assert changed[6:].max() < 1e-12  # more than c = 3 places later: out of every window


def test_performer_features_are_orthogonal_blocks_with_gaussian_norms() -> None:
    features = orthogonal_features(20, 8, torch.Generator().manual_seed(0)).double()
    norms = features.norm(dim=1)
    for start in range(0, 20, 8):
        block = features[start : start + 8] / norms[start : start + 8, None]
        torch.testing.assert_close(
            block @ block.T, torch.eye(len(block), dtype=torch.float64), atol=1e-6, rtol=0
        )
    assert norms.std() > 0.1  # chi-distributed norms, not all sqrt(d)
    assert 0.5 * math.sqrt(8) < norms.mean() < 1.5 * math.sqrt(8)


def test_performer_approximates_softmax_attention_with_many_features() -> None:
    """FAVOR+ is unbiased for the softmax kernel: with many features its output is close to exact
    causal softmax attention of the same q, k, v (and, as the check, far with few)."""
    errors = {}
    for features in (4, 4096):
        torch.manual_seed(3)
        layer = PerformerAttention(EMBED, HEADS, 0.0, features, 0).double().eval()
        mask = torch.ones(2, LENGTH, dtype=torch.bool)
        x = 0.3 * torch.randn(2, LENGTH, EMBED, dtype=torch.float64)
        with torch.no_grad():
            q, k, v = projected(layer.qkv, x, 3)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            exact = torch.softmax(scores.masked_fill(~CAUSAL, -math.inf), -1) @ v
            errors[features] = (layer(x, mask)[0] - finish(layer, exact)).abs().max().item()
    assert errors[4096] < 0.02 < errors[4]


@pytest.mark.parametrize("kind", ["performer", "reformer"])
def test_random_state_is_in_the_state_dict_and_redrawn_from_the_step(kind: str) -> None:
    """A layer loaded from another's state dict holds the same features or rotations and the same
    seed, so that both redraw the same at the same step; Performer redraws every
    performer_redraw steps (here 1000), Reformer at every step."""
    layer, other = LAYERS[kind](seed=0), LAYERS[kind](seed=1)
    name = "features" if kind == "performer" else "rotations"
    assert not torch.equal(getattr(layer, name), getattr(other, name))
    other.load_state_dict(layer.state_dict())
    assert torch.equal(getattr(layer, name), getattr(other, name))
    before = getattr(layer, name).clone()
    steps = [999, 1000] if kind == "performer" else [1, 2]
    if kind == "performer":
        layer.redraw(steps[0])
        assert torch.equal(getattr(layer, name), before)  # not yet
    for step in steps:
        layer.redraw(step)
        other.redraw(step)
    assert not torch.equal(getattr(layer, name), before)
    assert torch.equal(getattr(layer, name), getattr(other, name))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_huge_later_token_leaves_earlier_chunked_outputs_exactly_as_they_were(dtype) -> None:
    """Causality to the bit across chunks: token 127's key and value set to 1e3 change no
    output before it (a sum of earlier chunks as cumsum - states moved rows 64-126 by 0.045)."""
    from primal_dt.method.causal_linear import causal_linear_attention

    torch.manual_seed(0)
    q, k, v = (torch.rand(2, 2, 128, 8).to(dtype) for _ in range(3))
    before = causal_linear_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 127], v2[:, :, 127] = 1e3, 1e3
    after = causal_linear_attention(q, k2, v2)
    assert torch.equal(after[:, :, :127], before[:, :, :127])
