"""The singular-value spectrum of each block's attention output, the Primal paper's second claim.

The KSVD loss should make a Primal block's attention output low-rank: its normalised cumulative
singular values cumsum(sigma) / sum(sigma) rise faster than those of softmax attention. Every
block is measured whatever its kind, and labelled by it (method/registry.py). For each
block we take the attention module's output (a forward hook on `block.attn`) on a fixed set of
K-step windows, one (tokens x embed) matrix per window over its real tokens only, and average the
curves over the windows.

The windows are drawn once from the task's dataset by the training sampler with a fixed seed
(WINDOWS_SEED, not the run's seed), normalised with the run's state statistics, and saved as
RUN_DIR/spectrum_windows.pt; every run of a task, DT or Primal-DT, is measured on the same windows.
They come from the training data: they are fixed, not held out.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from primal_dt.data.episodes import Batch, WindowSampler, load_task_data
from primal_dt.method.model import Block, DecisionTransformer, evaluating
from primal_dt.method.registry import attention_label
from primal_dt.store.atomic import atomic_write
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import Snapshot

WINDOWS_SEED = 2305_19798  # the paper's arXiv number: any constant, the same for every run
NUM_WINDOWS = 128


def cumulative_spectrum(matrix: Tensor) -> Tensor:
    """cumsum(sigma) / sum(sigma) of one matrix, singular values in decreasing order (float64)."""
    sigma = torch.linalg.svdvals(matrix.double())
    return sigma.cumsum(0) / sigma.sum().clamp_min(torch.finfo(torch.float64).tiny)


def mean_cumulative_spectrum(outputs: Tensor, mask: Tensor) -> Tensor:
    """The mean over windows of each window's cumulative spectrum over its real tokens.

    outputs (B, L, D), mask (B, L). A window with fewer real tokens has fewer singular values; its
    curve stays at 1 beyond them (all the mass is already there), so every curve has min(L, D)
    points.
    """
    curves = torch.ones(
        outputs.shape[0], min(outputs.shape[1], outputs.shape[2]), dtype=torch.float64
    )
    for i in range(outputs.shape[0]):
        curve = cumulative_spectrum(outputs[i][mask[i].bool()])
        curves[i, : len(curve)] = curve
    return curves.mean(0)


def rank_at(curve: np.ndarray | Tensor, fraction: float = 0.9) -> int:
    """How many singular values hold `fraction` of their sum: the smaller, the lower the rank."""
    curve = np.asarray(curve)
    return min(int((curve < fraction - 1e-12).sum()) + 1, len(curve))


@torch.no_grad()
def attention_spectra(model: DecisionTransformer, windows: Batch) -> list[np.ndarray]:
    """Per block, the mean cumulative spectrum of its attention output on the windows (eval mode)."""
    outputs: dict[int, Tensor] = {}

    def keep(index: int) -> Any:
        def hook(module: nn.Module, inputs: Any, output: tuple[Tensor, Any]) -> None:
            outputs[index] = output[0].detach().float().cpu()

        return hook

    blocks = [cast(Block, block) for block in model.blocks]  # an nn.ModuleList yields Modules
    hooks = [block.attn.register_forward_hook(keep(i)) for i, block in enumerate(blocks)]
    try:
        with evaluating(model):
            model(
                windows.states,
                windows.actions,
                windows.returns_to_go,
                windows.timesteps,
                windows.mask,
                every_token=True,  # every block's output at every token
            )
    finally:
        for hook in hooks:
            hook.remove()
    token_mask = windows.mask.repeat_interleave(3, dim=1).cpu()  # (R, s, a) tokens per step
    return [mean_cumulative_spectrum(outputs[i], token_mask).numpy() for i in sorted(outputs)]


def make_windows(snapshot: Snapshot, count: int = NUM_WINDOWS) -> Batch:
    """Fixed-seed windows of the snapshot's dataset, normalised as its run normalises states."""
    data = load_task_data(snapshot.task.task(), download=False)
    sampler = WindowSampler(
        data.episodes,
        snapshot.state_mean.cpu().numpy(),
        snapshot.state_std.cpu().numpy(),
        snapshot.config.model.context_len,
        snapshot.config.train.return_scale,
        "cpu",
        seed=WINDOWS_SEED,
    )
    return sampler.sample(count)


def fixed_windows(run: RunDir, snapshot: Snapshot) -> Batch:
    """RUN_DIR/spectrum_windows.pt; made from the dataset (and saved) the first time."""
    path = run.spectrum_windows
    if path.exists():
        try:
            return Batch(**torch.load(path, weights_only=True))
        except Exception as err:  # torch's own message would advise loading it unsafely
            raise ValueError(
                f"{path} is damaged ({type(err).__name__}); remove it, and the next evaluation "
                f"makes it again from the dataset"
            ) from None
    windows = make_windows(snapshot)
    with contextlib.suppress(OSError):  # a read-only run directory: made again next time
        atomic_write(path, lambda file: torch.save(windows._asdict(), file))
    return windows


def checkpoint_spectra(
    run: RunDir, snapshot: Snapshot, model: DecisionTransformer | None = None
) -> list[np.ndarray]:
    """The spectra of a snapshot's blocks on its run's windows (with `model`, the snapshot's
    model already built, on its device)."""
    model = model or snapshot.build_model("cpu")
    device = next(model.parameters()).device
    windows = Batch(*(t.to(device) for t in fixed_windows(run, snapshot)))
    return attention_spectra(model, windows)


def spectrum_images(
    run: RunDir, snapshot: Snapshot, model: DecisionTransformer
) -> list[tuple[int, np.ndarray]]:
    """For the evaluator: each block's spectrum of a snapshot as (rank_90, its figure as an
    (H, W, 3) image), which dashboards.log_spectrum writes to TensorBoard."""
    from primal_dt.evaluation.plots import figure_image, spectrum_figure

    step = snapshot.step
    spectra = checkpoint_spectra(run, snapshot, model)
    kinds = snapshot.config.model.block_kinds()
    images = []
    for i, curve in enumerate(spectra):
        title = f"{snapshot.task.name}, block {i} ({attention_label(kinds[i])}), step {step}"
        figure = spectrum_figure({f"step {step}": [curve]}, title, size=(4.0, 3.0))
        images.append((rank_at(curve), figure_image(figure)))
    return images
