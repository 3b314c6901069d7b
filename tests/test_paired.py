"""Paired differences and power (primal_dt/tools/paired.py): the differences and their interval
against scipy's paired t-test, the power against a simulation of the test itself, the seeds a
difference needs, the normality warning, and the report's sentences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from primal_dt.tools.paired import (
    POWER,
    TARGET,
    detectable,
    holm,
    last_quarter_differences,
    over_tasks_sentence,
    paired_differences,
    paired_over_tasks,
    seeds_for,
    sentence,
    std_upper,
    t_test_power,
)
from primal_dt.tools.report_comparisons import (
    LAST_QUARTER_HEADING,
    LAST_QUARTER_OVER_TASKS_HEADING,
    comparisons_section,
    last_quarter_section,
)
from primal_dt.tools.runs import Row, RunSummary


def row(task: str, config: str, per_seed: dict[int, float | None]) -> Row:
    seeds = sorted(per_seed)
    final = [v for s in seeds if (v := per_seed[s]) is not None]
    return Row(
        task,
        config,
        seeds,
        final,
        final,
        [100] * len(seeds),
        True,
        [],
        [],
        per_seed=[per_seed[s] for s in seeds],
    )


def test_paired_differences_are_scipys_paired_t_test() -> None:
    base = {0: 40.0, 1: 35.0, 2: 50.0, 3: 45.0, 4: 38.0}
    mine = {0: 42.0, 1: 36.5, 2: 49.0, 3: 48.0, 4: None, 5: 60.0}  # seed 4 unfinished, 5 alone
    (paired,) = paired_differences([row("t", "b", base), row("t", "a", mine)], "a", "b")
    assert paired.seeds == [0, 1, 2, 3] and paired.differences == [2.0, 1.5, -1.0, 3.0]
    expected = stats.ttest_rel([42.0, 36.5, 49.0, 48.0], [40.0, 35.0, 50.0, 45.0])
    low, high = expected.confidence_interval(0.95)
    assert paired.interval == pytest.approx((low, high), rel=1e-12)
    assert paired.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    assert paired.mean == pytest.approx(1.375)


@pytest.mark.parametrize("pairs", [3, 5, 20])
def test_the_detectable_difference_is_detected_with_80_percent_power(pairs: int) -> None:
    """The t-test itself, simulated: at the detectable difference it rejects in 80% of 20,000
    experiments (the binomial spread is 0.3%), at a third of it far less often."""
    std = 7.0
    smallest = detectable(std, pairs)
    assert smallest is not None and t_test_power(smallest, std, pairs) == pytest.approx(POWER)
    rng = np.random.default_rng(0)
    for difference, low, high in ((smallest, 0.79, 0.81), (smallest / 3, 0.0, 0.4)):
        samples = rng.normal(difference, std, size=(20_000, pairs))
        rejected = stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05
        assert low < rejected.mean() < high, (difference, rejected.mean())


def test_seeds_for_a_difference_are_the_fewest_that_reach_the_power() -> None:
    for std in (2.0, 8.0, 30.0):
        n = seeds_for(std)
        assert n is not None and t_test_power(TARGET, std, n) >= POWER
        assert n == 2 or t_test_power(TARGET, std, n - 1) < POWER
    assert seeds_for(0.0) == 2 and detectable(0.0, 5) == 0.0 and detectable(3.0, 1) is None
    # Far out in the tail (a tiny spread), where scipy's noncentral t gives NaN: still an answer.
    tiny = detectable(1e-9, 5)
    assert tiny is not None and 0 < tiny < 1e-8 and t_test_power(1.0, 1e-9, 5) == 1.0


def test_sentences_say_the_power_and_doubt_a_skewed_spread() -> None:
    base = {s: 50.0 for s in range(6)}
    close = {0: 51.0, 1: 49.0, 2: 50.5, 3: 49.5, 4: 50.2, 5: 49.8}
    (paired,) = paired_differences([row("t", "b", base), row("t", "a", close)], "a", "b")
    said = sentence(paired)
    assert "no difference detected" in said and "paired seeds" in said
    assert f"the study could detect {paired.detectable:.1f} points at 80% power (up to " in said
    assert f"5 points would need {seeds_for(paired.std)} seeds" in said  # type: ignore[arg-type]
    assert "reject normality" not in said
    skewed = {0: 50.0, 1: 50.1, 2: 49.9, 3: 50.0, 4: 50.1, 5: 90.0}  # one seed far off
    (paired,) = paired_differences([row("t", "b", base), row("t", "a", skewed)], "a", "b")
    assert "the differences reject normality, Shapiro-Wilk p = " in sentence(paired)
    above = {s: 60.0 + s % 2 for s in range(6)}
    (paired,) = paired_differences([row("t", "b", base), row("t", "a", above)], "a", "b")
    assert ": a scores above b;" in sentence(paired)


def test_over_tasks_the_mean_difference_and_what_it_could_detect() -> None:
    rng = np.random.default_rng(1)
    rows = []
    for task, spread in (("t1", 2.0), ("t2", 10.0), ("t3", 5.0)):
        base = dict(enumerate(np.round(rng.normal(50, spread, 5) * 2) / 2))  # exact sums
        rows += [row(task, "b", base), row(task, "x", {s: v + 3.0 for s, v in base.items()})]
    rows[-1].per_seed[0] += 1.0  # type: ignore[operator]
    over = paired_over_tasks(paired_differences(rows, "x", "b"))
    assert over is not None and over.tasks == ["t1", "t2", "t3"] and over.pairs == 5
    assert over.point == pytest.approx(3.0 + 1.0 / 15)
    assert over.interval[0] <= over.point <= over.interval[1]
    # Each seed's mean over the tasks (only t3's seed 0 differs), and Student's t on their mean.
    seed_means = [3.0 + 1.0 / 3, 3.0, 3.0, 3.0, 3.0]
    expected = stats.ttest_1samp(seed_means, 0.0)
    assert over.interval == pytest.approx(tuple(expected.confidence_interval(0.95)), rel=1e-12)
    assert over.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    std = float(np.std(seed_means, ddof=1))
    assert over.detectable == pytest.approx(detectable(std, 5))
    assert over.detectable_at_most == pytest.approx(detectable(std_upper(std, 5), 5))
    assert over.seeds_for_target == seeds_for(std)
    section = comparisons_section(rows, "b")
    assert (
        "x − b on t1: +3.0 [+3.0, +3.0] over 5 paired seeds (p = 0.000, Holm-adjusted over the 3 per-task tests 0.000): x scores above b"
        in section
    )
    assert "x − b over 3 tasks (5 paired seeds each): +3.1" in section
    assert (
        "(Student's t on each seed's mean over the tasks, p = 0.000): x scores above b" in section
    )


def test_holm_keeps_the_family_wise_level_and_the_sentences_say_both() -> None:
    """Holm's step-down adjustment against a hand computation; a per-task interval that excludes
    0 on its own is no claim where the adjusted p is 5% or more, and the sentence says so."""
    assert holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    assert holm([]) == [] and holm([0.5]) == [0.5] and holm([0.6, 0.9]) == [1.0, 1.0]
    # The spread of the std: at 5 pairs its 95% interval reaches 2.87 times the measured one.
    assert std_upper(1.0, 5) == pytest.approx(np.sqrt(4 / stats.chi2.ppf(0.025, 4)))
    assert 2.8 < std_upper(1.0, 5) < 2.9
    base = {s: 50.0 for s in range(5)}
    rows = [row(f"t{i}", "b", base) for i in range(3)]
    rows.append(row("t0", "x", {0: 52.0, 1: 53.0, 2: 51.0, 3: 52.5, 4: 51.5}))  # p = 0.005
    rows.append(row("t1", "x", {0: 51.0, 1: 53.0, 2: 51.0, 3: 52.5, 4: 50.5}))  # p = 0.030
    rows.append(row("t2", "x", {0: 48.0, 1: 53.0, 2: 49.0, 3: 52.0, 4: 50.0}))  # p = 0.53
    pairs = paired_differences(rows, "x", "b")
    p_values = [p.p_value for p in pairs]
    assert p_values[0] < 0.05 / 3 and 0.05 / 2 < p_values[1] < 0.05 and p_values[2] > 0.5
    adjusted = holm(p_values)
    said = comparisons_section(rows, "b")
    assert f"Holm-adjusted over the 3 per-task tests {adjusted[0]:.3f}): x scores above b" in said
    assert (
        f"Holm-adjusted over the 3 per-task tests {adjusted[1]:.3f}): no difference detected at "
        "a family-wise 5% (the interval alone excludes 0)" in said
    )


def test_last_quarter_pairs_each_runs_mean_over_its_late_evaluations() -> None:
    """Each run's mean over steps 600 < s <= 800 of 800 (its evaluations at 700 and the final
    800), paired by seed, against a direct computation; a seed without a late evaluation, and
    its partner, are left out; the section's sentence is the paired one with its power."""

    def run(config: str, seed: int, curve: dict[int, float]) -> RunSummary:
        summary = RunSummary(Path(f"{config}{seed}"), "t", config, seed, 800, ["softmax"])
        summary.scores = sorted(curve.items())
        return summary

    base = [run("b", s, {400: 9.0, 600: 30.0, 700: 10.0 + s, 800: 12.0 + 2 * s}) for s in range(4)]
    late = [run("a", s, {600: 50.0, 700: 14.0 + s, 800: 13.0 + s * s}) for s in range(3)]
    early = run("a", 3, {400: 99.0})  # evaluated only before the last quarter
    (paired,) = last_quarter_differences([*late, early, *base], "a", "b")
    expected = [(14.0 + s + 13.0 + s * s) / 2 - (10.0 + s + 12.0 + 2 * s) / 2 for s in range(3)]
    assert paired.task == "t" and paired.seeds == [0, 1, 2]
    assert paired.differences == pytest.approx(expected)
    section = last_quarter_section([*late, early, *base], "b")
    assert (
        section.startswith(LAST_QUARTER_HEADING)
        and "the final one included: 2 per run here" in section
    )
    assert f"- {sentence(paired)}" in section.splitlines()
    assert last_quarter_section(base, "b") == "" and last_quarter_section(late, None) == ""


def test_over_tasks_the_last_quarters_mean_difference_has_a_heading_of_its_own() -> None:
    """Two tasks of 3 seeds: the last quarter's paired differences over tasks, each task weighed
    alike, against the quarter means by hand; with one task there is no such heading."""

    def run(task: str, config: str, seed: int, late: float) -> RunSummary:
        summary = RunSummary(Path(f"{task}{config}{seed}"), task, config, seed, 800, ["softmax"])
        summary.scores = [(400, 0.0), (700, late), (800, late + 2.0 * seed)]
        return summary

    runs = [
        run(task, config, seed, 10.0 * (config == "a") + shift + seed)
        for task, shift in (("t1", 0.0), ("t2", 5.0))
        for config in ("a", "b")
        for seed in range(3)
    ]
    over = paired_over_tasks(last_quarter_differences(runs, "a", "b"))
    assert over is not None and over.tasks == ["t1", "t2"] and over.point == pytest.approx(10.0)
    section = last_quarter_section(runs, "b")
    after = section.split(f"\n{LAST_QUARTER_OVER_TASKS_HEADING}\n", 1)[1]
    assert f"- {over_tasks_sentence(over)}" in after.splitlines()
    assert "a − b over 2 tasks (3 paired seeds each): +10.0" in after
    one_task = [summary for summary in runs if summary.task == "t1"]
    assert LAST_QUARTER_OVER_TASKS_HEADING not in last_quarter_section(one_task, "b")
