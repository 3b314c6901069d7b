"""The Decision Transformer (Chen et al. 2021), each block's attention of the kind its config names
(model.attention, each kind with its model.attention_settings; method/registry.py): softmax,
Primal-Attention, or an efficient attention of the Primal paper's comparison.

Each timestep contributes three tokens, (return-to-go, state, action), each a linear embedding plus
a learned timestep embedding; the 3K tokens pass an embedding LayerNorm and N pre-LayerNorm blocks,
and the action a_t is read from the hidden state of the s_t token through a tanh head.

In training, outputs the loss never reads are not computed, with the results of the full
computation (forward(..., every_token=True), kept for the attention spectra, the tests and the
benchmarks):

- the last block works out its outputs (attention output, projection, residual, MLP, final
  LayerNorm) at the K state tokens alone, from keys, values (softmax) or e and r (Primal, whose
  KSVD objective needs them at every token) computed over the whole window; the linear-cost
  attentions compute their prefix sums everywhere and cut before their output projection;
- the last action token a_K reaches no state token, so it is dropped before the first block after
  the last block whose auxiliary loss reads every token (Primal's; at once without one).
  (The last such block, where another follows it, still works out a_K's output: one token of 3K.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from primal_dt.common.config import ModelConfig
from primal_dt.method.batched import LayerNorm
from primal_dt.method.dropout import Dropout
from primal_dt.method.layer import AttentionLayer
from primal_dt.method.registry import aux_loss_name, build_attention, check_kinds

STATE_TOKENS = slice(1, None, 3)  # s_t sits at 3t + 1 in (R_1, s_1, a_1, R_2, ...)
LAST_TOKEN = slice(-1, None)
# What a model of kinds without an auxiliary loss logs its zero under: Primal's name, so that DT
# and Primal-DT runs share their charts.
NO_AUX_LOSS_NAME = "ksvd_loss"


class Block(nn.Module):
    """Pre-LayerNorm transformer block; its attention of the given kind (method/registry.py)."""

    def __init__(self, config: ModelConfig, kind: str) -> None:
        super().__init__()
        dim = config.embed_dim
        self.kind = kind
        self.ln_1 = LayerNorm(dim)
        self.attn: AttentionLayer = build_attention(kind, config)
        self.ln_2 = LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), Dropout(config.dropout)
        )

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Outputs at every token, or at rows alone (attending to every token); the attention's
        auxiliary loss per sequence (None without one, or with objective=False)."""
        attended, aux = self.attn(self.ln_1(x), mask, rows, objective)
        x = (x if rows is None else x[:, rows]) + attended
        x = x + self.mlp(self.ln_2(x))
        return x, aux


class DecisionTransformer(nn.Module):
    """The Decision Transformer, each block's attention of the kind config names.

    forward(states, actions, returns_to_go, timesteps, mask) gives the predicted actions
    (B, K, A) and the auxiliary loss (the KSVD loss of its Primal blocks); act gives the action
    for the last step of each window.

    Args:
        config: The model's settings (embed_dim, n_layer, n_head, the attention of each block).
        state_dim: S, the size of a state.
        act_dim: A, the size of an action (predicted in [-1, 1] through a tanh).
        max_timestep: The timesteps embedded; later ones share the last embedding.
    """

    def __init__(
        self, config: ModelConfig, state_dim: int, act_dim: int, max_timestep: int
    ) -> None:
        super().__init__()
        self.config = config
        self.state_dim = state_dim
        self.act_dim = act_dim
        self.max_timestep = max_timestep
        dim = config.embed_dim
        self.embed_timestep = nn.Embedding(max_timestep, dim)
        self.embed_return = nn.Linear(1, dim)
        self.embed_state = nn.Linear(state_dim, dim)
        self.embed_action = nn.Linear(act_dim, dim)
        self.embed_ln = LayerNorm(dim)
        self.drop = Dropout(config.dropout)
        check_kinds(config)  # every kind and setting, before any block is built
        blocks = [Block(config, kind) for kind in config.block_kinds()]
        self.blocks = nn.ModuleList(blocks)
        readers = [i for i, block in enumerate(blocks) if block.attn.reads_every_token]
        self.last_action_read_until = max(readers, default=-1)  # the last block that reads a_K
        # The auxiliary loss's name in the logs (registry.aux_loss_name). A model without any
        # keeps Primal's name (its loss is zero), so that DT and Primal-DT runs plot on one chart.
        self.aux_loss_name = aux_loss_name(config.block_kinds()) or NO_AUX_LOSS_NAME
        self.ln_f = LayerNorm(dim)
        self.predict_action = nn.Sequential(nn.Linear(dim, act_dim), nn.Tanh())
        self.apply(_init_weights)

    def embed(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor,
        timesteps: Tensor,
        mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Tokens (B, 3K, D) in the order R_1, s_1, a_1, R_2, ... and their padding mask."""
        batch, length, _ = states.shape
        time = self.embed_timestep(timesteps.clamp(0, self.max_timestep - 1))
        if not self.config.return_conditioning:  # behaviour cloning: the returns reach nothing
            returns_to_go = torch.zeros_like(returns_to_go)
        tokens = torch.stack(
            (
                self.embed_return(returns_to_go.unsqueeze(-1)) + time,
                self.embed_state(states) + time,
                self.embed_action(actions) + time,
            ),
            dim=2,
        ).reshape(batch, 3 * length, -1)
        return self.drop(self.embed_ln(tokens)), mask.repeat_interleave(3, dim=1)

    def forward(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor,
        timesteps: Tensor,
        mask: Tensor | None = None,
        every_token: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Predict the action at every step of each window.

        Args:
            states: States (B, K, S).
            actions: Actions (B, K, A); a_t is predicted from the tokens up to s_t alone.
            returns_to_go: Returns-to-go (B, K), already divided by train.return_scale.
            timesteps: Timesteps (B, K), integers.
            mask: Padding mask (B, K), bool or 0/1, true for real steps. Default None: every
                step real.
            every_token: Compute every block at every token (the module docstring's reference:
                the same results, more work). Default False.

        Returns:
            tuple[Tensor, Tensor]: The predicted actions (B, K, A), and the auxiliary loss, a
            scalar: the mean, over the blocks that have one, of its batch mean (for Primal
            blocks the mean over B of J^2, the KSVD loss), or zero when none has.
        """
        batch, length, _ = states.shape
        mask = all_steps(states) if mask is None else mask
        x, token_mask = self.embed(states, actions, returns_to_go, timesteps, mask)
        aux_terms = []
        for i, block in enumerate(self.blocks):
            if i == self.last_action_read_until + 1 and not every_token:
                x, token_mask = x[:, :-1], token_mask[:, :-1]  # a_K: read by no block from here
            last = i == len(self.blocks) - 1 and not every_token
            x, aux = block(x, token_mask, STATE_TOKENS if last else None)
            if aux is not None:
                aux_terms.append(aux.mean())
        if every_token:
            x = x.reshape(batch, length, 3, -1)[:, :, 1]  # the state tokens
        predicted = self.predict_action(self.ln_f(x))
        if aux_terms:
            aux_loss = torch.stack(aux_terms).mean()
        else:
            aux_loss = torch.zeros((), device=states.device)
        return predicted, aux_loss

    def redraw(self, step: int) -> bool:
        """Each attention's random state for training step `step` (layer.py), before its
        forward; whether any layer drew new state."""
        drawn = [m.redraw(step) for m in self.modules() if isinstance(m, AttentionLayer)]
        return any(drawn)

    def act(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor,
        timesteps: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """The action (B, A) for the last step of each window: forward(...)[0][:, -1], computed
        without the outputs nobody reads. The last action token is dropped (causally it cannot
        reach the last state token), and the final block works out the last state token alone.
        The arguments are forward's; mask defaults to None, every step real."""
        mask = all_steps(states) if mask is None else mask
        x, token_mask = self.embed(states, actions, returns_to_go, timesteps, mask)
        x, token_mask = x[:, :-1], token_mask[:, :-1]
        for block in self.blocks[:-1]:
            x, _ = block(x, token_mask, objective=False)
        x, _ = self.blocks[-1](x, token_mask, LAST_TOKEN, objective=False)
        return self.predict_action(self.ln_f(x[:, 0]))


def pack_conditioning(flags: list[bool], device: torch.device) -> tuple[int, Tensor | None]:
    """For a pack of models, each with its model.return_conditioning flag: which model serves as
    the pack's skeleton (a conditioning one where there is one: it reads the returns it is given)
    and the (R,) flags for returns_seen (None where every model conditions)."""
    skeleton = flags.index(True) if any(flags) else 0
    return skeleton, None if all(flags) else torch.tensor(flags, device=device)


def returns_seen(returns: Tensor, conditioned: Tensor | None) -> Tensor:
    """A pack's returns-to-go (R, ...) as each run's own model sees them: zeros for the runs
    without return conditioning, as its embed makes them (conditioned: pack_conditioning's)."""
    if conditioned is None:
        return returns
    flags = conditioned.view(-1, *[1] * (returns.dim() - 1))
    return torch.where(flags, returns, torch.zeros_like(returns))


def all_steps(states: Tensor) -> Tensor:
    """The padding mask (B, K) of windows without padding, for states (B, K, S)."""
    return torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)


def _init_weights(module: nn.Module) -> None:
    """GPT-2 initialisation for linear and embedding layers; Primal's We, Wr, lam keep theirs."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode (no dropout) inside the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
