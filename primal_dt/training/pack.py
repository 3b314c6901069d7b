"""Many runs trained as one batched model: a pack.

Runs of one task and one configuration that differ only in their seed (and in the values the step
takes per run: train.lr, train.weight_decay, train.aux_weight, and model.return_conditioning, a
run without it seeing its windows' returns as zeros, as its lone model makes them) train in one
process: the parameters, buffers and AdamW state of the R runs are stacked on a leading run
dimension (torch.func.stack_module_state), and one step (step.py's whole step, vmapped over that
dimension, and compiled with train.compile) trains them all, so that R small models fill a device
as one large one. Each run stays a whole run (a Trainer of its own, trainer.py): its run
directory, config.json, TensorBoard events, eval.jsonl, checkpoints that `eval`, `report` and
`--resume` read as any run's, and its run lock. The pack is evaluated as one (evaluation/packed.py): each
evaluation step's snapshots of every run in one batched rollout, each run's record in its own
eval.jsonl.

What keeps a run in a pack the run it would be alone:

- its weights start as its lone run's (each run's model is built by launch.py from its seed);
- its windows come from its own sampler (its own generator, seeded from its seed);
- on a CPU its dropout masks are its lone run's: the keys of every dropout call (dropout.py, D1)
  are drawn from the run's own torch generator state, in its lone run's order, and handed to the
  calls (supplied_keys); Performer's and Reformer's random state is redrawn by each run's own
  layers (layer.py, a function of their seed and the step);
- its gradient is its own (torch.func.grad of its own loss, under vmap), clipped by its own
  global norm, and AdamW with its schedule acts on its slice alone, with its own values.

So a run trained in a pack gives its lone run's weights to within the rounding of batched matrix
products (tests/test_pack.py: float32 on a CPU, 1e-5 relative after 40 steps). A pack stopped
and resumed (each run's checkpoint holds its own optimiser state and random state) goes on with
the same bits as one that was not. On CUDA the pack's dropout masks are drawn on the device by
torch's CUDA generator, one for the pack (vmap's randomness "different": no per-run key drawing
on the host), so there a run's masks depend on its pack and differ from its lone run's.
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
from torch.func import stack_module_state, vmap

from primal_dt.common.config import MECHANICS, Config, flat_settings
from primal_dt.common.errors import ConfigError
from primal_dt.common.progress import progress_bar
from primal_dt.common.signals import StopSignals
from primal_dt.data.episodes import Batch
from primal_dt.evaluation.evaluators import pack_evaluators
from primal_dt.method.dropout import draw_key_pairs, supplied_keys
from primal_dt.method.model import DecisionTransformer, pack_conditioning, returns_seen
from primal_dt.store.results import EvalResult
from primal_dt.training.compiling import prepare_compile
from primal_dt.training.memory import out_of_memory_named
from primal_dt.training.step import (
    adam_state,
    advance_schedule,
    hyper,
    make_step,
    set_counts,
    static,
    step_settings,
)
from primal_dt.training.trainer import EvaluationFailed, Metrics, Trainer, TrainingInterrupted

# The settings runs of one pack may differ in: values that the step takes per run (all others
# shape the model, the data or the schedule that the runs share).
PACK_FREE = (
    "train.seed",
    "train.lr",
    "train.weight_decay",
    "train.aux_weight",
    "model.return_conditioning",
)


# How a run is executed but for what a pack must share: its length and its device.
PACK_SHARED = ("train.steps", "train.device")


def pack_key(config: Config) -> dict[str, Any]:
    """What runs must share to be packed together: every setting but PACK_FREE and those that
    change how a run is executed, not what it computes (MECHANICS), save PACK_SHARED."""
    return {
        key: value
        for key, value in flat_settings(config).items()
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
                    f"and {first[key]!r} in {names[0]} (a pack's runs may differ only in "
                    f"{', '.join(PACK_FREE)}); train them in separate packs"
                )


class PackedModel:
    """The stacked state of R runs' models and optimisers, and one training step of them all:
    step.py's whole step, vmapped over the run dimension (and compiled with train.compile).

    Built from the runs' trainers as they are (at step 0, or restored from their checkpoints);
    `into_run(r)` writes run r's slice back into its trainer, so that what its trainer logs,
    evaluates and saves is that run's own.
    """

    def __init__(self, trainers: list[Trainer], rng_states: list[Tensor]) -> None:
        first = trainers[0]
        self.trainers = trainers
        # Runs without return conditioning (behaviour cloning) get their windows' returns as
        # zeros here, as their lone model zeros them itself (model.embed): the functional
        # skeleton is a conditioning run's model where the pack has one.
        flags = [trainer.config.model.return_conditioning for trainer in trainers]
        skeleton, self.conditioned = pack_conditioning(flags, first.device)
        self.template: DecisionTransformer = trainers[skeleton].model
        self.device = first.device
        models = [trainer.model for trainer in trainers]
        params, buffers = stack_module_state(models)
        self.params = {name: param.detach() for name, param in params.items()}
        self.buffers = buffers
        self.exp_avgs, self.exp_avg_sqs, self.count = self._stack_optimizers()
        self.values = hyper([trainer.config for trainer in trainers], self.device)
        # Each run's torch random state: what its lone run's default generator would hold now.
        self.rng_states = [state.clone() for state in rng_states]
        self.redraws = any(True for _ in first.model.buffers())
        # On a CPU each run's dropout keys are drawn from its own generator state (its lone
        # run's masks); on CUDA, torch's dropout draws each run's masks on the device.
        self.keyed = self.device.type == "cpu"
        self.calls = 0  # dropout calls a step makes (counted at the first step)
        self.counted = False
        settings = step_settings(first.config, self.device, first.model, pack=True)
        batched = vmap(
            make_step(self.template, settings),
            in_dims=(0, 0, 0, 0, None, 0 if self.keyed else None, 0, 0, 0, 0),
            randomness="error" if self.keyed else "different",
        )
        self.step_all = batched
        if first.config.train.compile:
            prepare_compile(self.device)
            if self.device.type == "cuda":
                static(
                    [
                        *self.params.values(),
                        *self.buffers.values(),
                        *self.exp_avgs.values(),
                        *self.exp_avg_sqs.values(),
                        self.count,
                    ]
                )
            mode = first.config.train.compile_mode
            self.step_all = torch.compile(batched, mode=mode, dynamic=False)

    def _stack_optimizers(self) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
        """The runs' AdamW moments (restored from checkpoints, or zeros) stacked, and their
        common count of updates."""
        counts = {trainer.step for trainer in self.trainers}
        if len(counts) != 1:
            raise ConfigError(f"the runs of a pack must be at one step, got steps {sorted(counts)}")
        states = [
            adam_state(trainer.optimizer, list(trainer.model.parameters()))
            for trainer in self.trainers
        ]
        names = list(self.params)
        exp_avgs, exp_avg_sqs = {}, {}
        for index, name in enumerate(names):
            exp_avgs[name] = torch.stack([run[index]["exp_avg"] for run in states])
            exp_avg_sqs[name] = torch.stack([run[index]["exp_avg_sq"] for run in states])
        return exp_avgs, exp_avg_sqs, states[0][0]["step"].clone()

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
            states = adam_state(trainer.optimizer, params)
            for name, state in zip(self.params, states, strict=True):
                state["exp_avg"].copy_(self.exp_avgs[name][run])
                state["exp_avg_sq"].copy_(self.exp_avg_sqs[name][run])
        set_counts(states, self.count)
        advance_schedule(trainer.scheduler, trainer.step)
        torch.set_rng_state(self.rng_states[run])

    def _redraw(self, step: int) -> None:
        """Each run's layers draw their random state for this step; the stack takes it where
        they drew any (Performer's features every train.redraw steps, Reformer's hashes every
        step)."""
        with torch.no_grad():
            for run, trainer in enumerate(self.trainers):
                if trainer.model.redraw(step):
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
                batch.states[0],
                batch.actions[0],
                batch.returns_to_go[0],
                batch.timesteps[0],
                batch.mask[0],
            )
        self.calls, self.counted = supply.used, True

    def step(self, step: int) -> list[Metrics]:
        """One optimiser step of every run, on a batch from each run's sampler; each run's
        metrics, as its lone train_step returns them."""
        train = self.trainers[0].config.train
        batches = [trainer.sampler.sample(train.batch_size) for trainer in self.trainers]
        batch = Batch(*(torch.stack(fields) for fields in zip(*batches, strict=True)))
        batch = batch._replace(returns_to_go=returns_seen(batch.returns_to_go, self.conditioned))
        if self.keyed and not self.counted:
            self._count_calls(batch)
        if self.redraws:
            self._redraw(step)
        keys = self._keys() if self.keyed else None
        act_loss, aux, grad_norm = self.step_all(
            self.params,
            self.buffers,
            self.exp_avgs,
            self.exp_avg_sqs,
            self.count,
            keys,
            batch,
            *self.values,
        )
        aux_name = self.template.aux_loss_name
        return [
            {"action_loss": act_loss[run], aux_name: aux[run], "grad_norm": grad_norm[run]}
            for run in range(len(self.trainers))
        ]


@dataclass
class Pack:
    """The runs of a pack, as launch.py assembled them, each with the state of torch's default
    generator that its lone run would have at this point (launch.py takes it right after
    building or restoring the run)."""

    trainers: list[Trainer]
    rng_states: list[Tensor]

    def __post_init__(self) -> None:
        # One evaluation for the pack: each step's snapshots rolled out as one. The members take
        # over the runs' evaluators' locks (held already) and what each had printed.
        alone = [trainer.evaluator for trainer in self.trainers]
        for trainer, member in zip(self.trainers, pack_evaluators(alone), strict=True):
            trainer.evaluator = member

    @property
    def run_dirs(self) -> list[str]:
        return [str(trainer.run_dir) for trainer in self.trainers]

    def train(
        self, progress: bool = True, stop: StopSignals | None = None
    ) -> list[EvalResult | None]:
        """Train the runs together to their train.steps (as Trainer.train does each, with one
        batched step for all): each logs, evaluates and saves as it would alone. Returns each
        run's final evaluation record. SIGINT/SIGTERM stop every run with a checkpoint saved;
        a pack that fails before its first checkpoint leaves nothing in its run directories."""
        with ExitStack() as undo:
            for trainer in self.trainers:
                undo.enter_context(trainer.undone_unless_saved(trainer.step))
            undo.enter_context(out_of_memory_named(self.trainers[0].config))
            return self._train(progress, stop or StopSignals())

    def _train(self, progress: bool, stop: StopSignals) -> list[EvalResult | None]:
        trainers, first = self.trainers, self.trainers[0]
        steps = first.config.train.steps
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
            finals = [
                trainer.end(writer, start)
                for trainer, writer in zip(trainers, writers, strict=True)
            ]
        for trainer in trainers:
            trainer.copy_to_task_charts()
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
