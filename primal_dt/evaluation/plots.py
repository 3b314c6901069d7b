"""Matplotlib figures for the report and for TensorBoard images.

Figures are drawn on matplotlib's Agg canvas directly (never pyplot), so nothing opens a window or
depends on a display; matplotlib is the optional `report` extra.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import PrimalDTError

Series = Sequence[tuple[int, float]]  # (step, value) points of one run


class FiguresUnavailable(PrimalDTError):
    """matplotlib is not installed."""


def _figure(width: float, height: float, columns: int = 1) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise FiguresUnavailable(
            "figures need matplotlib: pip install 'primal-dt[report]'"
        ) from None
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return figure, [figure.add_subplot(1, columns, i + 1) for i in range(columns)]


def _suptitle(figure: Any, text: str) -> None:
    """The figure's title, wrapped at spaces until it is no wider than the figure (a title wider
    than its figure is cut at both sides: constrained layout makes room above, never beside)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    title = figure.suptitle(text)
    renderer = FigureCanvasAgg(figure).get_renderer()
    width = len(text)
    while title.get_window_extent(renderer).width > 0.95 * figure.bbox.width and width > 10:
        width -= 5
        title.set_text(textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False))


def mean_band(runs: Sequence[Series]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) over runs at every step any run logged; each step's statistics use the
    runs that have it."""
    values: dict[int, list[float]] = {}
    for series in runs:
        for step, value in series:
            values.setdefault(int(step), []).append(float(value))
    steps = np.array(sorted(values))
    mean = np.array([np.mean(values[s]) for s in steps])
    std = np.array([np.std(values[s]) for s in steps])
    return steps, mean, std


def _band(
    ax: Any, x: np.ndarray, mean: np.ndarray, std: np.ndarray, label: str, color: str
) -> None:
    if len(x) == 1:  # a band needs two points
        ax.errorbar(x, mean, yerr=std, color=color, label=label, marker="o", capsize=4)
        return
    ax.plot(x, mean, color=color, label=label, marker="." if len(x) < 20 else None)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)


def _color(index: int) -> str:
    return f"C{index % 10}"


def curves_figure(
    task: str,
    scores: dict[str, list[Series]],
    aux: dict[str, list[Series]],
    score_label: str,
    aux_label: str = "",
) -> Any:
    """Evaluation score and auxiliary loss (Primal's KSVD loss) against steps, one line (mean)
    and band (± std over seeds) per config, and every seed's last score as a dot (a bimodal or
    skewed spread shows there); configs whose kinds have no auxiliary loss are left out of its
    panel. aux_label: the tags it plots."""
    figure, (left, right) = _figure(11.0, 4.0, columns=2)
    for i, (config, runs) in enumerate(scores.items()):
        if any(runs):
            label = f"{config} ({len(runs)} seed{'s' * (len(runs) > 1)})"
            _band(left, *mean_band(runs), label, _color(i))
            last = np.array([run[-1] for run in runs if len(run)], dtype=np.float64)
            left.plot(last[:, 0], last[:, 1], "o", color=_color(i), markersize=4, alpha=0.8)
        if aux.get(config):
            steps, mean, std = mean_band(aux[config])
            _band(right, steps, mean, std, config, _color(i))
            if (mean - std > 0).all():
                right.set_yscale("log")
    _suptitle(figure, task)
    left.set(title="evaluation", xlabel="training step", ylabel=score_label)
    right.set(title="auxiliary loss", xlabel="training step", ylabel=aux_label)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    return figure


def _spectrum_axes(ax: Any, curves: dict[str, list[np.ndarray]], title: str) -> None:
    for i, (label, runs) in enumerate(curves.items()):
        if not runs:
            continue
        stacked = np.stack(runs)
        x = np.arange(1, stacked.shape[1] + 1)
        _band(ax, x, stacked.mean(0), stacked.std(0), label, _color(i))
    ax.set(
        title=title, xlabel="number of singular values", ylabel="cumsum(σ) / sum(σ)", ylim=(0, 1.02)
    )
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="lower right")


def spectrum_figure(
    curves: dict[str, list[np.ndarray]], title: str, size: tuple[float, float] = (5.0, 4.0)
) -> Any:
    """One block: a normalised cumulative singular-value curve per label (mean, band over runs)."""
    figure, (ax,) = _figure(*size)
    _spectrum_axes(ax, curves, title)
    return figure


def spectra_figure(task: str, blocks: list[tuple[str, dict[str, list[np.ndarray]]]]) -> Any:
    """Every block of a task side by side: blocks is [(title, {config: [curve per seed]})]."""
    figure, axes = _figure(4.5 * len(blocks), 4.0, columns=len(blocks))
    for ax, (title, curves) in zip(axes, blocks, strict=True):
        _spectrum_axes(ax, curves, title)
    _suptitle(figure, f"{task}: attention output spectrum on fixed dataset windows")
    return figure


CurvePoints = tuple[np.ndarray, np.ndarray, np.ndarray, float | None]  # conditioning.curve_points


def conditioning_figure(panels: dict[str, list[CurvePoints]], title: str, reference: Any) -> Any:
    """Achieved against desired return, a panel per label (DT, Primal-DT, ...) side by side with a
    line and band (the episodes' spread) per run, the diagonal where achieved equals the target,
    and the best episode return of the training data."""
    figure, axes = _figure(4.5 * len(panels), 4.2, columns=len(panels))
    unit = "normalised return" if reference is not None else "return"
    for i, (ax, (label, runs)) in enumerate(zip(axes, panels.items(), strict=True)):
        low, high = np.inf, -np.inf
        for j, (targets, mean, std, best) in enumerate(runs):
            _band(
                ax,
                targets,
                mean,
                std,
                f"{label} ({len(runs)} run{'s' * (len(runs) > 1)})" if j == 0 else "_",
                _color(i),
            )
            low, high = min(low, targets.min(), mean.min()), max(high, targets.max(), mean.max())
            if best is not None:
                ax.axhline(
                    best,
                    color="gray",
                    linestyle=":",
                    linewidth=1,
                    label="best return in the dataset" if j == 0 else "_",
                )
        ax.plot(
            [low, high],
            [low, high],
            color="black",
            linestyle="--",
            linewidth=1,
            label="achieved = target",
        )
        ax.set(title=label, xlabel=f"target ({unit})", ylabel=f"achieved ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _suptitle(figure, title)
    return figure


def interval_figure(
    title: str,
    metrics: Sequence[str],
    points: dict[str, Sequence[float]],
    intervals: dict[str, np.ndarray | None],
    xlabel: str,
) -> Any:
    """A panel per metric, a row per label: its point estimate (a black line) and its interval (a
    bar from intervals[label][0, metric] to [1, metric]; none where intervals[label] is None), as
    rliable's plot_interval_estimates draws them, without pyplot or seaborn."""
    labels = list(points)
    figure, axes = _figure(3.2 * len(metrics), 1.8 + 0.5 * len(labels), columns=len(metrics))
    for j, (ax, metric) in enumerate(zip(axes, metrics, strict=True)):
        for i, label in enumerate(labels):
            interval = intervals.get(label)
            if interval is not None:
                low, high = interval[0][j], interval[1][j]
                ax.barh(i, high - low, left=low, height=0.6, color=_color(i), alpha=0.7)
            ax.vlines(points[label][j], i - 0.3, i + 0.3, color="black", linewidth=2)
        ax.set(title=metric, xlabel=xlabel, ylim=(-0.6, len(labels) - 0.4))
        ax.set_yticks(range(len(labels)), labels if j == 0 else [])
        ax.grid(axis="x", alpha=0.3)
    _suptitle(figure, title)
    return figure


def difference_figure(
    title: str,
    rows: Sequence[tuple[str, float, tuple[float, float], tuple[float, float] | None]],
    lines: dict[str, float],
) -> Any:
    """A forest plot, a row per (label, point, interval, wider interval or None): the interval as a
    thick bar, the wider one as a thin line through it, the point as a dot; a vertical line per
    named value in lines (0, a published gap)."""
    figure, (ax,) = _figure(6.4, 1.4 + 0.42 * len(rows))
    for i, (_, point, (low, high), wider) in enumerate(rows):
        y = len(rows) - 1 - i  # the first row on top
        if wider is not None:
            ax.hlines(y, wider[0], wider[1], color=_color(0), linewidth=1)
        ax.hlines(y, low, high, color=_color(0), linewidth=5, alpha=0.7)
        ax.plot([point], [y], "o", color="black", markersize=4)
    for i, (name, value) in enumerate(lines.items()):
        ax.axvline(value, color="grey", linestyle="-" if i == 0 else "--", linewidth=1, label=name)
    ax.set_yticks(range(len(rows)), [label for label, *_ in reversed(rows)])
    ax.set(xlabel="difference in normalised score", ylim=(-0.6, len(rows) - 0.4))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    _suptitle(figure, title)
    return figure


def profile_figure(
    title: str,
    taus: np.ndarray,
    profiles: dict[str, np.ndarray],
    bands: dict[str, np.ndarray | None],
) -> Any:
    """Performance profiles: per label, the fraction of runs with a score above τ, against τ, with
    a band from bands[label][0] to [1] where it is not None."""
    figure, (ax,) = _figure(6.0, 4.2)
    for i, (label, profile) in enumerate(profiles.items()):
        ax.plot(taus, profile, color=_color(i), label=label)
        band = bands.get(label)
        if band is not None:
            ax.fill_between(taus, band[0], band[1], color=_color(i), alpha=0.2, linewidth=0)
    ax.set(
        xlabel="normalised score τ", ylabel="fraction of runs with score > τ", ylim=(-0.02, 1.02)
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _suptitle(figure, title)
    return figure


def save(figure: Any, path: Path) -> Path:
    figure.savefig(path)
    return path


def figure_image(figure: Any) -> np.ndarray:
    """The figure as an (H, W, 3) uint8 array, for SummaryWriter.add_image(dataformats="HWC")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
