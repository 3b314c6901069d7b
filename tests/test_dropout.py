"""The CPU dropout's counter-based mask (primal_dt/method/dropout.py, D1-D3): its hash against a
direct unsigned computation, its drop rate and independence, its determinism, its gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primal_dt.method.dropout import Dropout, dropout, mix32


def lowbias32(values: np.ndarray) -> np.ndarray:
    """The hash of D2 in numpy's unsigned 32-bit arithmetic."""
    x = values.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def test_the_hash_is_lowbias32_in_unsigned_arithmetic() -> None:
    values = np.random.default_rng(0).integers(0, 2**32, 100_000, dtype=np.uint64)
    values[:4] = [0, 1, 2**31, 2**32 - 1]  # the edges of the signed view
    signed = torch.from_numpy(values.astype(np.uint32).view(np.int32).copy())
    assert np.array_equal(mix32(signed).numpy().view(np.uint32), lowbias32(values))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_each_element_is_dropped_with_probability_p_and_the_rest_scaled(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_000
    out = dropout(torch.ones(n), p, training=True)
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5
    assert torch.equal(out[out != 0], torch.full_like(out[out != 0], 1 / (1 - p)))


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return ((a * b).mean() / (a.std() * b.std())).item()


def test_masks_are_uncorrelated_within_and_between_calls() -> None:
    """Neighbours, rows of a (B, L, D) activation, and two calls in a row (the next layer's
    mask) are as independent as |correlation| < 5 / sqrt(n) can tell."""
    torch.manual_seed(1)
    shape = (64, 59, 128)
    first = dropout(torch.ones(shape), 0.1, True) != 0
    second = dropout(torch.ones(shape), 0.1, True) != 0
    flat = first.flatten()
    bound = 5 / flat.numel() ** 0.5
    assert abs(correlation(flat[:-1], flat[1:])) < 5 / (flat.numel() - 1) ** 0.5
    assert abs(correlation(first[:, :-1], first[:, 1:])) < 2 * bound
    assert abs(correlation(first[:-1], first[1:])) < 2 * bound
    assert abs(correlation(first, second)) < bound
    assert not torch.equal(first, second)


def test_the_mask_follows_the_seed_and_not_the_thread_count() -> None:
    x = torch.randn(8, 59, 32)
    threads = torch.get_num_threads()
    masks = []
    try:
        for count in (1, 2, 1):
            torch.set_num_threads(count)
            torch.manual_seed(5)
            masks.append(dropout(x, 0.1, True))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[1], masks[2])
    torch.manual_seed(6)
    assert not torch.equal(masks[0], dropout(x, 0.1, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gradient_is_the_same_mask_and_the_dtype_is_kept(dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 9, 16).to(dtype).requires_grad_()
    out = dropout(x, 0.2, True)
    assert out.dtype == dtype
    kept = out != 0
    expected = torch.where(kept, x.detach().float() * (1 / 0.8), 0).to(dtype)  # in float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(kept, grad.float() * (1 / 0.8), 0).to(dtype))


def test_evaluation_mode_and_zero_probability_are_the_identity() -> None:
    layer = Dropout(0.1).eval()
    x = torch.randn(3, 5)
    assert layer(x) is x and dropout(x, 0.0, True) is x
    assert list(layer.state_dict()) == []  # checkpoints hold what nn.Dropout left them
