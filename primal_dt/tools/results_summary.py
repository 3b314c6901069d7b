"""The README's summary of the results page (between its results-summary markers), from the page's
matched DT-against-Primal-DT sections as scripts/results.py wrote them, one per quality of dataset
(and the tasks of a quality made apart), with the studies of their own said apart.

This reads the page's rendered sentences: the sections made before the studies kept their data
(report.json, training.jsonl) have nothing else to be read from. It goes when the studies are made
again from per-run data kept in the repository, and the summary becomes a table made from that
data (the results issue, round four).
"""

from __future__ import annotations

import re

from primal_dt.tools.report_comparisons import (
    LAST_QUARTER_HEADING,
    LAST_QUARTER_OVER_TASKS_HEADING,
    OVER_TASKS_HEADING,
)
from primal_dt.tools.study_datasets import RECORDED

# The results page's section for a study on the datasets of one quality (docs/results.md).
SECTIONS = {
    "medium": "results",
    "medium-replay": "results-replay",
    "medium-expert": "results-expert",
}
# Studies of their own, said apart in the README's summary and not counted among its datasets.
STUDIES_APART = {
    "results-attentions": (
        "The seven attentions of the paper's table, in the matched config's last block,"
    ),
    "results-init": "Primal's two initialisations of We and Wr,",
}


def summary(page: str) -> str:
    """The README's two lines, from the sentences of the results page's matched DT-against-
    Primal-DT sections (one per quality of dataset): on how many datasets the scores differ, and
    on how many the Primal block's rank_90 is below the same block's with softmax. A replication
    (a results-replication* section: new seeds, chosen after a study) is said apart, not counted.
    """
    qualities, envs = "|".join(SECTIONS.values()), "|".join(RECORDED)
    # One section per quality, and <section>-<env>...: some tasks of a quality, made apart.
    studies = _sections_named(page, rf"(?:{qualities})(?:-(?:{envs})[\w-]*)?")
    sentences = _primal_sentences(studies, "Comparisons per task")
    seeds = sorted({int(n) for text in studies for n in re.findall(r" x (\d+) seeds\.", text)})
    late = _primal_sentences(studies, LAST_QUARTER_HEADING.removeprefix("## "))
    late_over = LAST_QUARTER_OVER_TASKS_HEADING.removeprefix("## ")
    verdict = _verdict(sentences, late)
    power = "".join(  # with what the study could detect, and the same over the last quarter
        f" Over {_tasks_of(text)}: {_with_last_quarter(s, _primal_sentences([text], late_over))}"
        for text in studies
        for s in _primal_sentences([text], OVER_TASKS_HEADING.removeprefix("## "))
    )
    # Replications (sections results-replication*): new seeds, decided after a study, apart.
    again = _sections_named(page, r"results-replication[\w-]*")
    replicated = "".join(
        f" Again with new seeds: {s}" for s in _primal_sentences(again, "Comparisons per task")
    )
    matched = [s for s in _primal_sentences(studies, "Attention spectrum") if ", block " in s]
    lower = [s for s in matched if "(Primal) has a lower rank_90 than" in s]
    spectra = (
        f" The Primal block's attention output has a lower rank_90 than the same block's with "
        f"softmax on {len(lower)} of the {len(matched)} (beyond the spread over seeds)."
        if matched
        else ""
    )
    apart = "".join(_said_apart(page, name, label) for name, label in STUDIES_APART.items())
    return (
        f"Matched DT against Primal-DT (only the last block's attention differs) on "
        f"{len(sentences)} of the datasets recorded here{_overlap(sentences)}, "
        f"{' or '.join(map(str, seeds))} seeds "
        f"each, at a CPU budget: {verdict}.{replicated}{power}{spectra}{apart} "
        "Per-task scores, intervals and the paper's table: [Results](docs/results.md)."
    )


def _verdict(sentences: list[str], late: list[str]) -> str:
    """On how many of the comparisons' sentences a difference is claimed, each claimed one with
    the same pair's over the last quarter (late) beside it; or why none is."""
    found = [s for s in sentences if " scores above " in s or " scores below " in s]
    if not found:
        why = _why_none(sentences)
        return f"no difference in score detected on any of the {len(sentences)} ({why})"
    # Sections made since the claims are Holm-corrected hold at a family-wise 5% already.
    chance = "" if any("Holm-adjusted" in s for s in sentences) else _by_chance(len(sentences))
    return f"a difference on {len(found)} of {len(sentences)}{chance}: " + " ".join(
        _with_last_quarter(s, late) for s in found
    ).removesuffix(".")


def _said_apart(page: str, name: str, label: str) -> str:
    """A study of its own (section name, not counted among the datasets): each config against its
    baseline, with the range of what its comparisons could detect; "" until it is made."""
    text = _section(page, name)
    sentences = _primal_sentences([text], "Comparisons per task")
    if not sentences:
        return ""
    late = _primal_sentences([text], LAST_QUARTER_HEADING.removeprefix("## "))
    seeds = re.search(r" x (\d+) seeds\.", text)
    baseline = re.search(r" − ([\w.-]+) on ", sentences[0])
    detectable = sorted(
        float(d) for d in re.findall(r"could detect ([\d.]+) points", " ".join(sentences))
    )
    power = ""
    if detectable:
        low, high = detectable[0], detectable[-1]
        span = f"{low:.1f}" if low == high else f"{low:.1f} to {high:.1f}"
        power = f"; the comparisons could detect {span} points at 80% power"
    return (
        f" {label} on {_tasks_of(text)}, {seeds[1] if seeds else 'its'} seeds, each against "
        f"{baseline[1] if baseline else 'its baseline'}: {_verdict(sentences, late)}{power}."
    )


def _sections_named(page: str, pattern: str) -> list[str]:
    """The texts of the page's non-empty sections whose whole name matches pattern, in order."""
    names = re.findall(rf"<!-- ({pattern}):start -->", page)
    return [text for name in names if (text := _section(page, name))]


def _primal_sentences(studies: list[str], heading: str) -> list[str]:
    """The studies' sentences under heading, DT against Primal-DT alone (matched-bc's left out)."""
    return [s for text in studies for s in _sentences(text, heading) if "matched-bc" not in s]


def _with_last_quarter(claimed: str, late: list[str]) -> str:
    """A claimed difference's sentence with the same pair's over the runs' last-quarter
    evaluations (where its section has them): whether it holds before the final evaluation."""
    head = claimed.split(": ", 1)[0] + ": "  # "config − baseline on task: " (or "over n tasks")
    same = [s.removeprefix(head).split("; the study")[0] for s in late if s.startswith(head)]
    if not same:
        return claimed
    return f"{claimed.removesuffix('.')}; over each run's last-quarter evaluations: {same[0]}."


def _by_chance(comparisons: int) -> str:
    """How often, with no true difference on any task, at least one of several independent 95%
    intervals excludes 0 (1 − 0.95^n): what one claimed difference among them is worth."""
    if comparisons < 2:
        return ""
    chance = 1 - 0.95**comparisons
    return (
        f" (with no true difference on any, at least one of {comparisons} intervals at 95% "
        f"would exclude 0 in {chance:.0%} of studies)"
    )


def _tasks_of(study: str) -> str:
    """The tasks a study's first line names ("3 tasks (a, b, c) x ..."), or "tasks"."""
    found = re.search(r" \d+ tasks? \(([^)]*)\) x ", study)
    return found[1] if found else "tasks"


def _why_none(sentences: list[str]) -> str:
    """Why no difference was claimed: paired sentences' intervals on the difference hold 0;
    unpaired ones' intervals of the two configs overlap."""
    if any("the interval alone excludes 0" in s for s in sentences):
        return "none survives Holm's correction over the per-task tests"
    if all(" paired seeds" in s for s in sentences):
        return "each paired difference's 95% interval holds 0"
    return "95% intervals overlap"


def _overlap(sentences: list[str]) -> str:
    """Where the count holds a medium-expert dataset and its medium one: the first contains the
    second (D4RL's way), so they are not independent, and the count says so."""
    tasks = {found[1] for s in sentences if (found := re.search(r" on ([\w.-]+?)(?=[: ]|$)", s))}
    both = sorted(
        t for t in tasks if t.endswith("-medium-expert") and t.removesuffix("-expert") in tasks
    )
    if not both:
        return ""
    return (
        f" ({len(both)} of them medium-expert ones that hold a medium one of the count too: "
        f"{', '.join(both)}; not independent of it)"
    )


def _section(page: str, name: str) -> str:
    """The text between the page's markers of section name, or "" where it has none."""
    found = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", page, re.S)
    return found.group(1) if found else ""


def _sentences(text: str, heading: str) -> list[str]:
    """The bullet sentences under the heading (of any level) named heading."""
    found = re.search(rf"(?m)^#+ {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    return (
        [line[2:] for line in found.group(1).splitlines() if line.startswith("- ")] if found else []
    )
