"""The fast paths compute what the plain ones do, and the GPU loop never waits for the GPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import DEVICE, TINY, scalars, tiny_trainer, train_args

from primal_dt.cli import main
from primal_dt.common.device import autocast
from primal_dt.common.loading import load_config
from primal_dt.data.tasks import resolve_task
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.snapshots import read_snapshot

# Softmax attention in the first blocks, the Primal layer (its custom autograd Functions) in the
# last, so the fast paths are checked on both.
BOTH_ATTENTIONS = ('model.attention=["softmax","softmax","primal"]',)
# On CUDA also the mode gpu_check.sh times, which replays CUDA graphs (the same as default on CPU).
COMPILE_MODES = ["default"] if DEVICE == "cpu" else ["default", "reduce-overhead"]


# Softmax and Primal; then every other kind of the registry (the paper's table), one block each.
OTHERS = [kind for kind in ATTENTIONS if kind not in ("softmax", "primal")]
MODELS = {
    "softmax-primal": BOTH_ATTENTIONS,
    "the-others": (
        f"model.n_layer={len(OTHERS)}",
        f"model.attention={json.dumps(OTHERS)}",
        "model.attention_settings.performer.features=16",
    ),
}


@pytest.mark.parametrize(
    ("model", "precision"),
    [("softmax-primal", "fp32"), ("softmax-primal", "bf16"), ("the-others", "bf16")],
)  # bf16: what "auto" chooses on CPUs with a bf16 unit and on GPUs
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiled_training_matches_eager(
    minari_root, tmp_path, mode: str, precision: str, model: str
) -> None:
    """Same batches, same start: the whole step compiled as one graph (step.py: forward,
    backward, clipping, AdamW, schedule) gives the eager step's losses and weights, within the
    tolerance below. On a CPU with dropout on (compiled code draws dropout.py's masks from the
    same keys); on CUDA off (compiled graphs draw their own random numbers there)."""
    runs = {}
    for compiled in (False, True):
        trainer = tiny_trainer(
            resolve_task("hopper-medium"),
            tmp_path / str(compiled),
            3,
            f"model.dropout={0.1 if DEVICE == 'cpu' else 0.0}",
            *MODELS[model],
            f"train.compile={'true' if compiled else 'false'}",
            f'train.compile_mode="{mode}"',
            f'train.precision="{precision}"',
        )
        batches = [trainer.sampler.sample(16) for _ in range(3)]
        losses = []
        for batch in batches:
            losses.append(torch.stack(list(trainer.train_step(batch).values())))
            trainer.step += 1
        assert (trainer.whole_step is not None) == compiled
        trainer.snapshot()  # brings the optimiser's step counts and schedule up (sync)
        assert trainer.optimizer.state_dict()["state"][0]["step"].item() == 3.0
        assert trainer.scheduler.last_epoch == 3
        runs[compiled] = (torch.stack(losses), trainer.model.state_dict())
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = runs[False], runs[True]
    # Under bf16 autocast fused kernels round differently (8-bit mantissa).
    tolerance = (
        {"rtol": 1e-4, "atol": 1e-5} if precision == "fp32" else {"rtol": 3e-2, "atol": 1e-3}
    )
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
    trainer = tiny_trainer(resolve_task("hopper-medium"), tmp_path / "run", 10, *BOTH_ATTENTIONS)
    trainer.train_step(trainer.sampler.sample(16))  # first step: lazy initialisation may sync
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            trainer.accumulate(trainer.train_step(trainer.sampler.sample(16)))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_bf16_training_trains_stays_finite_and_resumes_exactly(minari_root, tmp_path) -> None:
    """train.precision = "bf16" runs the GPU's mixed-precision path on whatever device the tests
    use (the CPU in CI), with the fused AdamW that torch has there too."""
    bf16 = ('train.precision="bf16"', "train.lr=1e-3")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(train_args(straight, 40, *bf16)) == 0
    losses = [value for _, value in scalars(straight)["train/action_loss"]]
    assert all(
        math.isfinite(v)
        for tag in ("train/loss", "train/ksvd_loss", "train/grad_norm")
        for _, v in scalars(straight)[tag]
    )
    assert losses[-1] < 0.8 * losses[0], losses
    assert main(train_args(resumed, 20, *bf16)) == 0
    assert main(["train", "--resume", str(resumed), "--steps", "40", "--no-progress"]) == 0
    a, b = read_snapshot(straight), read_snapshot(resumed)
    assert a.config.train.precision == "bf16" and b.step == 40
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name
    assert scalars(straight)["train/action_loss"] == scalars(resumed)["train/action_loss"]

    trainer = tiny_trainer(resolve_task("hopper-medium"), tmp_path / "fused", 1)
    assert trainer.optimizer.defaults["fused"]  # torch has a fused AdamW for the test device


def test_bf16_autocast_keeps_the_ksvd_sums_in_float32() -> None:
    """Under bf16 autocast the scores e and r are bf16, but the KSVD loss sums them in float32:
    it equals a float64 sum over those same bf16 scores to float32 precision (a bf16 sum would
    be off by about 1e-2)."""
    torch.manual_seed(0)
    config = load_config(None, [*TINY, *BOTH_ATTENTIONS]).model
    model = DecisionTransformer(config, 11, 3, 1000).to(DEVICE)
    attn = model.blocks[-1].attn
    captured, scores = {}, attn.scores

    def keep(*args: object, **kwargs: object) -> torch.Tensor:
        captured["scores"] = scores(*args, **kwargs)
        return captured["scores"]

    attn.scores = keep
    states, actions = torch.randn(4, 5, 11, device=DEVICE), torch.randn(4, 5, 3, device=DEVICE)
    rtg, timesteps = torch.randn(4, 5, device=DEVICE), torch.arange(5, device=DEVICE).expand(4, 5)
    mask = torch.ones(4, 5, dtype=torch.bool, device=DEVICE)
    mask[0, :2] = False  # some padding
    with autocast("bf16", torch.device(DEVICE)):
        predicted, ksvd = model(states, actions, rtg, timesteps, mask)
    assert predicted.dtype == torch.bfloat16 and captured["scores"].dtype == torch.bfloat16
    assert ksvd.dtype == torch.float32
    e_r = captured["scores"].double()  # (B, 3K, H, 2, s)
    valid = mask.repeat_interleave(3, dim=1).double()
    lam = attn.lam.detach().double()[None, None, :, None, :]
    energy = ((lam * e_r) ** 2).sum(dim=(2, 3, 4)) * valid
    trace = (attn.we.double() * attn.wr.double()).sum(dim=(1, 2)).mean()
    j = 0.5 * energy.sum(1) / (valid.sum(1) * config.n_head) - trace
    torch.testing.assert_close(ksvd.double(), (j**2).mean().detach(), rtol=1e-5, atol=1e-7)
