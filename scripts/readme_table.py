"""Put a benchmark's table into README.md between <!-- NAME:start --> and <!-- NAME:end -->."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def write_readme_section(name: str, text: str, readme: Path = README) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    content = readme.read_text()
    block = f"{start}\n{text.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(content):
        raise SystemExit(
            f"{readme} has no {start} ... {end} markers; add them where the table goes"
        )
    readme.write_text(pattern.sub(lambda _: block, content))
    print(f"wrote the {name} table to {readme}")


def publish(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    """Print a benchmark's Markdown table (header: '| a | b |' with alignment row included) and,
    with write, put it into the README."""
    table = "\n".join([caption, "", header, *rows])
    print(table)
    if write:
        write_readme_section(name, table)


def publish_so_far(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    """With write, put the rows measured so far into the README, marked as such: a run cut short
    (scripts/gpu_check.sh's time limits) still leaves what it measured; publish replaces it."""
    if write:
        partial = f"{caption} (the rows measured before the run ended)"
        write_readme_section(name, "\n".join([partial, "", header, *rows]))
