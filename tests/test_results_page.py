"""The results page holds what its data says: each section whose runs the clone keeps
(results-data/<section>/) is made again from them alone and compared with the page, and every
number a paragraph written by hand quotes is one its sections print (docs/results.md's
`<!-- hand SECTION[,SECTION...] -->` ... `<!-- /hand -->` blocks)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

from primal_dt.tools import study as study_module
from primal_dt.tools.corl import corl_scores
from primal_dt.tools.report import write_report
from primal_dt.tools.report_data import read_report_data
from primal_dt.tools.results_page import first_paragraph, over_tasks_text, section_text

PAGE = ROOT / "docs" / "results.md"
HAND = re.compile(r"<!-- hand ([\w,-]+) -->\n(.*?)<!-- /hand -->", re.S)
# A number with a fraction (a measured one, not a count), with its sign where it has one: a
# signed number is matched with its sign, an unsigned one with or without.
DECIMAL = re.compile(r"(?<![\d.])([+\-−]?)(\d+\.\d+)")


def section(page: str, name: str) -> str | None:
    """The text between the page's markers of section name (None where it has none)."""
    name = re.escape(name)
    found = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", page, re.S)
    return found.group(1) if found else None


def unquoted(page: str) -> list[tuple[str, str]]:
    """(sections, number) for every decimal a hand block quotes that none of its sections print,
    and (section, "no such section") for a section it names that the page does not hold."""
    missing = []
    for names, text in HAND.findall(page):
        texts = {name: section(page, name) for name in names.split(",")}
        missing += [(name, "no such section") for name, found in texts.items() if found is None]
        printed = DECIMAL.findall("".join(found or "" for found in texts.values()))
        signed = {sign.replace("−", "-") + number for sign, number in printed}
        bare = {number for _, number in printed}
        for sign, number in DECIMAL.findall(text):
            if (sign.replace("−", "-") + number not in signed) if sign else (number not in bare):
                missing.append((names, sign + number))
    return missing


def test_a_hand_paragraph_quotes_only_numbers_its_sections_print() -> None:
    page = PAGE.read_text()
    assert HAND.search(page), "the page marks its paragraphs written by hand"
    assert unquoted(page) == []


def test_a_drifted_or_unsourced_number_in_a_hand_paragraph_is_found() -> None:
    page = (
        "<!-- a:start -->\n- x − y on t: -3.4 [-5.5, -1.2]\n<!-- a:end -->\n"
        "<!-- b:start -->\n12.5 and 0.31\n<!-- b:end -->\n"
        "<!-- hand a,b -->\nx scores below y, -3.4 [-5.5, -1.2], and 0.31 of 12.6.\n<!-- /hand -->\n"
        "<!-- hand b -->\n-3.4 is a's, not b's.\n<!-- /hand -->"
    )
    assert unquoted(page) == [("a,b", "12.6"), ("b", "-3.4")]
    flipped = page.replace("x scores below y, -3.4", "x scores above y, +3.4")
    assert ("a,b", "+3.4") in unquoted(flipped)
    assert unquoted(page.replace("<!-- hand b -->", "<!-- hand c -->")) == [
        ("a,b", "12.6"),
        ("c", "no such section"),
        ("c", "-3.4"),
    ]


def test_every_kept_section_is_made_again_from_its_data_alone(tmp_path: Path) -> None:
    """`primal-dt report results-data/<section>` writes the section the page shows, below its
    first line (what was run, where and when: the study's, not the report's)."""
    kept, page = study_module.kept_sections(), PAGE.read_text()
    assert kept, "the clone keeps the runs of the sections made since they keep them"
    for data in kept:
        write_report(data, tmp_path / data.name)
        made = read_report_data(tmp_path / data.name / "report.json")
        text = section_text(made, lambda name, at=data.name: f"../scripts/figures/{at}_{name}")
        shown = section(page, data.name)
        assert shown is not None, data.name
        assert shown.split("\n\n", 1)[1].strip() == text.strip(), data.name


COMBINED = re.compile(
    r"--combine` \(([\w-]+)\) .*?from the runs of the sections made apart below \(([^)]*)\)"
)


def test_every_combined_section_is_made_again_from_its_tasks_kept_data(tmp_path: Path) -> None:
    """A section made with `results.py --combine` (what its tasks' sections say together) from
    sections that keep their runs is the report of those runs read together; the medium study's
    first paragraph too. (Combined sections made before sections kept their runs are the
    statistics of their day, until made again.)"""
    page = PAGE.read_text()
    combined = {
        name: [study_module.RESULTS_DATA / part for part in parts.split(", ")]
        for name, parts in COMBINED.findall(page)
    }
    checked = {name: kept for name, kept in combined.items() if all(p.is_dir() for p in kept)}
    assert checked, "the page holds a section combined from its tasks' kept runs"
    for name, kept in checked.items():
        write_report(kept, tmp_path / name)
        made = read_report_data(tmp_path / name / "report.json")
        text = over_tasks_text(made, lambda figure, at=name: f"../scripts/figures/{at}_{figure}")
        shown = section(page, name)
        assert shown is not None, name
        assert shown.split("\n\n", 1)[1].strip() == text.strip(), name
        if name == study_module.SECTIONS["medium"]:
            first = first_paragraph(made, corl_scores())
            assert section(page, "results-first") == f"{first}\n"
