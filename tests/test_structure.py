"""The package's structure: modules import one another without a circle, lower layers never import
higher ones, the run directory's layout is spelled out in run.py alone, and a snapshot written is
the snapshot read back."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from primal_dt.config import Config
from primal_dt.data import ReferenceScores
from primal_dt.run import (
    EvalRequest,
    RunDir,
    Snapshot,
    TaskRecord,
    TrainingState,
    read_snapshot,
    write_snapshot,
)

PACKAGE = Path(__file__).resolve().parents[1] / "primal_dt"
# Evaluation, its records and the run record never reach up into training or the commands.
LOWER = {"run", "results", "evaluate", "eval_service", "spectrum", "device", "model", "data",
         "conditioning", "cpu"}  # fmt: skip
HIGHER = {"train", "sweep", "report", "cli"}
LAYOUT_NAMES = ("config.json", "ckpt.pt", "best.pt", "eval.jsonl", "eval_queue", "train.log",
                "spectrum_windows.pt", "checkpoints/")  # fmt: skip


def imports() -> dict[str, set[str]]:
    """For each module of the package, the package modules it imports, at the top or lazily."""
    graph = {}
    for path in PACKAGE.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("primal_dt."):
                found.add(node.module.removeprefix("primal_dt."))
            elif isinstance(node, ast.Import):
                found |= {a.name.removeprefix("primal_dt.") for a in node.names
                          if a.name.startswith("primal_dt.")}  # fmt: skip
        graph[path.stem] = found
    return graph


def test_no_module_imports_another_in_a_circle() -> None:
    graph = imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, "import circle: " + " -> ".join([*path, module])
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, [*path, module])
        done.add(module)

    for module in graph:
        visit(module, [])
    assert "run" in graph and "train" in graph  # the walk saw the package


def test_lower_layers_never_import_higher_ones() -> None:
    for module, imported in imports().items():
        if module in LOWER:
            assert not imported & HIGHER, f"{module} imports {imported & HIGHER}"


def test_the_run_directory_layout_is_named_in_run_py_only() -> None:
    """No string in the code outside run.py names a file of the run directory (docstrings and
    command-line help, which describe the layout to people, may)."""
    for path in PACKAGE.glob("*.py"):
        if path.stem == "run":
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
                assert not named, f"{path.name}:{node.lineno} spells out {named}"


def test_a_snapshot_reads_back_as_written_and_opens_with_weights_only(tmp_path) -> None:
    config = Config()
    config.model.context_len = 7
    snapshot = Snapshot(
        step=12,
        config=config,
        task=TaskRecord(
            "hopper-medium",
            ("mujoco/hopper/medium-v0",),
            "Hopper-v5",
            {"reset_noise_scale": 0.1},
            1000,
            (3600.0, 1800.0),
            ReferenceScores(-20.0, 3234.0, "test"),
        ),  # fmt: skip
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
            torch.zeros(3),
            2,
        ),  # fmt: skip
    )
    path = RunDir(tmp_path).checkpoint
    write_snapshot(path, snapshot)
    assert isinstance(torch.load(path, weights_only=True), dict)
    back = read_snapshot(tmp_path)  # a run directory reads as its latest checkpoint
    assert back.config == config and back.task == snapshot.task
    assert back.request == snapshot.request
    assert (back.step, back.state_dim, back.act_dim, back.max_timestep) == (12, 11, 3, 1000)
    assert torch.equal(back.state_mean, snapshot.state_mean)
    assert torch.equal(back.weights["w"], snapshot.weights["w"])
    assert back.training is not None and back.training.pending_count == 2
    assert back.training.scheduler == {"last_epoch": 3}
    assert back.eval_request() == EvalRequest(5, True)
    plain = Snapshot(**{**vars(snapshot), "request": None, "training": None})
    write_snapshot(path, plain)
    again = read_snapshot(path)
    assert again.training is None and again.eval_request() == EvalRequest(10, False)
