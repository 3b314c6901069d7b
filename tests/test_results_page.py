"""The results page holds what its data says: every number a paragraph written by hand quotes is
one its sections print (docs/results.md's `<!-- hand SECTION[,SECTION...] -->` ... `<!-- /hand
-->` blocks)."""

from __future__ import annotations

import re

from conftest import ROOT

PAGE = ROOT / "docs" / "results.md"
HAND = re.compile(r"<!-- hand ([\w,-]+) -->\n(.*?)<!-- /hand -->", re.S)
DECIMAL = re.compile(r"\d+\.\d+")  # a number with a fraction: a measured one, not a count


def section(page: str, name: str) -> str:
    """The text between the page's markers of section name ("" where it has none)."""
    found = re.search(
        rf"<!-- {re.escape(name)}:start -->\n(.*?)<!-- {re.escape(name)}:end -->", page, re.S
    )
    return found.group(1) if found else ""


def unquoted(page: str) -> list[tuple[str, str]]:
    """(sections, number) for every decimal a hand block quotes that none of its sections print."""
    missing = []
    for names, text in HAND.findall(page):
        printed = set(DECIMAL.findall("".join(section(page, n) for n in names.split(","))))
        missing += [(names, n) for n in DECIMAL.findall(text) if n not in printed]
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
    assert unquoted(page) == [("a,b", "12.6"), ("b", "3.4")]
