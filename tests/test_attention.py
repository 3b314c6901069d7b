"""The attention layers against slow references written straight from the specification in
primal_dt/method/attention.py's docstring (steps P1-P6 and K1-K2, also in the README's method section).

Each reference is a plain per-batch, per-head, per-position Python loop over the formulas, so the
vectorised layers (cumulative sums, batched products, hand-written backward passes, SDPA) are
checked against an independent computation, gradients included. Also checked: causality,
independence from padded tokens, no NaN with left padding, and that a Primal block never
materialises an L x L tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from primal_dt.common.config import ModelConfig
from primal_dt.method.attention import (
    MaskedEnergy,
    PrimalAttention,
    SoftmaxAttention,
    UnitNormalize,
    causal_padding_mask,
    explicit_attention,
    ksvd_objective,
)
from primal_dt.method.layer import AttentionLayer
from primal_dt.method.model import Block, DecisionTransformer
from primal_dt.method.registry import ATTENTIONS, build_attention

EMBED, HEADS, RANK, LENGTH = 16, 2, 4, 9

# Float32 runs must agree with a float64 reference to float32 precision; float64 runs to 1e-10.
DTYPES = [
    pytest.param(torch.float32, 1e-5, id="float32"),
    pytest.param(torch.float64, 1e-10, id="float64"),
]


def padding_masks(length: int = LENGTH) -> Tensor:
    """(4, L) masks: none, left padding, padding in the middle, padding at start, middle and end."""
    mask = torch.ones(4, length, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    mask[2, 3:5] = False  # a gap in the middle
    mask[3, :2] = False  # everything at once
    mask[3, 4] = False
    mask[3, -1] = False
    return mask


def phi(v: Tensor) -> Tensor:
    """phi(v) = v / ||v||; the 1e-12 floor only matters for the zero mean of an all-padded prefix."""
    return v / v.norm().clamp_min(1e-12)


def reference_primal(
    layer: PrimalAttention, x: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Steps P1-P6 with explicit loops, in float64. Returns output (B, L, D), e, r."""
    layer = layer.double()
    x = x.double()
    batch, length, dim = x.shape
    heads = layer.n_head
    d = dim // heads
    rank = layer.we.shape[-1]
    wq, bq = layer.query.weight, layer.query.bias
    wk, bk = layer.key.weight, layer.key.bias
    e = torch.zeros(batch, heads, length, rank, dtype=torch.float64)
    r = torch.zeros_like(e)
    merged = torch.zeros(batch, length, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            for i in range(length):
                q_sum = torch.zeros(d, dtype=torch.float64)
                k_sum = torch.zeros(d, dtype=torch.float64)
                count = 0.0
                for j in range(i + 1):
                    m_j = float(mask[b, j])
                    q_j = wq[cols] @ x[b, j] + bq[cols]
                    k_j = wk[cols] @ x[b, j] + bk[cols]
                    q_sum = q_sum + m_j * q_j
                    k_sum = k_sum + m_j * k_j
                    count += m_j
                q_bar = q_sum / max(1.0, count)
                k_bar = k_sum / max(1.0, count)
                e[b, h, i] = phi(q_bar) @ layer.we[h]
                r[b, h, i] = phi(k_bar) @ layer.wr[h]
                merged[b, i, cols] = layer.concat(torch.cat([e[b, h, i], r[b, h, i]]))
    return layer.proj(merged), e, r


def reference_ksvd(
    e: Tensor, r: Tensor, lam: Tensor, we: Tensor, wr: Tensor, mask: Tensor
) -> Tensor:
    """Step K1 per sequence with explicit loops, in float64."""
    e, r, lam, we, wr = (t.double() for t in (e, r, lam, we, wr))
    batch, heads, length, _ = e.shape
    trace = sum(torch.trace(we[h].T @ wr[h]) for h in range(heads)) / heads
    out = torch.zeros(batch, dtype=torch.float64)
    for b in range(batch):
        energy_e = energy_r = 0.0
        n_valid = 0
        for i in range(length):
            if not mask[b, i]:
                continue
            n_valid += 1
            for h in range(heads):
                energy_e += ((lam[h] * e[b, h, i]) ** 2).sum()
                energy_r += ((lam[h] * r[b, h, i]) ** 2).sum()
        n = heads * n_valid
        out[b] = 0.5 * energy_e / n + 0.5 * energy_r / n - trace
    return out


def reference_softmax(layer: SoftmaxAttention, x: Tensor, mask: Tensor) -> Tensor:
    """Per head softmax(q k^T / sqrt(d)) v; j > i and padded keys j != i get -inf; float64."""
    layer = layer.double()
    x = x.double()
    batch, length, dim = x.shape
    heads = layer.n_head
    d = dim // heads
    q, k, v = layer.qkv(x).split(dim, dim=2)
    merged = torch.zeros(batch, length, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            qh, kh, vh = q[b, :, cols], k[b, :, cols], v[b, :, cols]
            scores = qh @ kh.T / math.sqrt(d)
            for i in range(length):
                for j in range(length):
                    if j > i or (not mask[b, j] and j != i):
                        scores[i, j] = -math.inf
            merged[b, :, cols] = torch.softmax(scores, dim=-1) @ vh
    return layer.proj(merged)


def make_primal(dtype: torch.dtype = torch.float32, seed: int = 0) -> PrimalAttention:
    torch.manual_seed(seed)
    layer = PrimalAttention(EMBED, HEADS, RANK, dropout=0.1).eval()
    with torch.no_grad():  # non-zero biases so that they are exercised too
        for linear in (layer.query, layer.key, layer.concat, layer.proj):
            linear.bias.normal_()
    return layer.to(dtype)


def make_softmax(dtype: torch.dtype = torch.float32, seed: int = 0) -> SoftmaxAttention:
    torch.manual_seed(seed)
    layer = SoftmaxAttention(EMBED, HEADS, dropout=0.1).eval()
    with torch.no_grad():
        layer.qkv.bias.normal_()
        layer.proj.bias.normal_()
    return layer.to(dtype)


def run(layer: torch.nn.Module, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None]:
    with torch.no_grad():
        return layer(x, mask)


# --------------------------------------------------------------------- equality with references


@pytest.mark.parametrize(("dtype", "atol"), DTYPES)
def test_primal_attention_matches_per_position_loop(dtype: torch.dtype, atol: float) -> None:
    layer = make_primal(dtype)
    mask = padding_masks()
    torch.manual_seed(1)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)
    y, j_squared = run(layer, x.to(dtype), mask)
    with torch.no_grad():
        y_ref, e_ref, r_ref = reference_primal(make_primal(dtype), x, mask)
        j_ref = reference_ksvd(e_ref, r_ref, layer.lam, layer.we, layer.wr, mask)
    assert y.shape == (mask.shape[0], LENGTH, EMBED)
    assert j_squared.shape == (mask.shape[0],)
    # Outputs at padded positions are never read by a real token; compare the real ones.
    torch.testing.assert_close(y[mask], y_ref[mask].to(dtype), atol=atol, rtol=0)
    # The layer's auxiliary loss per sequence is J^2 (K2); J itself is checked below.
    torch.testing.assert_close(j_squared, j_ref.square().to(dtype), atol=4 * atol, rtol=0)
    with torch.no_grad():
        scores = layer.scores(x.to(dtype), mask)  # (B, L, H, 2, s)
    # e_ref, r_ref: (B, H, L, s) -> (B, L, H, s), indexed by the mask as y is.
    for got, want in ((scores[..., 0, :], e_ref), (scores[..., 1, :], r_ref)):
        torch.testing.assert_close(
            got[mask], want.transpose(1, 2)[mask].to(dtype), atol=atol, rtol=0
        )


def test_primal_gradients_match_autograd_through_the_reference() -> None:
    """The hand-written backward passes (UnitNormalize, MaskedEnergy) give the gradients that
    autograd finds through the per-position loop, for the input and every parameter."""
    mask = padding_masks()
    torch.manual_seed(1)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)
    weights = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)

    def gradients(forward: Callable[[PrimalAttention, Tensor], tuple[Tensor, Tensor]]) -> tuple:
        layer = make_primal(torch.float64)
        x_grad = x.clone().requires_grad_()
        y, j = forward(layer, x_grad)
        loss = (y * weights)[mask].sum() + j.square().sum()
        return torch.autograd.grad(loss, [x_grad, *layer.parameters()])

    def reference(layer: PrimalAttention, x_grad: Tensor) -> tuple[Tensor, Tensor]:
        y, e, r = reference_primal(layer, x_grad, mask)
        return y, reference_ksvd(e, r, layer.lam, layer.we, layer.wr, mask).square()

    got = gradients(lambda layer, x_grad: layer(x_grad, mask))
    want = gradients(reference)
    assert len(got) == len(want) == 1 + len(list(make_primal().parameters()))
    for got_grad, want_grad in zip(got, want, strict=True):
        torch.testing.assert_close(got_grad, want_grad, atol=1e-10, rtol=0)


def test_hand_written_backward_passes_pass_gradcheck() -> None:
    gen = torch.Generator(torch.get_default_device()).manual_seed(5)
    v = torch.randn(6, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(UnitNormalize.apply, (v,))
    weights = torch.rand(5, generator=gen, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    x = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: MaskedEnergy.apply(a, w, valid), (x, weights))


def test_reference_primal_detects_an_unmasked_mean() -> None:
    """The reference is sensitive to the mask: the public code's mean (ignoring m) differs."""
    mask = padding_masks()
    torch.manual_seed(1)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)
    with torch.no_grad():
        y_masked, _, _ = reference_primal(make_primal(), x, mask)
        y_unmasked, _, _ = reference_primal(make_primal(), x, torch.ones_like(mask))
    assert (y_masked[1:][mask[1:]] - y_unmasked[1:][mask[1:]]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("dtype", "atol"),
    DTYPES,
)
def test_ksvd_objective_matches_direct_loop(dtype: torch.dtype, atol: float) -> None:
    gen = torch.Generator(torch.get_default_device()).manual_seed(3)
    batch, heads, length, d, rank = 4, 3, 7, 5, 4
    e = torch.randn(batch, heads, length, rank, generator=gen, dtype=torch.float64)
    r = torch.randn(batch, heads, length, rank, generator=gen, dtype=torch.float64)
    lam = torch.randn(heads, rank, generator=gen, dtype=torch.float64)
    we = torch.randn(heads, d, rank, generator=gen, dtype=torch.float64)
    wr = torch.randn(heads, d, rank, generator=gen, dtype=torch.float64)
    mask = padding_masks(length)

    def objective(e: Tensor, r: Tensor) -> Tensor:
        scores = torch.stack((e, r), dim=3).transpose(1, 2)  # (B, H, L, s) x 2 -> (B, L, H, 2, s)
        return ksvd_objective(*(t.to(dtype) for t in (scores, lam, we, wr)), mask)

    j = objective(e, r)
    j_ref = reference_ksvd(e, r, lam, we, wr, mask)
    assert j.shape == (batch,)
    torch.testing.assert_close(j, j_ref.to(dtype), atol=atol, rtol=0)
    # Padded tokens carry no weight: huge scores there change nothing.
    e_pad = e.masked_fill(~mask[:, None, :, None], 1e3)
    r_pad = r.masked_fill(~mask[:, None, :, None], -1e3)
    j_pad = objective(e_pad, r_pad)
    torch.testing.assert_close(j_pad, j, atol=atol, rtol=0)


@pytest.mark.parametrize(("dtype", "atol"), DTYPES)
def test_causal_softmax_matches_direct_softmax(dtype: torch.dtype, atol: float) -> None:
    layer = make_softmax(dtype)
    mask = padding_masks()
    torch.manual_seed(2)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, dtype=torch.float64)
    y, none = run(layer, x.to(dtype), mask)
    assert none is None
    with torch.no_grad():
        y_ref = reference_softmax(make_softmax(dtype), x, mask)
    assert torch.isfinite(y).all()
    # The real outputs follow the formula; padded ones are zeros (layer.py).
    torch.testing.assert_close(y[mask], y_ref[mask].to(dtype), atol=atol, rtol=0)
    assert (y[~mask] == 0).all()


def test_the_cpu_attention_computes_what_sdpa_computes() -> None:
    """explicit_attention, a CPU's softmax path, against scaled_dot_product_attention, CUDA's, on
    the same queries, keys, values and padding masks, at every row and at some (float64)."""
    torch.manual_seed(3)
    with torch.device("cpu"):
        q, k, v = (torch.randn(4, HEADS, LENGTH, 8, dtype=torch.float64) for _ in range(3))
        mask = causal_padding_mask(padding_masks())
    rows = slice(1, None, 3)
    for queries, allowed in ((q, mask), (q[:, :, rows], mask[:, :, rows])):
        expected = F.scaled_dot_product_attention(queries, k, v, attn_mask=allowed)
        torch.testing.assert_close(
            explicit_attention(queries, k, v, allowed, 0.0), expected, rtol=1e-12, atol=1e-12
        )


# ----------------------------------------------------------------- causality and padding


# Settings small enough for LENGTH tokens to cross chunks, buckets and hash rounds.
SMALL = ModelConfig(
    embed_dim=EMBED,
    n_head=HEADS,
    dropout=0.1,
    context_len=LENGTH,
    attention_settings={
        "primal": {"rank": RANK},
        "performer": {"features": 12},
        "reformer": {"buckets": 4, "chunk": 3, "hashes": 2},
    },
)


def make_layer(kind: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> AttentionLayer:
    """A layer of any kind from SMALL, in eval mode, with non-zero biases."""
    torch.manual_seed(seed)
    layer = build_attention(kind, SMALL).eval()
    with torch.no_grad():
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                module.bias.normal_()
    return layer.to(dtype)


LAYERS: dict[str, Callable[..., AttentionLayer]] = {
    "softmax": make_softmax,
    "primal": make_primal,
    **{kind: partial(make_layer, kind) for kind in ATTENTIONS if kind not in ("softmax", "primal")},
}


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_later_tokens_do_not_change_earlier_outputs(kind: str, padded: bool) -> None:
    layer = LAYERS[kind]()
    mask = padding_masks() if padded else torch.ones(4, LENGTH, dtype=torch.bool)
    gen = torch.Generator(torch.get_default_device()).manual_seed(4)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen)
    y, _ = run(layer, x, mask)
    for i in (0, 2, 5, LENGTH - 2):
        x_new = x.clone()
        x_new[:, i + 1 :] = 10 * torch.randn(x_new[:, i + 1 :].shape, generator=gen)
        y_new, _ = run(layer, x_new, mask)
        torch.testing.assert_close(y_new[:, : i + 1], y[:, : i + 1], atol=1e-6, rtol=0)
        # ... while the changed positions do change (the check can fail).
        changed = mask[:, i + 1]
        assert (y_new[changed, i + 1] - y[changed, i + 1]).abs().max() > 1e-3


@pytest.mark.parametrize("kind", LAYERS)
def test_padded_tokens_do_not_change_real_outputs(kind: str) -> None:
    layer = LAYERS[kind]()
    mask = padding_masks()
    gen = torch.Generator(torch.get_default_device()).manual_seed(5)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen)
    y, j = run(layer, x, mask)
    for scale in (0.0, 1.0, 100.0):
        x_new = x.clone()
        x_new[~mask] = scale * torch.randn(x_new[~mask].shape, generator=gen)
        y_new, j_new = run(layer, x_new, mask)
        torch.testing.assert_close(y_new[mask], y[mask], atol=1e-6, rtol=0)
        if j is not None:
            torch.testing.assert_close(j_new, j, atol=1e-6, rtol=0)
    # Control: changing one real token does change the real outputs after it (and J).
    x_new = x.clone()
    x_new[1, 5] += 3.0
    y_new, j_new = run(layer, x_new, mask)
    assert (y_new[1, 5:] - y[1, 5:]).abs().max() > 1e-3
    assert (j is None) == (kind != "primal")
    if j is not None:
        assert (j_new[1] - j[1]).abs() > 1e-6
        torch.testing.assert_close(j_new[[0, 2, 3]], j[[0, 2, 3]], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", LAYERS)
def test_left_padding_gives_no_nan(kind: str) -> None:
    layer = LAYERS[kind]()  # eval mode; gradients are checked too
    mask = torch.ones(4, LENGTH, dtype=torch.bool)
    mask[1, :1] = False
    mask[2, :4] = False
    mask[3, : LENGTH - 1] = False  # a single real token at the end
    x = torch.randn(mask.shape[0], LENGTH, EMBED, requires_grad=True)
    y, j = layer(x, mask)
    assert torch.isfinite(y).all()
    loss = y[mask].pow(2).sum()
    if j is not None:
        assert torch.isfinite(j).all()
        loss = loss + j.pow(2).sum()
    loss.backward()
    assert torch.isfinite(x.grad).all()
    for name, param in layer.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_padded_tokens_holding_nan_or_inf_leave_real_outputs_exact(kind: str, value: float) -> None:
    layer = LAYERS[kind]()
    mask = padding_masks()
    gen = torch.Generator(torch.get_default_device()).manual_seed(6)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen)
    y, j = run(layer, x, mask)
    x_bad = x.clone()
    x_bad[~mask] = value
    y_bad, j_bad = run(layer, x_bad, mask)
    assert torch.equal(y_bad[mask], y[mask])
    assert (y_bad[~mask] == 0).all()  # padded outputs are zeros
    if j is not None:
        assert torch.equal(j_bad, j)


@pytest.mark.parametrize("kind", LAYERS)
def test_a_row_of_padding_alone_gives_zeros_and_no_auxiliary_loss(kind: str) -> None:
    layer = LAYERS[kind]()
    mask = padding_masks()
    mask[2] = False
    x = torch.randn(mask.shape[0], LENGTH, EMBED, requires_grad=True)
    y, j = layer(x, mask)
    assert (y[2] == 0).all() and (y[0] != 0).any()
    loss = y.pow(2).sum()
    if j is not None:
        assert j[2] == 0 and j[0] != 0
        loss = loss + j.sum()
    loss.backward()
    assert x.grad is not None and (x.grad[2] == 0).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kind", LAYERS)
def test_integer_or_empty_input_is_one_clear_error(kind: str) -> None:
    layer = LAYERS[kind]()
    with pytest.raises(ValueError, match="expects floating-point x, got torch.int64"):
        layer(torch.ones(2, LENGTH, EMBED, dtype=torch.int64))
    for shape in [(2, 0, EMBED), (0, LENGTH, EMBED)]:
        with pytest.raises(ValueError, match="at least one sequence of at least one token"):
            layer(torch.ones(shape))


# (kind, objective): only Primal has an objective to skip.
ROW_CASES = [(kind, True) for kind in LAYERS] + [("primal", False)]
ROW_IDS = [*LAYERS, "primal-no-objective"]
COST_CASES = [("softmax", True), ("primal", True), ("primal", False)]
COST_IDS = ["softmax", "primal-objective", "primal-no-objective"]


@pytest.mark.parametrize(("kind", "objective"), ROW_CASES, ids=ROW_IDS)
@pytest.mark.parametrize("rows", [slice(1, None, 3), slice(-1, None)], ids=["states", "last"])
def test_outputs_at_rows_are_the_full_outputs_there(
    kind: str, rows: slice, objective: bool
) -> None:
    """Given rows, a layer computes its outputs there alone: the same values as the full output
    sliced, and (Primal, with the objective) the same J, gradients included."""
    layer = LAYERS[kind](torch.float64)
    mask = padding_masks()
    gen = torch.Generator(torch.get_default_device()).manual_seed(8)
    x = torch.randn(mask.shape[0], LENGTH, EMBED, generator=gen, dtype=torch.float64)
    results = []
    for given in (None, rows):
        x_in = x.clone().requires_grad_()
        layer.zero_grad()
        y, j = layer(x_in, mask, given, objective)
        y = y if given is not None else y[:, rows]
        loss = y.pow(2).sum() + (j.pow(2).sum() if j is not None else 0.0)
        loss.backward()
        grads = [x_in.grad] + [param.grad for param in layer.parameters() if param.grad is not None]
        results.append((y.detach(), j, grads))
    (y_full, j_full, grads_full), (y_cut, j_cut, grads_cut) = results
    assert y_cut.shape == (mask.shape[0], len(range(LENGTH)[rows]), EMBED)
    torch.testing.assert_close(y_cut, y_full, rtol=1e-10, atol=1e-12)
    assert (j_cut is None) == (j_full is None) == (kind != "primal" or not objective)
    if j_cut is not None:
        torch.testing.assert_close(j_cut, j_full, rtol=1e-10, atol=1e-12)
    assert len(grads_cut) == len(grads_full)
    for cut, full in zip(grads_cut, grads_full, strict=True):
        torch.testing.assert_close(cut, full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("kind", "objective"), COST_CASES, ids=COST_IDS)
def test_outputs_at_rows_cost_only_their_rows(kind: str, objective: bool) -> None:
    """Given R of the L rows, a layer does only the rows' own work (its matrix products counted,
    forward): softmax projects queries and its output at the rows, keys and values everywhere;
    Primal cuts P5 to the rows, and without the objective e and r too (each is per position)."""
    batch, rows = 4, slice(1, None, 3)
    wanted = len(range(LENGTH)[rows])
    with torch.device("cpu"):  # the count of this code's work, whatever the test device
        layer = LAYERS[kind](torch.float64)
        mask = padding_masks().cpu()
        x = torch.randn(batch, LENGTH, EMBED, dtype=torch.float64)

    def products(given: slice | None) -> tuple[int, int]:
        """FLOPs of the matrix products: all, and P5's (concat, proj)."""
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            layer(x, mask, given, objective)
        counts = counter.get_flop_counts()
        matrix = {"aten.mm", "aten.addmm", "aten.bmm"}
        total = sum(n for op, n in counts["Global"].items() if str(op) in matrix)
        p5 = sum(
            sum(counts.get(f"{type(layer).__name__}.{name}", {}).values())
            for name in ("concat", "proj")
        )
        return total, p5

    full, p5 = products(None)
    cut, _ = products(rows)
    if kind == "softmax":
        # q, k, v and output projections at every token; on a CPU the attention's own products,
        # q k^T and probabilities times v (explicit_attention), each 2 B L L D.
        assert full == 2 * batch * EMBED * (4 * EMBED * LENGTH + 2 * LENGTH * LENGTH)
        expected = 2 * batch * EMBED * (2 * EMBED * LENGTH + 2 * EMBED * wanted)
        expected += 2 * batch * EMBED * 2 * wanted * LENGTH
    elif objective:  # e and r everywhere (J reads them), P5 at the rows
        expected = full - p5 * (LENGTH - wanted) // LENGTH
    else:
        expected = full * wanted // LENGTH
    assert cut == expected < full


# ----------------------------------------------------------------------- no L x L tensors


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor that goes into or comes out of an aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten((args, kwargs, out))[0]:
            if isinstance(item, Tensor):
                self.shapes.append((str(func), tuple(item.shape)))
        return out


def square_tensors(shapes: list[tuple[str, tuple[int, ...]]], length: int) -> list:
    """The recorded tensors with at least two dimensions of size >= length (an L x L)."""
    return [(op, shape) for op, shape in shapes if sum(size >= length for size in shape) >= 2]


def record_block(kind: str, length: int) -> list[tuple[str, tuple[int, ...]]]:
    torch.manual_seed(6)
    config = ModelConfig(
        embed_dim=32,
        n_layer=1,
        n_head=2,
        dropout=0.1,
        context_len=length,
        attention_settings={"primal": {"rank": 8}, "performer": {"features": 16}},
    )
    block = Block(config, kind).train()
    x = torch.randn(2, length, config.embed_dim, requires_grad=True)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, :100] = False
    with ShapeRecorder() as recorder:
        y, j = block(x, mask)
        loss = y.pow(2).mean() + (j.pow(2).mean() if j is not None else 0.0)
        loss.backward()
    assert recorder.shapes
    return recorder.shapes


LINEAR_COST = [kind for kind in LAYERS if kind != "softmax"]


@pytest.mark.parametrize("kind", LINEAR_COST)
def test_efficient_blocks_have_no_length_squared_tensor(kind: str) -> None:
    """Primal and the linear-cost attentions (Reformer: chunks of c) build no L x L tensor,
    forward or backward."""
    length = 512
    shapes = record_block(kind, length=length)
    # Backward ops were recorded too (the check covers the gradients).
    assert any("backward" in op for op, _ in shapes)
    assert square_tensors(shapes, length) == []


def test_softmax_block_has_length_squared_tensor() -> None:
    """The checker is shown to work: softmax attention builds an L x L mask and scores."""
    length = 512
    assert square_tensors(record_block("softmax", length=length), length)


def test_all_primal_decision_transformer_has_no_length_squared_tensor() -> None:
    torch.manual_seed(7)
    context = 171  # 3 * 171 = 513 tokens
    config = ModelConfig(
        embed_dim=32,
        n_layer=2,
        n_head=2,
        context_len=context,
        attention="primal",
        attention_settings={"primal": {"rank": 8}},
    )
    model = DecisionTransformer(config, state_dim=5, act_dim=3, max_timestep=1000).eval()
    batch = 2
    inputs = (
        torch.randn(batch, context, 5),
        torch.randn(batch, context, 3),
        torch.randn(batch, context),
        torch.arange(context).repeat(batch, 1),
        torch.ones(batch, context, dtype=torch.bool),
    )
    with ShapeRecorder() as recorder, torch.no_grad():
        model(*inputs)
    assert square_tensors(recorder.shapes, 3 * context - 1) == []
    # The same model with softmax attention would be caught (over 3K - 1 tokens: a softmax model
    # drops a_K, which reaches no state token).
    config.attention, config.attention_settings = "softmax", {}
    model = DecisionTransformer(config, state_dim=5, act_dim=3, max_timestep=1000).eval()
    with ShapeRecorder() as recorder, torch.no_grad():
        model(*inputs)
    assert square_tensors(recorder.shapes, 3 * context - 1)


def test_the_public_codes_initialisation_is_an_option() -> None:
    """Default: each head's (d, s) block of We and Wr has orthonormal columns (Frobenius norm
    sqrt(s)). init = "public" (model.attention_settings.primal.init): the public code's
    orthogonal_ on the whole (H, d, s) tensor, whose H flattened blocks are orthonormal rows
    (Frobenius norm 1 each)."""
    heads, head_dim, rank = 4, 16, 8
    per_head = PrimalAttention(heads * head_dim, heads, rank, dropout=0.0)
    public = PrimalAttention(heads * head_dim, heads, rank, dropout=0.0, init="public")
    for weight in (per_head.we, per_head.wr, public.we, public.wr):
        assert weight.shape == (heads, head_dim, rank)
    for weight in (per_head.we, per_head.wr):
        gram = weight.transpose(1, 2) @ weight  # (H, s, s)
        torch.testing.assert_close(
            gram, torch.eye(rank).expand(heads, rank, rank), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(weight.norm(dim=(1, 2)), torch.full((heads,), rank**0.5))
    for weight in (public.we, public.wr):
        flat = weight.reshape(heads, -1)
        torch.testing.assert_close(flat @ flat.T, torch.eye(heads), atol=1e-5, rtol=0)
        torch.testing.assert_close(weight.norm(dim=(1, 2)), torch.ones(heads))


def test_the_unit_map_has_exact_second_derivatives() -> None:
    """UnitNormalize's backward is differentiable: gradgradcheck passes, and in a graph where the
    input has another differentiable path (y = phi(v) + f(v)), a gradient penalty's gradient and
    a Hessian-vector product equal F.normalize's."""
    import torch.nn.functional as F

    from primal_dt.method.attention import UnitNormalize

    gen = torch.Generator().manual_seed(7)
    v = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(UnitNormalize.apply, (v,))
    weights = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)
    direction = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)

    def second_order(normalize: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        y = (normalize(v) * weights).sum() + (v.sin() * normalize(v)).sum()
        (grad,) = torch.autograd.grad(y, v, create_graph=True)
        (penalty,) = torch.autograd.grad(grad.square().sum(), v, retain_graph=True)
        (hvp,) = torch.autograd.grad(grad, v, grad_outputs=direction)
        return penalty, hvp

    got = second_order(UnitNormalize.apply)
    want = second_order(lambda t: F.normalize(t, dim=-1))
    for got_value, want_value in zip(got, want, strict=True):
        torch.testing.assert_close(got_value, want_value, atol=1e-10, rtol=1e-10)
