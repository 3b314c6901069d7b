"""What every attention layer of the registry is: the one interface the transformer block calls.

A layer takes tokens x (B, L, D) and their padding mask m (B, L), 1 for real tokens, and returns
its output and its auxiliary loss. Each layer guarantees, and tests/test_attention.py checks:
- causality: a real token's output depends only on real tokens at or before it;
- padding exactness: no real output changes when a padded token changes;
- rows: given a slice of positions, the outputs there alone (B, R, D), equal to the full output
  sliced (the last block asks for the state tokens in training and for the last token in acting);
- objective=False skips the auxiliary loss, the case in acting.

The auxiliary loss is a per-sequence term (B,) whose batch mean the model averages over the blocks
that have one and adds, weighted by train.ksvd_weight, to the action loss; None for a layer without
one. Primal-Attention's is its KSVD loss J^2 (attention.py); no other attention here has one.

Random state that a layer draws (Performer's random features, Reformer's hash rotations) lives in
buffers, so that checkpoints carry it, and is redrawn only by `redraw(step)`, a function of the
training step: a resumed run and an uninterrupted one draw the same.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from primal_dt.common.config import ModelConfig


class AttentionLayer(nn.Module):
    """The base of every attention kind: subclasses set `label`, implement `from_config` and
    `forward`, and (where they draw random state) `redraw`."""

    label: ClassVar[str] = ""  # how reports, spectra and TensorBoard name the kind
    # Whether the auxiliary loss reads every token: the model then keeps the last action token
    # up to this block (model.py), since its loss counts it.
    reads_every_token: ClassVar[bool] = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> AttentionLayer:
        """The layer of this kind for a block of the model that config describes."""
        raise NotImplementedError

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Output (B, L, D), or (B, R, D) at rows, and the auxiliary loss terms (B,) or None."""
        raise NotImplementedError

    def redraw(self, step: int) -> None:
        """Draw the random state for training step `step` (a no-op without random state)."""


def split_heads(t: Tensor, n_head: int) -> Tensor:
    """(B, L, D) -> (B, H, L, D / H)."""
    return t.unflatten(-1, (n_head, -1)).transpose(1, 2)


def merge_heads(t: Tensor) -> Tensor:
    """(B, H, L, d) -> (B, L, H d)."""
    return t.transpose(1, 2).flatten(2)


def at_rows(t: Tensor, rows: slice | None) -> Tensor:
    """t (B, L, ...) at rows, or whole: the linear-cost layers compute every position (their
    prefix sums need every key anyway) and cut before the output projection."""
    return t if rows is None else t[:, rows]


def new_seed() -> int:
    """A layer's own seed, drawn from torch's generator when it is built (so from train.seed)."""
    return int(torch.randint(2**62, (), dtype=torch.int64).item())


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator for what a layer draws at a training step: the same numbers on every
    device and every time, whatever ran before (a resumed run draws what it drew uninterrupted)."""
    return torch.Generator().manual_seed((seed + 1_000_003 * step) % 2**63)


class Redrawn(AttentionLayer):
    """A layer whose random state is drawn from its seed and the training step: the seed travels
    with the state dict as a buffer (`draw_seed`), the drawn tensors as buffers too. The seed is
    also kept as a Python int, read back when a state dict is loaded, so that a redraw never
    waits for a device."""

    draw_seed: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.seed = new_seed()
        self.register_buffer("draw_seed", torch.tensor(self.seed, dtype=torch.int64))
        self.register_load_state_dict_post_hook(_read_seed)


def _read_seed(module: nn.Module, incompatible: object) -> None:
    assert isinstance(module, Redrawn)  # registered on Redrawn layers alone
    module.seed = int(module.draw_seed)
