"""Many runs trained as one batched model: a pack.

Runs of one task and one configuration that differ only in their seed train in one process: the
parameters, buffers and AdamW state of the R runs are stacked on a leading run dimension
(torch.func.stack_module_state), and one step runs the model once for all of them, vmapped over
that dimension (torch.func.vmap of functional_call), so that R small models fill a device as one
large one. Each run stays a whole run (a Trainer of its own, trainer.py): its run directory,
config.json, TensorBoard events, evaluator and eval.jsonl, checkpoints that `eval`, `report` and
`--resume` read as any run's, and its run lock.

What keeps a run in a pack the run it would be alone:

- its weights start as its lone run's (each run's model is built by launch.py from its seed);
- its windows come from its own sampler (its own generator, seeded from its seed);
- its dropout masks are its lone run's: the keys of every dropout call (dropout.py, D1) are drawn
  from the run's own torch generator state, in its lone run's order, and handed to the calls
  (supplied_keys) on every device; Performer's and Reformer's random state is redrawn by each
  run's own layers (layer.py, a function of their seed and the step);
- its loss is its own: the step minimises the sum of the runs' losses, whose gradient with
  respect to a run's parameters is that run's gradient; gradients are clipped to
  train.grad_clip per run (each run's global norm), and AdamW and its schedule act element-wise,
  so on the stacked tensors they are each run's own.

So a run trained in a pack gives its lone run's weights to within the rounding of batched matrix
products (tests/test_pack.py: float32 on a CPU, 1e-5 relative after 40 steps). A pack stopped
and resumed (each run's checkpoint holds its own optimiser state and random state) goes on with
the same bits as one that was not. On CUDA a lone run's dropout draws torch's own masks, a pack's
the hash masks of dropout.py: there a run in a pack and its lone run differ by their masks.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from primal_dt.common.config import MECHANICS, Config
from primal_dt.common.device import adamw, autocast
from primal_dt.common.errors import ConfigError
from primal_dt.common.progress import progress_bar
from primal_dt.common.signals import StopSignals
from primal_dt.data.episodes import Batch
from primal_dt.method.dropout import draw_key_pairs, supplied_keys
from primal_dt.method.model import DecisionTransformer
from primal_dt.store.results import EvalRecord
from primal_dt.training.trainer import (
    EvaluationFailed,
    Metrics,
    Trainer,
    TrainingInterrupted,
    action_loss,
    warmup_schedule,
)

# The settings runs of one pack may differ in: the seed alone (all others shape the model, the
# data or the optimiser that the runs share).
PACK_FREE = ("train.seed",)


# How a run is executed but for what a pack must share: its length and its device.
PACK_SHARED = ("train.steps", "train.device")


def pack_key(config: Config) -> dict[str, Any]:
    """What runs must share to be packed together: every setting but the seed and those that
    change how a run is executed, not what it computes (MECHANICS), save PACK_SHARED."""
    flat = {
        f"{section}.{key}": value
        for section, values in config.to_dict().items()
        for key, value in (values.items() if isinstance(values, dict) else [("", values)])
    }
    return {
        key: value
        for key, value in flat.items()
        if key in PACK_SHARED
        or (
            key not in PACK_FREE
            and key.partition(".")[2] not in MECHANICS.get(key.split(".")[0], ())
        )
    }


def check_packable(configs: list[Config], names: list[str]) -> None:
    """A ConfigError naming the first setting where a run differs from the pack's first run."""
    first = pack_key(configs[0])
    for config, name in zip(configs[1:], names[1:], strict=True):
        other = pack_key(config)
        for key in first:
            if other.get(key) != first[key]:
                raise ConfigError(
                    f"{name} cannot be packed with {names[0]}: {key} is {other.get(key)!r} there "
                    f"and {first[key]!r} in {names[0]} (a pack's runs differ only in their "
                    f"seed); train them in separate packs"
                )


def per_run_norms(grads: list[Tensor]) -> Tensor:
    """(R,): each run's global gradient norm, over its slices of the stacked gradients."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])
    return torch.linalg.vector_norm(norms, dim=0)


def clip_per_run(grads: list[Tensor], max_norm: float) -> Tensor:
    """clip_grad_norm_ for each run of a pack on its own: each run's gradients scaled so that
    their global norm is at most max_norm; returns each run's norm before clipping (R,)."""
    total = per_run_norms(grads)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(coef.view(-1, *[1] * (grad.dim() - 1)).to(grad.dtype))
    return total


class PackedModel:
    """The stacked state of R runs' models and optimisers, and one training step of them all.

    Built from the runs' trainers as they are (at step 0, or restored from their checkpoints);
    `into_run(r)` writes run r's slice back into its trainer, so that what its trainer logs,
    evaluates and saves is that run's own.
    """

    def __init__(self, trainers: list[Trainer], rng_states: list[Tensor]) -> None:
        first = trainers[0]
        self.trainers = trainers
        self.template: DecisionTransformer = first.model
        self.device = first.device
        models = [trainer.model for trainer in trainers]
        self.params, self.buffers = stack_module_state(models)
        self.names = list(self.params)
        train = first.config.train
        self.optimizer = adamw(
            self.params.values(), first.device, lr=train.lr, weight_decay=train.weight_decay
        )
        self.scheduler = warmup_schedule(self.optimizer, train.warmup_steps)
        self._load_optimizers()
        # Each run's torch random state: what its lone run's default generator would hold now.
        self.rng_states = [state.clone() for state in rng_states]
        self.redraws = any(True for _ in first.model.buffers())
        self.calls = 0  # dropout calls a step makes (counted at the first step)
        self.counted = False

    def _load_optimizers(self) -> None:
        """The runs' AdamW states and schedule (restored from checkpoints), stacked."""
        first = self.trainers[0]
        steps = {trainer.scheduler.last_epoch for trainer in self.trainers}
        if len(steps) != 1:
            raise ConfigError(f"the runs of a pack must be at one step, got steps {sorted(steps)}")
        self.scheduler.load_state_dict(first.scheduler.state_dict())
        self.optimizer.param_groups[0]["lr"] = first.optimizer.param_groups[0]["lr"]
        lone = [list(trainer.model.parameters()) for trainer in self.trainers]
        for index, name in enumerate(self.names):
            states = [trainer.optimizer.state.get(params[index], {}) for trainer, params in
                      zip(self.trainers, lone, strict=True)]  # fmt: skip
            if not all(states):
                continue
            self.optimizer.state[self.params[name]] = {
                key: value.clone() if key == "step" else torch.stack([s[key] for s in states])
                for key, value in states[0].items()
            }

    def into_run(self, run: int) -> None:
        """Run `run`'s weights, buffers, AdamW state, schedule and random state into its
        trainer, as its lone run would hold them now."""
        trainer = self.trainers[run]
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                param.copy_(self.params[name][run])
            for name, buffer in trainer.model.named_buffers():
                buffer.copy_(self.buffers[name][run])
        params = list(trainer.model.parameters())
        for index, name in enumerate(self.names):
            state = self.optimizer.state.get(self.params[name])
            if state:
                trainer.optimizer.state[params[index]] = {
                    key: value.clone() if key == "step" else value[run].clone()
                    for key, value in state.items()
                }
        trainer.optimizer.param_groups[0]["lr"] = self.optimizer.param_groups[0]["lr"]
        trainer.scheduler.load_state_dict(self.scheduler.state_dict())
        torch.set_rng_state(self.rng_states[run])

    def _redraw(self, step: int) -> None:
        """Each run's layers draw their random state for this step; the stack takes it."""
        with torch.no_grad():
            for run, trainer in enumerate(self.trainers):
                trainer.model.redraw(step)
                for name, buffer in trainer.model.named_buffers():
                    self.buffers[name][run].copy_(buffer)

    def _keys(self) -> Tensor:
        """(R, calls, 2): each run's dropout keys for this step, from its own random state."""
        keys = []
        for run in range(len(self.trainers)):
            torch.set_rng_state(self.rng_states[run])
            keys.append(draw_key_pairs(self.calls))
            self.rng_states[run] = torch.get_rng_state()
        return torch.stack(keys).to(self.device)

    def _count_calls(self, batch: Batch) -> None:
        """How many dropout calls a training forward makes (each draws one pair of keys)."""
        with torch.no_grad(), supplied_keys(None) as supply:
            self.template(
                batch.states[0], batch.actions[0], batch.returns_to_go[0], batch.timesteps[0],
                batch.mask[0],
            )  # fmt: skip
        self.calls, self.counted = supply.used, True

    def _losses(
        self, params: dict[str, Tensor], buffers: dict[str, Tensor], keys: Tensor, batch: Batch
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One run's loss, action loss and auxiliary loss (the function vmapped over runs)."""
        train = self.trainers[0].config.train
        with supplied_keys(keys), autocast(train.precision, self.device):
            predicted, aux = functional_call(
                self.template, (params, buffers),
                (batch.states, batch.actions, batch.returns_to_go, batch.timesteps, batch.mask),
            )  # fmt: skip
        act_loss = action_loss(predicted, batch.actions, batch.mask)
        return act_loss + train.ksvd_weight * aux.float(), act_loss, aux.float()

    def step(self, step: int) -> list[Metrics]:
        """One optimiser step of every run, on a batch from each run's sampler; each run's
        metrics, as its lone train_step returns them."""
        train = self.trainers[0].config.train
        batches = [trainer.sampler.sample(train.batch_size) for trainer in self.trainers]
        batch = Batch(*(torch.stack(fields) for fields in zip(*batches, strict=True)))
        if not self.counted:
            self._count_calls(batch)
        if self.redraws:
            self._redraw(step)
        keys = self._keys()
        losses, act_loss, aux = vmap(self._losses, randomness="error")(
            self.params, self.buffers, keys, batch
        )
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        grads = [param.grad for param in self.params.values() if param.grad is not None]
        grad_norm = clip_per_run(grads, train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        aux_name = self.template.aux_loss_name
        return [
            {"action_loss": act_loss[run].detach(), aux_name: aux[run].detach(),
             "grad_norm": grad_norm[run].detach()}
            for run in range(len(self.trainers))
        ]  # fmt: skip


@dataclass
class Pack:
    """The runs of a pack, as launch.py assembled them, each with the state of torch's default
    generator that its lone run would have at this point (launch.py takes it right after
    building or restoring the run)."""

    trainers: list[Trainer]
    rng_states: list[Tensor]

    @property
    def run_dirs(self) -> list[str]:
        return [str(trainer.run_dir) for trainer in self.trainers]

    def train(
        self, progress: bool = True, stop: StopSignals | None = None
    ) -> list[EvalRecord | None]:
        """Train the runs together to their train.steps (as Trainer.train does each, with one
        batched step for all): each logs, evaluates and saves as it would alone. Returns each
        run's final evaluation record. SIGINT/SIGTERM stop every run with a checkpoint saved."""
        trainers, first = self.trainers, self.trainers[0]
        steps = first.config.train.steps
        stop = stop or StopSignals()
        with stop, ExitStack() as stack:
            label = f"{first.data.task.name} x{len(trainers)}"
            bar = progress_bar(steps, first.step, label, progress)
            stack.enter_context(bar)
            writers = [
                trainer.begin(stack, partial(_say_as, bar.write, trainer.run_dir.path.name))
                for trainer in trainers
            ]
            packed = PackedModel(trainers, self.rng_states)
            for run, trainer in enumerate(trainers):
                trainer.sync = partial(packed.into_run, run)
            start = first.step
            while first.step < steps:
                for trainer, metrics in zip(trainers, packed.step(first.step), strict=True):
                    trainer.accumulate(metrics)
                    trainer.step += 1
                bar.update(1)
                for run, (trainer, writer) in enumerate(zip(trainers, writers, strict=True)):
                    trainer.after_step(writer, bar if run == 0 else None, stop)
                if stop.signum is not None:
                    raise self._interrupted(stop.signum)
            finals = [trainer.end(writer, start) for trainer, writer in zip(trainers, writers,
                                                                              strict=True)]  # fmt: skip
        failed = [(t, f) for t, f in zip(trainers, finals, strict=True) if f and f.error]
        if failed:
            trainer, final = failed[0]
            raise EvaluationFailed(
                f"training finished but the final evaluation of {len(failed)} of the pack's runs "
                f"failed ({trainer.run_dir}: {final.error}); evaluate it with "
                f"primal-dt eval --ckpt {trainer.run_dir}"
            )
        return finals

    def _interrupted(self, signum: int) -> TrainingInterrupted:
        return TrainingInterrupted(
            f"stopped by {signal.Signals(signum).name} at step {self.trainers[0].step}; the "
            f"pack's {len(self.trainers)} runs saved their checkpoints; continue with: "
            f"primal-dt train --resume {' '.join(self.run_dirs)}",
            signum,
        )


def _say_as(write: Callable[..., Any], label: str, line: str) -> None:
    write(f"{label}: {line}", file=sys.stderr)
