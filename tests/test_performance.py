"""The fast paths compute what the plain ones do, and the GPU loop never waits for the GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from test_learning import _trainer

from primal_dt.tasks import resolve_task

# On CUDA also the mode gpu_check.sh times, which replays CUDA graphs (the same as default on CPU).
COMPILE_MODES = ["default"] if DEVICE == "cpu" else ["default", "reduce-overhead"]


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiled_training_matches_eager(minari_root, tmp_path, mode: str) -> None:
    """Same batches, same start: the compiled model's losses and weights follow the eager one's.
    (Dropout off: compiled graphs draw their own random numbers.)"""
    runs = {}
    for compiled in (False, True):
        trainer = _trainer(
            resolve_task("hopper-medium"), tmp_path / str(compiled), 3, "model.dropout=0.0",
            f"train.compile={'true' if compiled else 'false'}", f'train.compile_mode="{mode}"',
        )  # fmt: skip
        assert (trainer.forward_model is trainer.model) != compiled
        batches = [trainer.sampler.sample(16) for _ in range(3)]
        losses = [torch.stack(trainer.train_step(batch)) for batch in batches]
        runs[compiled] = (torch.stack(losses), trainer.model.state_dict())
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = runs[False], runs[True]
    # On CUDA both run under bf16 autocast, where fused kernels round differently (8-bit mantissa).
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if DEVICE == "cpu" else {"rtol": 3e-2, "atol": 1e-3}
    torch.testing.assert_close(compiled_losses, eager_losses, **tolerance)
    for name, value in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], value, **tolerance, msg=name)
    # The checkpoint holds the plain model's names, loadable without torch.compile.
    assert not any(name.startswith("_orig_mod") for name in compiled_weights)


@pytest.mark.skipif(
    DEVICE == "cpu", reason="needs PRIMAL_DT_TEST_DEVICE=cuda (scripts/gpu_check.sh)"
)
def test_training_steps_never_wait_for_the_gpu(minari_root, tmp_path) -> None:
    """Sampling, forward, backward, clipping and the optimiser step queue work on the GPU without
    ever reading a value back: CUDA's sync debug mode turns any synchronisation into an error."""
    trainer = _trainer(resolve_task("hopper-medium"), tmp_path / "run", 10)
    trainer.train_step(trainer.sampler.sample(16))  # first step: lazy initialisation may sync
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            trainer.pending += torch.stack(trainer.train_step(trainer.sampler.sample(16)))
    finally:
        torch.cuda.set_sync_debug_mode("default")
