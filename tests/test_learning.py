"""A small model really learns: its action loss falls, and expert data beats random data."""

from __future__ import annotations

import numpy as np
import torch
from conftest import tiny_trainer

from primal_dt.data.tasks import dataset_task, resolve_task
from primal_dt.evaluation.rollout import TargetResult, load_policy, score_targets
from primal_dt.training.trainer import Trainer, action_loss


def _fixed_loss(trainer, batch) -> float:
    trainer.model.eval()
    with torch.no_grad():
        predicted, _ = trainer.model(
            batch.states, batch.actions, batch.returns_to_go, batch.timesteps, batch.mask
        )
    trainer.model.train()
    return action_loss(predicted, batch.actions, batch.mask).item()


def _evaluate(trainer: Trainer) -> list[TargetResult]:
    """The trainer's policy evaluated here and now (a run hands this to its evaluation service)."""
    snapshot = trainer.snapshot()
    policy = load_policy(snapshot, trainer.device, "the trained policy")
    return score_targets(
        policy, snapshot.task, trainer.config.eval.episodes, trainer.config.train.seed
    )


def test_action_loss_falls_well_below_its_start(minari_root, tmp_path) -> None:
    trainer = tiny_trainer(resolve_task("halfcheetah-expert"), tmp_path / "run", 150)
    batch = trainer.sampler.sample(256)
    before = _fixed_loss(trainer, batch)
    trainer.train(progress=False)
    after = _fixed_loss(trainer, batch)
    assert after < 0.4 * before, (before, after)


def test_expert_data_beats_random_data_in_the_environment(minari_root, tmp_path) -> None:
    """Hopper: a policy cloned from 3 expert episodes hops on; one from random data falls at once."""
    returns = {}
    for name, task in (
        ("expert", resolve_task("hopper-expert")),
        ("random", dataset_task("test/hopper/random-v0")),
    ):
        trainer = tiny_trainer(
            task,
            tmp_path / name,
            500,
            "model.embed_dim=64",
            "model.context_len=10",
            "train.batch_size=32",
        )
        trainer.train(progress=False)
        results = _evaluate(trainer)  # targets 3600 and 1800, 2 episodes each
        returns[name] = np.mean([r.returns for r in results])
    assert returns["expert"] > returns["random"] + 150, returns
