"""The documentation as a reader meets it: the README's length and links, every Python snippet of
the README and the docs run, and every `primal-dt` command line they show parses."""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from sphinx.pycode import ModuleAnalyzer

from primal_dt.cli import build_parser
from primal_dt.common import config

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(language: str) -> list[tuple[str, str]]:
    """(where, code) of every fenced block in that language, where = file:line."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", match.group(2)))
    return found


def command_lines(code: str) -> list[str]:
    """The `primal-dt ...` commands of a shell block, continuation lines joined, comments cut."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"&&|;|\|", line):
            part = part.strip()
            if part.startswith("primal-dt "):
                commands.append(part)
    return commands


def test_readme_is_an_entry_of_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"


def test_readme_links_point_to_files_of_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?://|#)([^)#]+)(?:#[^)]*)?\)", text)
    assert "docs/method.md" in targets  # the check reads links at all
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_extra_is_named_in_the_readme_and_described_on_the_install_page() -> None:
    """pyproject.toml's extras are the ones the README names and the install page's table holds,
    so an extra added or renamed without its documentation fails here."""
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    readme = (ROOT / "README.md").read_text()
    install = (ROOT / "docs" / "install.md").read_text()
    table = set(re.findall(r"^\| `([\w-]+)` \|", install, re.MULTILINE))
    assert "download" in extras
    assert table == extras, (
        f"docs/install.md's extras table: {sorted(table)}, pyproject: {sorted(extras)}"
    )
    unnamed = sorted(extra for extra in extras if f"`{extra}`" not in readme)
    assert not unnamed, f"README.md does not name the extras {unnamed}"


PYTHON = blocks("python")


@pytest.mark.parametrize("where,code", PYTHON, ids=[where for where, _ in PYTHON])
def test_python_snippets_run(where: str, code: str) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__snippet__"})


def test_the_readme_has_a_python_snippet() -> None:
    assert any(where.startswith("README.md") for where, _ in PYTHON)


COMMANDS = [(where, c) for where, code in blocks("bash") for c in command_lines(code)]


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w} {c[:40]}" for w, c in COMMANDS])
def test_shown_commands_parse(where: str, command: str) -> None:
    """The subcommand and every option exist, and the values have the types the parser wants."""
    argv = [word for word in shlex.split(command)[1:] if word != "..."]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code not in (0, None):  # --help and --version exit 0
            pytest.fail(f"{where}: `{command}` does not parse")


def test_commands_are_collected_from_readme_and_docs() -> None:
    places = {where.split(":")[0] for where, _ in COMMANDS}
    assert {"README.md", "docs/quickstart.md", "docs/training.md"} <= places


def test_a_command_that_does_not_parse_is_found() -> None:
    """The check above can fail: an option that does not exist does not parse."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--env", "hopper-medium", "--no-such-option"])


def test_every_config_key_says_what_it_means() -> None:
    """The configuration reference (docs/configuration.md) is generated from these comments."""
    docs = ModuleAnalyzer.for_module(config.__name__).find_attr_docs()
    sections = [
        config.Config,
        config.ModelConfig,
        config.TrainConfig,
        config.EvalConfig,
        config.DataConfig,
    ]
    undocumented = [
        f"{cls.__name__}.{field.name}"
        for cls in sections
        for field in dataclasses.fields(cls)
        if not docs.get((cls.__name__, field.name))
    ]
    assert not undocumented, f"config fields without a #: comment: {undocumented}"


def test_the_gpu_budget_table_states_the_scripts_limits() -> None:
    """docs/development.md's budget table and scripts/gpu_check.sh give the same limits (the dry
    run's in CPU seconds, the GPU's in seconds), the table's total is their sum, and its two
    parts are the script's; the steps left out of the parts are named as such."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    steps = re.findall(r'^step (\w+) "[^"]+" (\d+) (\d+)', script, re.MULTILINE)
    text = (ROOT / "docs" / "development.md").read_text()
    rows = [row.split("|") for row in re.findall(r"^\| \d \|.*$", text, re.MULTILINE)]
    assert len(rows) == 6 and len(steps) == 8
    seconds = [(int(r[7].split(",")[0]), int(r[4].split()[0])) for r in rows]  # (dry, GPU)
    assert seconds == [(int(dry), int(gpu)) for _, dry, gpu in steps[:6]]
    total = re.search(r"^\| \| \*\*all\*\* \|[^|]*\| \*\*(\d+) s\*\* \|", text, re.MULTILINE)
    assert total and int(total.group(1)) == sum(gpu for _, gpu in seconds)
    parts = [row[3].strip() for row in rows]
    words = " ".join(text.split())
    for part, keys in (("1", "pack,fast,layers"), ("2", "train,rest,eval")):
        assert ",".join(step[0] for step, p in zip(steps, parts, strict=False) if p == part) == keys
        assert f"--only {keys}" in script and f"--only {keys}" in words
    assert [step[0] for step in steps[6:]] == ["attention", "context"]
    assert "--only attention,context" in script and "--only attention,context" in words


def test_the_paper_grids_expected_time_is_the_cuda_tables() -> None:
    """The rates and hours that docs/reproducing.md and scripts/reproduce_paper.sh quote for the
    paper's grid (27 DT runs at the DT paper's size, 27 Primal-DT runs at the Primal paper's, 100k
    steps each), and the compiled/eager ratios benchmarks.md quotes, are the CUDA training table's."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    found = re.search(r"bench_train_cuda:start -->(.*)<!-- bench_train_cuda:end", text, re.DOTALL)
    assert found, "benchmarks.md lost its CUDA training table"
    table = found.group(1)
    rate = {}  # (size, mode) -> (DT steps/s, Primal-DT steps/s)
    for row in re.findall(r"^\| (?:DT|Primal) paper size .*$", table, re.MULTILINE):
        cells = [c.strip() for c in row.strip("|").split("|")]
        mode = "eager" if cells[2] == "eager" else "compiled"
        rate[cells[0].split()[0], mode] = (float(cells[3]), float(cells[4]))
    assert len(rate) == 4
    runs_of = {
        mode: (rate["DT", mode][0], rate["Primal", mode][1]) for mode in ("eager", "compiled")
    }
    hours = {m: 27 * 100_000 * (1 / dt + 1 / primal) / 3600 for m, (dt, primal) in runs_of.items()}
    eager, compiled = runs_of["eager"], runs_of["compiled"]
    quoted = [
        f"DT trains {eager[0]:.0f} steps/s at the DT paper's size and Primal-DT {eager[1]:.0f} at "
        f"the Primal paper's",
        f"take about {hours['eager']:.0f} hours",
        f"{compiled[0]:.0f} and {compiled[1]:.0f} steps/s",
        f"about {hours['compiled']:.0f} hours",
        f"about {hours['eager'] / 5:.0f} to {hours['eager'] / 3:.0f} hours",
    ]
    readme = [f"about {hours['eager']:.0f} hours", quoted[-1]]  # the README: the hours alone
    for path, figures in (
        (ROOT / "docs" / "reproducing.md", quoted),
        (ROOT / "scripts" / "reproduce_paper.sh", quoted),
        (ROOT / "README.md", readme),
    ):
        words = " ".join(path.read_text().replace("#", " ").split())
        missing = [q for q in figures if q not in words]
        assert not missing, f"{path.name} quotes other figures than the table's: {missing}"
    speedups = [
        rate[size, "compiled"][i] / rate[size, "eager"][i]
        for size in ("DT", "Primal")
        for i in (0, 1)
    ]
    words = " ".join(text.split())
    assert f"{min(speedups):.1f}x to {max(speedups):.1f}x as fast as eager" in words
    ratio = (
        "the DT paper's size trained {:.1f}x (DT, {:.0f} steps/s) and {:.1f}x (Primal-DT, {:.0f})"
    )
    assert (
        ratio.format(speedups[0], rate["DT", "compiled"][0], speedups[1], rate["DT", "compiled"][1])
        in words
    )
    assert (
        "the Primal paper's {:.1f}x and {:.1f}x ({:.0f} and {:.0f})".format(
            speedups[2], speedups[3], *rate["Primal", "compiled"]
        )
        in words
    )
