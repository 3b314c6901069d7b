"""The K-step windows a vectorised rollout acts on, one per environment slot (rollout.rollout).

Each slot holds the last K steps of its episode as the model was trained on them: normalised
states, actions, scaled returns-to-go and the episode's step. Every step of the environments slides
all windows one step left and writes the new step into the last row (its action still zero: the
model predicts it, model.act); a window shorter than K is masked at its start, and a slot whose
episode ended is cleared for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Windows:
    """Every slot's window, as tensors on the policy's device (S slots, K steps)."""

    states: Tensor  # (S, K, state_dim): normalised
    actions: Tensor  # (S, K, act_dim)
    rtg: Tensor  # (S, K): the return still to get, over the return scale
    t: Tensor  # (S,): the step of each slot's episode
    positions: Tensor  # (K,): 0..K-1

    @classmethod
    def empty(
        cls, slots: int, k: int, state_dim: int, act_dim: int, device: torch.device
    ) -> Windows:
        return cls(
            states=torch.zeros(slots, k, state_dim, device=device),
            actions=torch.zeros(slots, k, act_dim, device=device),
            rtg=torch.zeros(slots, k, device=device),
            t=torch.zeros(slots, dtype=torch.long, device=device),
            positions=torch.arange(k, device=device),
        )

    def push(self, state: Tensor, remaining: Tensor) -> tuple[Tensor, Tensor]:
        """Slide every window one step left and put the new step in its last row: its state (S,
        state_dim), normalised, and the return still to get (S,), with a zero action; returns the
        windows' (timesteps (S, K), mask (S, K)): positions before an episode's start are masked."""
        self.states, self.actions, self.rtg = (
            self.states.roll(-1, 1),
            self.actions.roll(-1, 1),
            self.rtg.roll(-1, 1),
        )
        self.states[:, -1] = state
        self.actions[:, -1] = 0.0
        self.rtg[:, -1] = remaining
        last = len(self.positions) - 1
        timesteps = (self.t[:, None] - last + self.positions).clamp(min=0)
        mask = self.positions[None, :] >= (last - self.t)[:, None]
        return timesteps, mask

    def clear(self, slots: Tensor) -> None:
        """Empty the windows of `slots` (a boolean (S,)) for their next episodes."""
        self.states[slots], self.actions[slots], self.rtg[slots], self.t[slots] = 0.0, 0.0, 0.0, 0
