"""One optimiser step as a function of tensors alone: the forward, the action and auxiliary losses,
their gradients (torch.func.grad), gradient clipping, AdamW and the warm-up schedule, with the
step's metrics left on the device.

Written so, the whole step is one program that torch.compile turns into one graph (train.compile:
no Python and no host sync per operation, and on CUDA one CUDA graph with mode reduce-overhead),
and that torch.func.vmap runs for a pack of runs at once (pack.py), each run with its own
parameters, optimiser state and batch. It computes what trainer.py's eager step computes with
autograd and torch.optim.AdamW:

  S1. grads = d/dθ [action MSE + train.aux_weight · auxiliary loss] (action_loss below);
  S2. each gradient times min(1, grad_clip / (‖g‖ + 1e-6)), ‖g‖ the global norm
      (torch.nn.utils.clip_grad_norm_);
  S3. for the n-th update (n = 1, 2, ...): lr_n = lr · min(n / warmup, 1) (warmup_schedule),
      θ ← θ (1 − lr_n · weight_decay); m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²;
      θ ← θ − lr_n / (1 − β1ⁿ) · m / (√v / √(1 − β2ⁿ) + ε)  (torch.optim.AdamW, β = (0.9, 0.999),
      ε = 1e-8, its defaults).

The parameters and AdamW's moments are updated in place, so a run's model and its torch AdamW
(whose moments the step shares: adam_state) stay what checkpoints save. The step counter n lives
on the device too; before a checkpoint or a log the caller writes it into the optimiser's step
counts (set_counts) and sets the torch scheduler to it (advance_schedule), host arithmetic only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad

from primal_dt.common.config import Config
from primal_dt.common.device import Precision, as_precision, autocast
from primal_dt.data.episodes import Batch
from primal_dt.method.batched import packed
from primal_dt.method.dropout import supplied_keys
from primal_dt.method.model import DecisionTransformer
from primal_dt.training.compiling import prepare_compile

BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, which adamw() keeps
EPS = 1e-8


@dataclass(frozen=True)
class StepSettings:
    """What the step needs of train.* besides the tensors."""

    precision: Precision
    device: torch.device
    grad_clip: float
    warmup_steps: int
    aux_name: str
    packed: bool = False  # vmapped over a pack's runs: the layers' pack forms (batched.py)


def action_loss(predicted: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over the action entries of real (unpadded) steps."""
    weights = mask.unsqueeze(-1).float()  # counted in float32: a bf16 count rounds (1279 -> 1280)
    squared = (predicted.float() - target) ** 2 * weights
    return squared.sum() / (weights.sum() * predicted.shape[-1]).clamp(min=1.0)


def warmup_schedule(
    optimizer: torch.optim.Optimizer, warmup: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """S3's lr_n: rising linearly from lr / warmup to lr over `warmup` steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 1.0) if warmup else 1.0
    )


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, updates: int) -> None:
    """Set a torch scheduler (and its optimiser's learning rate) to where `updates` steps of the
    functional step left it, which updated the weights without its optimiser's step()."""
    scheduler.last_epoch = updates - 1
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": it was not
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()


def adam_state(
    optimizer: torch.optim.Optimizer, params: Sequence[Tensor]
) -> list[dict[str, Tensor]]:
    """The AdamW state of each parameter, created as torch's fused AdamW creates it where the
    optimiser has none yet: the moments the functional step updates in place. (Its step counts
    stay one tensor per parameter, as torch's own step() increments each: the functional step
    keeps one count of its own, which set_counts writes into them.)"""
    states = []
    for param in params:
        state = optimizer.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        states.append(state)
    return states


def set_counts(states: list[dict[str, Tensor]], count: Tensor) -> None:
    """Every parameter's AdamW step count set to the functional step's count."""
    with torch.no_grad():
        for state in states:
            state["step"].copy_(count)


def losses(
    model: DecisionTransformer,
    settings: StepSettings,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    keys: Tensor | None,
    batch: Batch,
    aux_weight: Tensor,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """S1's loss of one run, with its action and auxiliary losses (detached) beside it."""
    supply = supplied_keys(keys) if keys is not None else nullcontext()
    form = packed() if settings.packed else nullcontext()
    with supply, form, autocast(settings.precision, settings.device):
        predicted, aux = functional_call(
            model,
            (params, buffers),
            (batch.states, batch.actions, batch.returns_to_go, batch.timesteps, batch.mask),
        )
    act_loss = action_loss(predicted, batch.actions, batch.mask)
    aux = aux.float()
    return act_loss + aux_weight * aux, (act_loss.detach(), aux.detach())


def update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    count: Tensor,
    lr: Tensor,
    weight_decay: Tensor,
    settings: StepSettings,
) -> Tensor:
    """S2 and S3 in place, for the n-th update (count = n, a float32 0-dim tensor, already
    advanced); returns the global gradient norm before clipping."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))  # S2
    coef = torch.clamp(settings.grad_clip / (norm + 1e-6), max=1.0)
    warmup = settings.warmup_steps
    lr_n = lr * torch.clamp(count / warmup, max=1.0) if warmup else lr
    beta1, beta2 = BETAS
    step_size = lr_n / (1 - beta1**count)
    correction2 = torch.sqrt(1 - beta2**count)
    for param, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
        g = g * coef
        param.mul_(1 - lr_n * weight_decay)
        m.add_((g - m) * (1 - beta1))  # torch's lerp_, written so that vmap batches it
        v.mul_(beta2).add_(g * g * (1 - beta2))
        param.sub_(step_size * m / (v.sqrt() / correction2 + EPS))
    return norm


def make_step(model: DecisionTransformer, settings: StepSettings) -> Callable[..., Any]:
    """The whole step of one run as a function of tensors:

        step(params, buffers, exp_avgs, exp_avg_sqs, count, keys, batch, lr, weight_decay,
             aux_weight) -> (action_loss, aux_loss, grad_norm)

    params, exp_avgs and exp_avg_sqs are dicts by parameter name, updated in place; count the
    number of updates so far (adam_state's shared step count), advanced in place; keys the
    dropout keys (dropout.py, supplied_keys) or None to draw them
    where they are used. vmap it over a pack's run dimension (pack.py), torch.compile it
    (train.compile)."""

    def loss_of(
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        keys: Tensor | None,
        batch: Batch,
        aux_weight: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        return losses(model, settings, params, buffers, keys, batch, aux_weight)

    gradient = grad(loss_of, has_aux=True)

    def step(
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        exp_avgs: dict[str, Tensor],
        exp_avg_sqs: dict[str, Tensor],
        count: Tensor,
        keys: Tensor | None,
        batch: Batch,
        lr: Tensor,
        weight_decay: Tensor,
        aux_weight: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        count.add_(1)
        grads, (act_loss, aux) = gradient(params, buffers, keys, batch, aux_weight)
        names = list(params)
        norm = update(
            [params[n] for n in names],
            [grads[n] for n in names],
            [exp_avgs[n] for n in names],
            [exp_avg_sqs[n] for n in names],
            count,
            lr,
            weight_decay,
            settings,
        )
        return act_loss, aux, norm

    return step


def step_settings(
    config: Config, device: torch.device, model: DecisionTransformer, pack: bool = False
) -> StepSettings:
    train = config.train
    return StepSettings(
        as_precision(train.precision),
        device,
        train.grad_clip,
        train.warmup_steps,
        model.aux_loss_name,
        pack,
    )


def hyper(configs: list[Config], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """lr, weight_decay and the auxiliary loss's weight of each run, (R,) tensors (scalars where
    one config is given alone: see WholeStep)."""
    values = [(c.train.lr, c.train.weight_decay, c.train.aux_weight) for c in configs]
    lr, decay, aux = torch.tensor(values, dtype=torch.float32, device=device).unbind(1)
    return lr, decay, aux


def static(tensors: Iterable[Tensor]) -> None:
    """Mark tensors that keep their address from step to step (the weights, the optimiser's
    moments) so that CUDA graphs (train.compile_mode reduce-overhead) read and write them in
    place rather than copying them in and out at every replay."""
    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor)


class WholeStep:
    """One run's whole step (make_step) bound to its model's parameters and buffers and its
    AdamW's state, compiled into one graph: called with a batch, it updates them in place and
    returns the step's metrics, on the device."""

    def __init__(
        self,
        model: DecisionTransformer,
        optimizer: torch.optim.Optimizer,
        config: Config,
        device: torch.device,
    ) -> None:
        names = [name for name, _ in model.named_parameters()]
        states = adam_state(optimizer, list(model.parameters()))
        self.params = {name: param.detach() for name, param in model.named_parameters()}
        self.buffers = dict(model.named_buffers())
        self.exp_avgs = {n: s["exp_avg"] for n, s in zip(names, states, strict=True)}
        self.exp_avg_sqs = {n: s["exp_avg_sq"] for n, s in zip(names, states, strict=True)}
        self.states = states
        self.count = states[0]["step"].clone()
        lr, decay, aux = hyper([config], device)
        self.values = (lr[0], decay[0], aux[0])
        self.aux_name = model.aux_loss_name
        if device.type == "cuda":
            static(
                [
                    *self.params.values(),
                    *self.buffers.values(),
                    *self.exp_avgs.values(),
                    *self.exp_avg_sqs.values(),
                    self.count,
                ]
            )
        step = make_step(model, step_settings(config, device, model))
        prepare_compile(device)
        self.step = torch.compile(step, mode=config.train.compile_mode, dynamic=False)

    def sync(self) -> None:
        """The optimiser's step counts brought up to the steps taken (for its state_dict)."""
        set_counts(self.states, self.count)

    def __call__(self, batch: Batch) -> dict[str, Tensor]:
        act_loss, aux, norm = self.step(
            self.params,
            self.buffers,
            self.exp_avgs,
            self.exp_avg_sqs,
            self.count,
            None,
            batch,
            *self.values,
        )
        return {"action_loss": act_loss, self.aux_name: aux, "grad_norm": norm}
