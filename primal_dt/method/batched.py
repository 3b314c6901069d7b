"""Layers as a pack of runs computes them: inside `packed()` (training/pack.py's step, which
vmaps one run's step over the runs' stacked weights), a layer whose batched form torch.func
computes slowly takes a form it computes well, with the same result to rounding.

One layer does now: LayerNorm. vmap's rule for the backward of a layer norm whose weight is
batched (each run has its own) expands into element-wise passes over the whole activation per
run: at the DT paper's size on a 2-core CPU it took 44% of a pack of 8's step. Normalising
without the weight and applying it after (F.layer_norm without affine, times weight, plus bias)
leaves vmap's fast rule for the normalisation and a product and a sum for the affine part. Outside
a pack, LayerNorm is torch's own kernel, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.nn.functional as F
from torch import Tensor, nn

_depth = 0


@contextmanager
def packed() -> Iterator[None]:
    """Inside, the layers of this module take their pack form."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters, same state dict); in a pack, normalised then scaled."""

    def forward(self, x: Tensor) -> Tensor:
        if not _depth or self.weight is None:
            return super().forward(x)
        normalised = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        return normalised * self.weight + self.bias
