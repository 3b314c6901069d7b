"""Dropout whose mask on a CPU comes from a counter-based hash instead of torch's sequential
Mersenne Twister.

torch's CPU dropout draws one Bernoulli sample at a time from its mt19937 generator, on one core
(MKL's parallel generator serves Intel processors only), so that drawing a mask costs many times
more than applying it. Counter-based generators (CUDA's Philox, JAX's Threefry) make each
element's random number a function of its index and a key, so that they are computed in parallel
passes over the tensor. This module does that with torch's vectorised integer operations
(scripts/profile_step.py measures the masks' share of a training step; docs/benchmarks.md):

  D1. Two 32-bit keys are drawn per call from torch's default generator, a odd and b (so
      torch.manual_seed and a checkpoint's RNG state determine them, as they do torch's dropout).
  D2. Element i of the flattened tensor gets u_i = mix(a i + b), unsigned arithmetic modulo 2^32,
      with mix the integer hash "lowbias32" (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
      x *= 0x846ca68b; x ^= x >> 16), a bijection with very low avalanche bias. (Two calls share
      an input, and so an output, only where a i + b = a' j + b': about n^2 / 2^32 elements, 50
      of a 483,328-element tensor.)
  D3. The element is kept where u_i / 2^32 >= p, to 2^-31, and scaled by 1 / (1 - p), as torch's
      dropout scales it.

So each element is dropped with torch's probability, and the random stream is another. On CUDA
this is torch's dropout. Inside torch.compile on a CPU it is the same hash, which inductor fuses
into one pass (its own random numbers ran at half the speed of the whole step; compiling.py has
the keys of D1 drawn by torch's generator there too, so compiled and eager runs drop the same
elements). Every operation is element-wise: the result depends on neither the thread count nor
the timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LOWBIAS32 = ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None))  # (shift, multiplier) rounds


def as_int32(value: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def mix32(x: Tensor) -> Tensor:
    """lowbias32 of int32 x read as unsigned (D2), in place; returns x."""
    shifted = torch.empty_like(x)
    for shift, multiplier in LOWBIAS32:
        torch.bitwise_right_shift(x, shift, out=shifted)
        shifted.bitwise_and_((1 << (32 - shift)) - 1)  # a logical shift: int32's is arithmetic
        x.bitwise_xor_(shifted)
        if multiplier is not None:
            x.mul_(as_int32(multiplier))  # wraps modulo 2^32
    return x


def draw_keys() -> tuple[int, int] | tuple[Tensor, Tensor]:
    """a (odd) and b of D1, as int32 values: Python ints, or 0-dim tensors while torch.compile
    traces (reading them would break its graph)."""
    keys = torch.randint(-(1 << 31), 1 << 31, (2,), dtype=torch.int64)
    if torch.compiler.is_compiling():
        a, b = keys.to(torch.int32).unbind()
        return a | 1, b
    a_int, b_int = keys.tolist()  # an integer tensor times a Python int is several times faster
    return as_int32(a_int | 1), b_int


def random_bits(a: int | Tensor, b: int | Tensor, start: int, stop: int) -> Tensor:
    """u_i of D2 for start <= i < stop, as int32 (CPU), from the keys of draw_keys."""
    indices = torch.arange(start, stop, dtype=torch.int32)
    return mix32(indices.mul_(a).add_(b))


CHUNK = 1 << 18  # elements hashed at a time: their int32 words (1 MiB) stay in a core's cache


def keep_mask(numel: int, p: float, dtype: torch.dtype) -> Tensor:
    """(numel,) in dtype: 0 where an element is dropped, 1 where it is kept (D3).

    Kept means floor(u / 2) >= round(p 2^31), that is u >= 2 round(p 2^31), compared as signed
    integers after u - 2^31 (flipping the top bit). The hash's dozen integer passes run over
    CHUNK elements at a time, so that they read and write a core's cache rather than memory
    (about twice as fast over a (64, 4, 59, 59) activation). The mask of exact zeros and ones in
    the activation's own dtype keeps the multiplication in that dtype (a float32 mask made torch
    convert every bf16 activation to float32 and back)."""
    threshold = 2 * round(p * (1 << 31)) - (1 << 31)
    mask = torch.zeros(numel, dtype=dtype)
    if threshold >= 1 << 31:  # p within 2^-32 of 1: nothing is kept
        return mask
    a, b = draw_keys()
    chunk = numel if torch.compiler.is_compiling() else CHUNK  # compiled: one fused pass
    for start in range(0, numel, chunk):
        bits = random_bits(a, b, start, min(numel, start + chunk))
        mask[start : start + chunk] = bits.bitwise_xor_(-(1 << 31)).ge_(threshold)
    return mask


class _Masked(torch.autograd.Function):
    """x times a mask of zeros and ones, times 1 / (1 - p): torch's dropout's arithmetic, x * mask
    exact and the scaling rounded once, in x's dtype. Written for torch.func's transforms too
    (setup_context, generate_vmap_rule: a pack of runs is vmapped, training/pack.py)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, mask: Tensor, scale: float) -> Tensor:
        return torch.mul(x, mask).mul_(scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, float], output: Tensor) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.scale = inputs[2]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return torch.mul(grad, mask) * ctx.scale, None, None


class KeySupply:
    """The keys (a, b) of D1 handed to each dropout call in turn, instead of drawn where it is
    called: a pack of runs trained as one vmapped model (training/pack.py) draws each run's keys
    from that run's own generator state, in the order its lone run would draw them, and every
    dropout call then takes the next pair. Keys None only counts the calls (and drops nothing),
    which is how a pack finds out how many pairs a step needs."""

    def __init__(self, keys: Tensor | None) -> None:
        self.keys = keys  # (calls, 2) int32: (a, b) per call
        self.used = 0

    def next(self) -> tuple[Tensor, Tensor] | None:
        self.used += 1
        if self.keys is None:
            return None
        if self.used > self.keys.shape[0]:
            raise RuntimeError(
                f"dropout was called more often ({self.used}) than keys were supplied "
                f"({self.keys.shape[0]})"
            )
        a, b = self.keys[self.used - 1].unbind()
        return a, b


_supplies: list[KeySupply] = []


@contextmanager
def supplied_keys(keys: Tensor | None) -> Iterator[KeySupply]:
    """Inside, dropout (on any device) takes its keys from `keys` ((calls, 2) int32, see
    KeySupply), or only counts its calls where keys is None."""
    supply = KeySupply(keys)
    _supplies.append(supply)
    try:
        yield supply
    finally:
        _supplies.pop()


def draw_key_pairs(calls: int) -> Tensor:
    """(calls, 2) int32: the (a, b) that `calls` dropout calls draw (draw_keys) in eager mode on
    a CPU, from torch's default generator, in the same order."""
    pairs = [torch.randint(-(1 << 31), 1 << 31, (2,), dtype=torch.int64) for _ in range(calls)]
    keys = torch.stack(pairs) if pairs else torch.zeros(0, 2, dtype=torch.int64)
    keys[:, 0] |= 1
    return keys.to(torch.int32)  # the same bits, as as_int32 does


def mix32_pure(x: Tensor) -> Tensor:
    """mix32 without writing into x (for vmap): the same bits."""
    for shift, multiplier in LOWBIAS32:
        x = x ^ ((x >> shift) & ((1 << (32 - shift)) - 1))
        if multiplier is not None:
            x = x * as_int32(multiplier)
    return x


def keyed_mask(numel: int, p: float, dtype: torch.dtype, a: Tensor, b: Tensor) -> Tensor:
    """keep_mask's mask for the keys a, b (0-dim int32 tensors, on the activation's device) in one
    pass: the same elements dropped as keep_mask drops for those keys."""
    threshold = 2 * round(p * (1 << 31)) - (1 << 31)
    if threshold >= 1 << 31:
        return torch.zeros(numel, dtype=dtype, device=a.device)
    indices = torch.arange(numel, dtype=torch.int32, device=a.device)
    bits = mix32_pure(indices * a + b)
    return (bits ^ -(1 << 31)).ge(threshold).to(dtype)


def keys_supplied() -> bool:
    """Whether dropout takes supplied keys here (inside supplied_keys)."""
    return bool(_supplies)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout's semantics; on a CPU in eager mode, or with supplied keys on any device, with
    the mask of D1-D3."""
    if not training or p == 0.0:
        return x
    if _supplies:
        pair = _supplies[-1].next()
        if pair is None:  # counting
            return x
        mask = keyed_mask(x.numel(), p, x.dtype, *pair).view(x.shape)
        return masked(x, mask, 1.0 / (1.0 - p))
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    mask = keep_mask(x.numel(), p, x.dtype).view(x.shape)
    return masked(x, mask, 1.0 / (1.0 - p))


def masked(x: Tensor, mask: Tensor, scale: float) -> Tensor:
    """_Masked in eager mode; inside torch.compile its composition, which torch.compile can vmap
    over a pack's runs (it cannot vmap a custom Function) and fuses as well."""
    if torch.compiler.is_compiling():
        return torch.mul(x, mask) * scale
    return _Masked.apply(x, mask, scale)


class Dropout(nn.Module):
    """nn.Dropout through dropout() above; no parameters or buffers, so checkpoints are as they
    were with nn.Dropout."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
