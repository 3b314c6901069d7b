"""Put a script's table into the documentation between <!-- NAME:start --> and <!-- NAME:end -->.

The markers may stand in README.md and in any page of docs/; every file that holds them is
written, so a table shown in two places stays one table."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def write_section(name: str, text: str, files: list[Path] | None = None) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    written = []
    for path in files if files is not None else documents():
        content = path.read_text()
        if pattern.search(content):
            path.write_text(pattern.sub(lambda _: block, content))
            written.append(path)
    if not written:
        raise SystemExit(f"no document holds {start} ... {end}; add them where the table goes")
    print(f"wrote the {name} table to {', '.join(str(p.relative_to(ROOT)) for p in written)}")


def publish(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    """Print a benchmark's Markdown table (header: '| a | b |' with alignment row included) and,
    with write, put it into the documentation."""
    table = "\n".join([caption, "", header, *rows])
    print(table)
    if write:
        write_section(name, table)


def publish_so_far(name: str, caption: str, header: str, rows: list[str], write: bool) -> None:
    """With write, put the rows measured so far into the documentation, marked as such: a run cut short
    (scripts/gpu_check.sh's time limits) still leaves what it measured; publish replaces it."""
    if write:
        partial = f"{caption} (the rows measured before the run ended)"
        write_section(name, "\n".join([partial, "", header, *rows]))
