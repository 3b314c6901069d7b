"""A pack evaluated as one. The runs of a pack (training/pack.py) reach each evaluation step
together; their snapshots of that step are rolled out in one vector environment, with one batched
forward per environment step for every run's episodes (PackedPolicy: the runs' weights stacked on
a run dimension and model.act vmapped over it, as the pack trains), and each run's record is kept
in its own run directory as its lone evaluation's would be (service.CheckpointEvaluator.keep:
eval.jsonl, TensorBoard, best.pt), marked with the pack's size (EvalResult.pack).

A run's episodes are its lone evaluation's (its seed's start states, its targets); its actions
are its model's to within the rounding of the batched products (float32: about 1e-8; bf16: about
1e-3 of an action), so its returns equal those of `primal-dt eval --ckpt` of its checkpoint to
that rounding, carried through the simulation (tests/test_pack.py compares them on short
episodes). A pass that cannot be made as one (runs that differ in what they plan, a snapshot that
does not load) evaluates each run alone instead.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from primal_dt.common.errors import first_line
from primal_dt.evaluation.rollout import (
    EvalOptions,
    EvalPlan,
    Policy,
    TargetResult,
    add_videos,
    load_policy,
    make_jobs,
    plan_evaluation,
    result_record,
    rollout,
    target_results,
)
from primal_dt.evaluation.service import CheckpointEvaluator, serve_until, start_serving
from primal_dt.method.model import DecisionTransformer, pack_conditioning, returns_seen
from primal_dt.store.results import EvalResult
from primal_dt.store.rundir import RunDir, step_of
from primal_dt.store.snapshots import Snapshot, TaskInfo, read_snapshot


class _Acting(nn.Module):
    """A model whose call is its act (functional_call calls a module's forward)."""

    def __init__(self, model: DecisionTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, *windows: Tensor) -> Tensor:
        return self.model.act(*windows)


@dataclass
class PackedPolicy(Policy):
    """R runs' policies as one: the r-th of R equal blocks of slots acts with run r's weights
    (rollout's `runs`), all in one vmapped call."""

    weights: dict[str, Tensor] = field(default_factory=dict)  # "model.<name>": (R, ...) stacked
    count: int = 1
    # (R,) bool, each run's model.return_conditioning: a run without it acts on zero returns, as
    # its lone model makes them (the skeleton, self.model, is a conditioning run's); None: all do
    conditioned: Tensor | None = None

    def __post_init__(self) -> None:
        # Built once, not at every environment step: the skeleton acting with one run's weights,
        # vmapped over the run dimension.
        acting = _Acting(self.model)

        def one_run(weights: dict[str, Tensor], *windows: Tensor) -> Tensor:
            return functional_call(acting, weights, windows)

        self._batched = vmap(one_run)

    @property
    def runs(self) -> int:
        return self.count

    def act(
        self, states: Tensor, actions: Tensor, rtg: Tensor, timesteps: Tensor, mask: Tensor
    ) -> Tensor:
        def by_run(x: Tensor) -> Tensor:  # (R * S, ...) -> (R, S, ...)
            return x.reshape(self.count, x.shape[0] // self.count, *x.shape[1:])

        s, a, r, t, m = (by_run(x) for x in (states, actions, rtg, timesteps, mask))
        action = self._batched(self.weights, s, a, returns_seen(r, self.conditioned), t, m)
        return action.reshape(-1, action.shape[-1])  # (R, S, A) -> (R * S, A)

    @classmethod
    def of(cls, policies: list[Policy]) -> PackedPolicy:
        """The policies as one; ValueError where they do not act alike but for their weights and
        their return conditioning (another model, state statistics, return scale, precision or
        device)."""
        first = policies[0]
        conditioned = [policy.model.config.return_conditioning for policy in policies]

        def shape(policy: Policy) -> Any:
            return dataclasses.replace(policy.model.config, return_conditioning=True)

        for policy in policies[1:]:
            alike = (
                shape(policy) == shape(first)
                and (policy.model.state_dim, policy.model.act_dim)
                == (first.model.state_dim, first.model.act_dim)
                and torch.equal(policy.state_mean, first.state_mean)
                and torch.equal(policy.state_std, first.state_std)
                and (policy.return_scale, policy.precision, policy.device)
                == (first.return_scale, first.precision, first.device)
            )
            if not alike:
                raise ValueError("the runs' policies differ in more than their weights")
        params, buffers = stack_module_state([policy.model for policy in policies])
        weights = {f"model.{name}": w.detach() for name, w in {**params, **buffers}.items()}
        skeleton, flags = pack_conditioning(conditioned, first.device)
        return cls(
            policies[skeleton].model,
            first.state_mean,
            first.state_std,
            first.return_scale,
            first.device,
            first.precision,
            weights,
            len(policies),
            flags,
        )


def score_pack(
    policy: PackedPolicy, task: TaskInfo, plans: list[EvalPlan]
) -> list[list[TargetResult]]:
    """Each run's results of its plan (all alike but for their seeds), from one rollout."""
    first = plans[0]
    per_run = [make_jobs(first.targets, first.episodes, plan.seed) for plan in plans]
    returns, lengths = rollout(
        policy, task, [job for jobs in per_run for job in jobs], None, first.workers
    )
    n = len(per_run[0])
    return [
        target_results(
            task, first.targets, jobs, returns[r * n : (r + 1) * n], lengths[r * n : (r + 1) * n]
        )
        for r, jobs in enumerate(per_run)
    ]


def evaluate_together(
    evaluators: list[CheckpointEvaluator], snapshots: list[Snapshot], names: list[str]
) -> list[EvalResult]:
    """Evaluate each evaluator's snapshot (all of one step), as one where they can be (one
    task, plans alike but for their seeds, policies alike but for their weights), and keep
    each run's record in its run directory; else each alone."""
    assert len({s.step for s in snapshots}) <= 1, "one step's snapshots"
    if len(snapshots) < 2:
        return [
            ev.evaluate_snapshot(s, n)
            for ev, s, n in zip(evaluators, snapshots, names, strict=True)
        ]
    try:
        policies = [
            load_policy(s, ev.device, f"snapshot of step {s.step}")
            for ev, s in zip(evaluators, snapshots, strict=True)
        ]
        plans = [
            plan_evaluation(s, ev.options) for ev, s in zip(evaluators, snapshots, strict=True)
        ]
        if (
            len({s.task.name for s in snapshots}) != 1
            or len({dataclasses.replace(plan, seed=0) for plan in plans}) != 1
        ):
            raise ValueError("the runs' evaluations are planned differently")
        start = time.perf_counter()
        found = score_pack(PackedPolicy.of(policies), snapshots[0].task, plans)
        seconds = time.perf_counter() - start
    except Exception as err:  # each alone: a bad snapshot gets its own error record
        evaluators[0].log(
            f"step {snapshots[0].step}: the pack's runs evaluated one by one: "
            f"{type(err).__name__}: {first_line(err)}"
        )
        return [
            ev.evaluate_snapshot(s, n)
            for ev, s, n in zip(evaluators, snapshots, names, strict=True)
        ]
    records = []
    for ev, snapshot, policy, plan, name, results in zip(
        evaluators, snapshots, policies, plans, names, found, strict=True
    ):
        record = result_record(snapshot, policy, plan, name, results, seconds, len(snapshots))
        try:
            if plan.videos:
                add_videos(record, snapshot, policy, plan, ev.run.videos)
        except Exception as err:  # as evaluate_snapshot: the run's error record, not a crash
            records.append(ev.failed(snapshot.step, name, err))
            continue
        records.append(ev.keep(snapshot, policy.model, record))
    return records


def evaluate_queues(evaluators: list[CheckpointEvaluator], finishing: bool) -> list[EvalResult]:
    """The runs' queued snapshots evaluated a step at a time, in step order, each step's
    together, and removed once evaluated. A step is taken once every run has queued it, or some
    run a later one (the runs of a pack queue a step one after another, so the others never
    will), or when finishing; until then it waits, and so do the steps after it."""
    queued = [{step_of(p): p for p in ev.run.queued_snapshots()} for ev in evaluators]
    records: list[EvalResult] = []
    for step in sorted(set().union(*queued)):
        holders = [r for r, paths in enumerate(queued) if step in paths]
        later = any(s > step for paths in queued for s in paths)
        if len(holders) < len(evaluators) and not later and not finishing:
            break
        members, snapshots = [], []
        for r in holders:
            ev = evaluators[r]
            try:
                snapshots.append(read_snapshot(queued[r][step], map_location=ev.device))
                members.append(ev)
            except Exception as err:  # a bad snapshot must never stop the evaluator
                records.append(ev.failed(step, str(ev.run), err))
        records += evaluate_together(members, snapshots, [str(ev.run) for ev in members])
        for r in holders:  # only now: a stopped evaluator leaves them for the next
            queued[r][step].unlink(missing_ok=True)
    return records


def _note(notes: Any, run: int, line: str) -> None:
    notes.put((run, line))


def serve_pack(
    run_dirs: list[str],
    options: EvalOptions,
    finish: Any,
    parent: int,
    notes: Any,
    poll_seconds: float = 0.5,
) -> None:
    """service.serve for a pack: one process beside training evaluates every run's queue
    (evaluate_queues) until the trainer sets `finish`, then the rest, and exits; its notes go
    to the trainer through `notes` as (run index, line)."""
    device = start_serving(parent, options)
    evaluators = [
        CheckpointEvaluator(RunDir(Path(run)), options, device, partial(_note, notes, r))
        for r, run in enumerate(run_dirs)
    ]
    try:
        serve_until(finish, parent, partial(evaluate_queues, evaluators), poll_seconds)
    finally:
        for ev in evaluators:
            ev.close()
