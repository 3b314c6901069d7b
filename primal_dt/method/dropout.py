"""Dropout whose mask on a CPU comes from a counter-based hash instead of torch's sequential
Mersenne Twister.

torch's CPU dropout draws one Bernoulli sample at a time from its mt19937 generator, on one core
(MKL's parallel generator serves Intel processors only): about 7 ns an element on this project's
2-core AMD EPYC, 3.5 ms for one of the DT's (64, 59, 128) activations, where multiplying it by a
mask takes 0.05 ms; the ten dropouts of a DT-size training step took about a quarter of it.
Counter-based generators (CUDA's Philox, JAX's Threefry) make each element's random number a
function of its index and a key, so that they are computed in parallel passes over the tensor.
This module does that with torch's vectorised integer operations: forward and backward of that
activation's dropout took 0.8 ms against torch's 2.6 to 2.9 ms, in float32 and in bf16 (these
figures were measured while writing it; scripts/profile_step.py shows the masks' share now):

  D1. Two 32-bit keys are drawn per call from torch's default generator, a odd and b (so
      torch.manual_seed and a checkpoint's RNG state determine them, as they do torch's dropout).
  D2. Element i of the flattened tensor gets u_i = mix(a i + b), unsigned arithmetic modulo 2^32,
      with mix the integer hash "lowbias32" (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
      x *= 0x846ca68b; x ^= x >> 16), a bijection with very low avalanche bias. (Two calls share
      an input, and so an output, only where a i + b = a' j + b': about n^2 / 2^32 elements, 50
      of a 483,328-element tensor.)
  D3. The element is kept where u_i / 2^32 >= p, to 2^-31, and scaled by 1 / (1 - p), as torch's
      dropout scales it.

So each element is dropped with torch's probability, and the random stream is another. On CUDA,
and inside torch.compile (whose generated kernels draw their own random numbers in parallel),
this is torch's dropout. Every operation is element-wise: the result depends on neither the
thread count nor the timing.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=16)
def _indices(numel: int) -> Tensor:
    return torch.arange(numel, dtype=torch.int32)


def random_bits(numel: int) -> Tensor:
    """u_i of D1-D2 for i < numel, as int32 (CPU)."""
    a, b = torch.randint(-(1 << 31), 1 << 31, (2,), dtype=torch.int64).tolist()
    bits = _indices(numel) * as_int32(a | 1)
    return mix32(bits.add_(b))


ONE_BITS = {
    torch.float32: (torch.int32, 0x3F800000),
    torch.bfloat16: (torch.int16, 0x3F80),
    torch.float16: (torch.int16, 0x3C00),
}  # dtype -> (integer of its width, bits of 1.0)


def keep_mask(numel: int, p: float, dtype: torch.dtype) -> Tensor:
    """(numel,) in dtype: 0 where an element is dropped, 1 where it is kept (D3).

    With v = u - 2^31 (signed), kept means v >> 1 >= p 2^31 - 2^30; the sign of the difference,
    smeared over the word by an arithmetic shift, selects the bits of 1.0 or zero. A mask of
    exact zeros and ones in the activation's own dtype keeps the multiplication in that dtype
    (a float32 mask made torch convert every bf16 activation to float32 and back)."""
    bits = random_bits(numel).bitwise_xor_(-(1 << 31)).bitwise_right_shift_(1)
    bits.sub_(round(p * (1 << 31)) - (1 << 30)).bitwise_right_shift_(31).bitwise_not_()
    if dtype not in ONE_BITS:
        return bits.bitwise_and_(1).to(dtype)
    integer, one = ONE_BITS[dtype]
    return bits.to(integer).bitwise_and_(one).view(dtype)


class _Masked(torch.autograd.Function):
    """x times a mask of zeros and ones, times 1 / (1 - p): torch's dropout's arithmetic, x * mask
    exact and the scaling rounded once, in x's dtype."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.mul(x, mask).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return torch.mul(grad, mask).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout's semantics; on a CPU in eager mode, with the mask of D1-D3."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    mask = keep_mask(x.numel(), p, x.dtype).view(x.shape)
    return _Masked.apply(x, mask, 1.0 / (1.0 - p))


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
