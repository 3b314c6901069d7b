"""The package's structure: its folders are its layers, and a module imports only from its own
folder or a lower one, never in a circle; the run directory's layout is spelled out in
store/rundir.py alone; a snapshot written is the snapshot read back."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from primal_dt.common.config import Config
from primal_dt.data.episodes import ReferenceScores
from primal_dt.store.integrity import DIGEST_KEY
from primal_dt.store.rundir import RunDir
from primal_dt.store.snapshots import (
    EvalRequest,
    Snapshot,
    TaskInfo,
    TrainingState,
    read_snapshot,
    write_snapshot,
)

PACKAGE = Path(__file__).resolve().parents[1] / "primal_dt"
# The layers, lowest first: each folder may import from itself and the folders before it. The
# command line (cli.py, at the top of the package) may import from all of them.
LAYERS = ("common", "data", "method", "store", "evaluation", "training", "tools")
TOP = {"cli", "commands", "__init__", "__main__"}
LAYOUT_NAMES = (
    "config.json",
    "ckpt.pt",
    "best.pt",
    "eval.jsonl",
    "training.jsonl",
    "facts.json",
    "eval_queue",
    "train.log",
    "spectrum_windows.pt",
    "checkpoints/",
)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name below primal_dt (e.g. store.rundir)."""
    return {
        ".".join(path.relative_to(package).with_suffix("").parts): path
        for path in package.rglob("*.py")
    }


def imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """For each module, the package modules it imports, at the top or lazily (`from primal_dt.x
    import y` counts as x.y where x.y is a module, else as x)."""
    known = modules(package)
    graph = {}
    for name, path in known.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("primal_dt"):
                base = (node.module or "").removeprefix("primal_dt").lstrip(".")
                for alias in node.names:
                    full = f"{base}.{alias.name}".lstrip(".")
                    found.add(full if full in known else base or "__init__")
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.removeprefix("primal_dt.")
                    for a in node.names
                    if a.name.startswith("primal_dt.")
                }
        graph[name] = found - {name}
    return graph


def layer(module: str) -> int:
    """A module's layer: the index of its folder in LAYERS; the top (cli) above them all."""
    folder = module.split(".")[0]
    return LAYERS.index(folder) if folder in LAYERS else len(LAYERS)


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Every import circle of a graph of imports, as 'import circle: a -> b -> a'."""
    found: list[str] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append("import circle: " + " -> ".join([*path, module]))
            return
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, [*path, module])
        done.add(module)

    for module in graph:
        visit(module, [])
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    """Every import that goes up a layer, and every import circle."""
    graph = imports(package)
    found = [
        f"{module} imports {other}, a higher layer"
        for module, imported in graph.items()
        for other in imported
        if layer(other) > layer(module)
    ]
    return found + circles(graph)


def test_every_module_lives_in_a_layer_folder() -> None:
    outside = [m for m in modules() if m not in TOP and m.split(".")[0] not in LAYERS]
    assert outside == [], f"modules outside the layer folders: {outside}"
    assert set(LAYERS) <= {p.name for p in PACKAGE.iterdir() if p.is_dir()}


def test_imports_go_down_the_layers_and_never_in_a_circle() -> None:
    assert violations() == []
    assert len(imports()) >= 30 and "training.trainer" in imports()  # the walk saw the package


REPOSITORY = PACKAGE.parent
LONGEST = 450  # lines: a module longer than this holds two ideas


def local_imports(folder: Path) -> dict[str, set[str]]:
    """For each module of a folder of scripts or tests (by its file's stem), the names of the
    top-level modules it imports that are not the package's."""
    found: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
        found[path.stem] = names - {"primal_dt"}
    return found


def test_scripts_and_tests_import_the_package_and_their_own_folder_never_each_other() -> None:
    """The repository's picture holds beyond the package: scripts/ imports the package and its
    own helpers, tests/ the package and conftest; neither imports the other (by name, or by
    putting the other folder on sys.path), and neither folder's imports go in a circle."""
    scripts, tests = local_imports(REPOSITORY / "scripts"), local_imports(REPOSITORY / "tests")
    assert "results" in scripts and "conftest" in tests  # the walk saw both folders
    crossing = [
        f"{folder}/{name}.py imports {other}"
        for folder, mine, theirs in (("scripts", scripts, tests), ("tests", tests, scripts))
        for name, imported in mine.items()
        for other in imported & set(theirs)
    ]
    assert crossing == []
    for folder, graph in (("scripts", scripts), ("tests", tests)):
        for path in (REPOSITORY / folder).glob("*.py"):
            text = path.read_text()
            other = "tests" if folder == "scripts" else "scripts"
            assert (
                f'/ "{other}"))' not in text
                and f"sys.path.insert(0, str({other.upper()}" not in text
            ), path
        local = {name: imported & set(graph) for name, imported in graph.items()}
        assert circles(local) == [], folder


def test_no_module_of_the_package_or_the_scripts_is_longer_than_a_few_screens() -> None:
    files = [*PACKAGE.rglob("*.py"), *(REPOSITORY / "scripts").glob("*.py")]
    long = {
        str(f.relative_to(REPOSITORY)): n
        for f in files
        if (n := len(f.read_text().splitlines())) > LONGEST
    }
    assert long == {}, f"over {LONGEST} lines: {long}"
    assert len(files) > 60


def test_an_upward_import_planted_in_any_module_is_found(tmp_path) -> None:
    """The check covers every module: plant an import of the top layer's module in each module
    below it, one at a time, in a copy of the package."""
    copy = tmp_path / "primal_dt"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("bundled", "__pycache__"))
    for name, path in modules(copy).items():
        if name in TOP:
            continue
        planted = copy / path.relative_to(copy)
        original = planted.read_text()
        planted.write_text(original + "\nfrom primal_dt.cli import main  # planted\n")
        assert any(v.startswith(f"{name} imports cli") for v in violations(copy)), name
        planted.write_text(original)


def test_the_run_directory_layout_is_named_in_rundir_py_only() -> None:
    """No string in the code outside store/rundir.py names a file of the run directory
    (docstrings and command-line help, which describe the layout to people, may)."""
    for name, path in modules().items():
        if name == "store.rundir":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        docstrings |= {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.keyword) and node.arg == "help"
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings:
                    continue
                named = [name for name in LAYOUT_NAMES if name in node.value]
                assert not named, f"{name}:{node.lineno} spells out {named}"


def example_snapshot() -> Snapshot:
    config = Config()
    config.model.context_len = 7
    return Snapshot(
        step=12,
        config=config,
        task=TaskInfo(
            "hopper-medium",
            ("mujoco/hopper/medium-v0",),
            "Hopper-v5",
            {"reset_noise_scale": 0.1},
            1000,
            (3600.0, 1800.0),
            ReferenceScores(-20.0, 3234.0, "test"),
        ),
        state_dim=11,
        act_dim=3,
        max_timestep=1000,
        state_mean=torch.arange(11.0),
        state_std=torch.ones(11),
        weights={"w": torch.randn(2, 3)},
        request=EvalRequest(episodes=5, final=True),
        training=TrainingState(
            {"state": {}},
            {"last_epoch": 3},
            {"generator": torch.ones(2)},
            torch.ones(4, dtype=torch.uint8),
            [],
            {"action_loss": torch.tensor(0.5)},
            2,
        ),
    )


def _written_checkpoint(folder: Path, snapshot: Snapshot) -> Path:
    path = RunDir(folder).checkpoint
    write_snapshot(path, snapshot)
    return path


def test_a_snapshot_reads_back_as_written_and_opens_with_weights_only(tmp_path) -> None:
    snapshot = example_snapshot()
    config = snapshot.config
    path = _written_checkpoint(tmp_path, snapshot)
    assert isinstance(torch.load(path, weights_only=True), dict)
    back = read_snapshot(tmp_path)  # a run directory reads as its latest checkpoint
    assert back.config == config and back.task == snapshot.task
    assert back.request == snapshot.request
    assert (back.step, back.state_dim, back.act_dim, back.max_timestep) == (12, 11, 3, 1000)
    assert torch.equal(back.state_mean, snapshot.state_mean)
    assert torch.equal(back.weights["w"], snapshot.weights["w"])
    assert back.training is not None and back.training.pending_count == 2
    assert back.training.pending_sums == {"action_loss": torch.tensor(0.5)}
    assert back.training.scheduler == {"last_epoch": 3}
    plain = Snapshot(**{**vars(snapshot), "request": None, "training": None})
    write_snapshot(path, plain)
    again = read_snapshot(path)
    assert again.training is None and again.request is None


def test_a_checkpoint_with_unnamed_loss_sums_reads_with_their_names(tmp_path) -> None:
    """Checkpoints (format 1) written before the metrics had names hold their sums as a vector."""
    payload = torch.load(_written_checkpoint(tmp_path, example_snapshot()), weights_only=True)
    payload["pending_log"]["sums"] = torch.tensor([1.0, 2.0, 3.0])
    del payload[DIGEST_KEY]  # such a checkpoint also predates digests
    torch.save(payload, tmp_path / "old.pt")
    sums = read_snapshot(tmp_path / "old.pt").training.pending_sums
    assert {name: value.item() for name, value in sums.items()} == {
        "action_loss": 1.0,
        "ksvd_loss": 2.0,
        "grad_norm": 3.0,
    }


def test_the_command_line_starts_without_torch() -> None:
    """`primal-dt --help` and the parser import no torch (the package's names load on first use,
    and `from primal_dt import commands` is a submodule, not one of them)."""
    code = "import sys, primal_dt.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent).returncode == 0
