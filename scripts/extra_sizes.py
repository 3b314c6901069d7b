"""The installed size of each extra of pyproject.toml: the files of the packages it adds beyond
primal-dt's own dependencies (read from importlib.metadata, in the environment this runs in, with
the extras installed). docs/install.md's size column comes from it.

    python scripts/extra_sizes.py
"""

from __future__ import annotations

import importlib.metadata as metadata
import os

from packaging.requirements import Requirement


def key(name: str) -> str:
    return name.lower().replace("_", "-")


def closure(requirements: list[str], known: set[str], missing: set[str] | None = None) -> set[str]:
    """The installed distributions these requirements pull in, leaving out those in known; the
    names of those not installed go into missing."""
    found: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = key(requirement.name)
        if name in found or name in known:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if missing is not None:
                missing.add(name)
            continue
        found.add(name)
        for text in distribution.requires or []:
            inner = Requirement(text)
            extras = requirement.extras or {""}
            if inner.marker is None or any(inner.marker.evaluate({"extra": e}) for e in extras):
                todo.append(inner)
    return found


def megabytes(names: set[str]) -> float:
    total = 0
    for name in names:
        distribution = metadata.distribution(name)
        for file in distribution.files or []:
            path = distribution.locate_file(file)
            total += os.path.getsize(path) if os.path.isfile(path) else 0
    return total / 1e6


def main() -> None:
    own = metadata.distribution("primal-dt")
    requirements = [Requirement(r) for r in own.requires or []]
    base_requirements = [str(r) for r in requirements if r.marker is None]
    base = closure(base_requirements, set()) | {"primal-dt"}
    print("| extra | packages beyond the base | MB installed |\n|---|---|---:|")
    for extra in own.metadata.get_all("Provides-Extra") or []:
        wanted = [
            f"{r.name}[{','.join(r.extras)}]" if r.extras else r.name
            for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": extra})
        ]
        missing: set[str] = set()
        added = closure(wanted, base, missing) - {"primal-dt"}
        absent = f" (not installed here: {', '.join(sorted(missing))})" if missing else ""
        print(f"| {extra} | {len(added)}{absent} | {megabytes(added):.0f} |")


if __name__ == "__main__":
    main()
