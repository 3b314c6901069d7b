"""What every attention layer of the registry is: the one interface the transformer block calls,
and `register`, the decorator with which a kind names itself where it is defined.

A layer takes tokens x (B, L, D) and their padding mask m (B, L), 1 for real tokens (left out: every
token real), and returns its output and its auxiliary loss. Each layer guarantees, and
tests/test_attention.py checks:

- causality: a real token's output depends only on real tokens at or before it;
- padding exactness: no real output changes when a padded token changes, whatever it holds (NaN
  and Inf included: padded tokens enter every kind as zeros); padded outputs are zeros, and a row
  of padding alone has a zero auxiliary loss;
- rows: given a slice of positions, the outputs there alone (B, R, D), equal to the full output
  sliced (the last block asks for the state tokens in training and for the last token in acting);
- objective=False skips the auxiliary loss, the case in acting.

Its arguments are checked once, here, for every kind: when it is built (check_arguments, which each
kind's constructor calls) and at every forward (check_inputs, which AttentionLayer wraps around each
subclass's forward, and which fills in a missing mask), so that a wrong shape, an integer dtype or
an empty input is a ValueError naming what is expected rather than an error deep inside the layer.

The auxiliary loss is a per-sequence term (B,) whose batch mean the model averages over the blocks
that have one and adds, weighted by train.aux_weight, to the action loss; None for a layer without
one. A kind names its own (aux_loss_name, how training logs it): Primal-Attention's is its KSVD
loss J^2, "ksvd_loss" (attention.py); no other attention here has one.

Random state that a layer draws (Performer's random features, Reformer's hash rotations) lives in
buffers, so that checkpoints carry it, and is redrawn only by `redraw(step)`, a function of the
training step: a resumed run and an uninterrupted one draw the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from primal_dt.common.config import ModelConfig
from primal_dt.method.dropout import Dropout

Forward = Callable[..., tuple[Tensor, Tensor | None]]


def check_arguments(layer: str, embed_dim: int, n_head: int, dropout_p: float) -> None:
    """A layer's own check of the arguments every kind has, when it is built (whoever builds
    it): a ValueError saying which argument is wrong, instead of a reshape error at the first
    forward. A kind checks its own settings itself."""
    if embed_dim <= 0 or n_head <= 0:
        raise ValueError(
            f"{layer}: embed_dim and n_head must be positive, got {embed_dim}, {n_head}"
        )
    if embed_dim % n_head:
        raise ValueError(
            f"{layer}: embed_dim ({embed_dim}) must be divisible by n_head ({n_head}): each head "
            f"takes embed_dim / n_head channels"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{layer}: dropout must be in [0, 1), got {dropout_p}")


def check_inputs(layer: str, embed_dim: int, x: Tensor, mask: Tensor | None) -> Tensor:
    """A layer's check of its forward's inputs, the counterpart of check_arguments: a ValueError
    naming what is expected where x is not floating-point, not (B, L, embed_dim), holds no token,
    or mask is not (B, L). Returns the mask, or where it is None one of all real tokens (True,
    (B, L), on x's device)."""
    if not x.is_floating_point():
        raise ValueError(f"{layer} expects floating-point x, got {x.dtype}")
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise ValueError(
            f"{layer} expects x of shape (batch, length, {embed_dim}), got {tuple(x.shape)}"
        )
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(
            f"{layer} expects at least one sequence of at least one token, got x of shape "
            f"{tuple(x.shape)}"
        )
    if mask is None:
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    if mask.shape != x.shape[:2]:
        raise ValueError(
            f"{layer} expects mask of shape (batch, length) = {tuple(x.shape[:2])}, "
            f"got {tuple(mask.shape)}"
        )
    return mask


def _checked(forward: Forward) -> Forward:
    """forward with its inputs checked and a missing mask filled in first (check_inputs)."""

    def checked(
        self: AttentionLayer,
        x: Tensor,
        mask: Tensor | None = None,
        rows: slice | None = None,
        objective: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        given = mask is not None
        mask = check_inputs(type(self).__name__, self.embed_dim, x, mask)
        if not given:
            return forward(self, x, mask, rows, objective)
        real = mask.bool()
        # Padded tokens enter as zeros, whatever they hold: a NaN or Inf there would otherwise
        # reach real outputs through products with exact zeros (0 * inf is NaN).
        y, aux = forward(self, x.masked_fill(~real[..., None], 0.0), real, rows, objective)
        # Padded outputs are zeros, so a row of padding alone gives zeros and no auxiliary loss.
        y = y.masked_fill(~(real if rows is None else real[:, rows])[..., None], 0.0)
        if aux is not None:
            aux = aux.masked_fill(~real.any(dim=1), 0.0)
        return y, aux

    # The subclass's name and docstring, and this signature (mask optional), for help() and autodoc.
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(checked, name, getattr(forward, name))
    return checked


class AttentionLayer(nn.Module):
    """The base of every attention kind: subclasses set ``label`` (and ``settings_class`` where
    the kind has settings of its own), implement ``from_config`` and ``forward``, and (where they
    draw random state) ``redraw``.

    Each subclass's forward is wrapped, when the class is created, so that it receives a checked x
    and a mask that is never None (check_inputs): the checks are written once, here, for every
    kind. A kind's width D is ``embed_dim``, read from its output projection ``proj``.
    """

    label: ClassVar[str] = ""  # how reports, spectra and TensorBoard name the kind
    # The kind's own settings, [model.attention_settings.<kind>]: a dataclass whose fields have
    # defaults and `#:` comments (the configuration reference shows them), with a check() that
    # raises ValueError("<field> must ..."); None for a kind without settings. The registry fills
    # it from the config (registry.kind_settings) and hands it to from_config.
    settings_class: ClassVar[type[Any] | None] = None
    # How training logs this kind's auxiliary loss (train/<name>); the model's is its blocks' one
    # name where they agree (DecisionTransformer.aux_loss_name).
    aux_loss_name: ClassVar[str | None] = None  # None: the kind has no auxiliary loss
    # Whether the auxiliary loss reads every token: the model then keeps the last action token
    # up to this block (model.py), since its loss counts it.
    reads_every_token: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:  # a kind that inherits its forward has it checked already
            cls.forward = _checked(cls.__dict__["forward"])  # type: ignore[method-assign]

    @property
    def embed_dim(self) -> int:
        """The width D of x and of the output, read from the output projection ``proj``
        (Linear(D, D)) that every kind ends with; a kind without one defines this itself."""
        proj = getattr(self, "proj", None)
        if not isinstance(proj, nn.Linear):
            raise NotImplementedError(
                f"{type(self).__name__}: an attention layer without an output projection "
                f"proj (nn.Linear) must define embed_dim"
            )
        return proj.out_features

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> AttentionLayer:
        """The layer of this kind for a block of the model that config describes, with the kind's
        settings (an instance of settings_class, checked; None for a kind without settings)."""
        raise NotImplementedError

    def forward(
        self, x: Tensor, mask: Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Attend causally over x: each real token's output depends on real tokens at or before it.

        Args:
            x: Tokens (B, L, D), D = embed_dim.
            mask: Padding mask (B, L), bool or 0/1, true for real tokens. Default None: every
                token real.
            rows: Positions whose outputs to compute, a slice of R of the L positions; every
                token is still attended to. Default None: all L.
            objective: Whether to compute the auxiliary loss. Default True.

        Returns:
            tuple[Tensor, Tensor | None]: The output y (B, L, D), or (B, R, D) at rows, and the
            auxiliary loss per sequence (B,), or None for a kind without one or with
            objective=False.

        Raises:
            ValueError: x is not (B, L, D) or mask not (B, L).
        """
        # A subclass's forward is written for a mask that is never None: the wrapper around it
        # (_checked) takes None, and its signature is the one that help() and autodoc show.
        raise NotImplementedError

    def redraw(self, step: int) -> bool:
        """Draw the random state for training step `step`; whether it drew any (a kind without
        random state never does)."""
        return False


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


class ProjectedAttention(AttentionLayer):
    """What the kinds that project q, k, v share: one projection for the three, split into heads,
    and after attending the heads merged (at the rows asked for), the output projection and
    residual dropout. Softmax and the linear-cost kinds build on it."""

    def __init__(self, embed_dim: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        check_arguments(type(self).__name__, embed_dim, n_head, dropout)
        self.n_head = n_head
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.resid_dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> AttentionLayer:
        return cls(config.embed_dim, config.n_head, config.dropout)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, H, L, d)."""
        q, k, v = (split_heads(t, self.n_head) for t in self.qkv(x).chunk(3, dim=-1))
        return q, k, v

    def output(self, y: Tensor, rows: slice | None) -> Tensor:
        """(B, H, L, d) -> (B, L, D) or (B, R, D) at rows."""
        return self.resid_dropout(self.proj(at_rows(merge_heads(y), rows)))


def new_seed() -> int:
    """A layer's own seed, drawn from torch's CPU generator when it is built (so from train.seed,
    the same whatever the default device)."""
    return int(torch.randint(2**62, (), dtype=torch.int64, device="cpu").item())


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


#: Every attention kind by the name ``model.attention`` gives it, to its class, in the order of
#: their names. Filled by ``register`` where each kind is defined; registry.py imports every
#: module of this folder, so that a kind is one file.
ATTENTIONS: dict[str, type[AttentionLayer]] = {}

Kind = TypeVar("Kind", bound=type[AttentionLayer])


def register(kind: str) -> Callable[[Kind], Kind]:
    """The class decorator that makes a class the attention kind `kind`. A ValueError where the
    name, the class or its label (how reports name it) is taken already, so that no kind
    silently replaces another."""

    def add(cls: Kind) -> Kind:
        if not issubclass(cls, AttentionLayer) or not cls.label:
            raise ValueError(
                f"attention {kind!r}: {cls.__name__} must be an AttentionLayer with a label"
            )
        for taken, other in ATTENTIONS.items():
            if kind == taken or cls is other or cls.label == other.label:
                raise ValueError(
                    f"attention {kind!r} ({cls.__name__}, label {cls.label!r}) clashes with the "
                    f"registered {taken!r} ({other.__name__}, label {other.label!r})"
                )
        added: dict[str, type[AttentionLayer]] = {**ATTENTIONS, kind: cls}
        ATTENTIONS.clear()
        ATTENTIONS.update(sorted(added.items()))
        return cls

    return add
