"""primal-dt's compile cache (training/compiling.py): its own folder, and a run that meets a
damaged kernel there says so, repairs it and ends with the bits of a run that never met it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import train_args

from primal_dt.store.snapshots import read_snapshot
from primal_dt.training.compiling import (
    CACHE_VARIABLE,
    compile_cache,
    compile_model,
    damaged_files,
)


def test_the_cache_is_per_user_and_torch_version_and_overridable(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(CACHE_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache() == tmp_path / "xdg" / "primal-dt" / "compile" / (
        f"torch-{torch.__version__}"
    )
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "mine"))
    assert compile_cache() == tmp_path / "mine"
    compile_model(torch.nn.Linear(2, 2), "default", torch.device("cpu"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_only_errors_that_name_a_file_of_the_cache_count_as_damage(tmp_path) -> None:
    kernel = tmp_path / "ab" / "cabc.main.so"
    try:
        try:
            raise ImportError(f"{kernel}: file too short")
        except ImportError as cause:
            raise RuntimeError("InductorError: compiling failed") from cause
    except RuntimeError as err:
        assert damaged_files(err, tmp_path) == [kernel]
    assert damaged_files(RuntimeError(f"{tmp_path.parent}/other.so: bad"), tmp_path) == []
    assert damaged_files(ValueError("shapes do not match"), tmp_path) == []


def train(run_dir: Path, cache: Path) -> subprocess.CompletedProcess:
    one_block = ("model.n_layer=1", 'model.attention=["primal"]')  # fewer kernels to compile
    args = [
        *train_args(run_dir, 3, "train.compile=true", *one_block),
        "--device",
        "cpu",
    ]  # CPU kernels: .so files
    env = {**os.environ, CACHE_VARIABLE: str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "primal_dt.cli", *args], env=env, capture_output=True, text=True
    )


def test_a_zero_byte_kernel_is_deleted_and_compiled_again(minari_root, tmp_path) -> None:
    """The failure seen in a shared /tmp cache: kernel libraries left zero bytes long."""
    cache = tmp_path / "cache"
    first = train(tmp_path / "first", cache)
    assert first.returncode == 0, first.stderr
    kernels = sorted(cache.rglob("*.so"))
    assert kernels, "a compiled CPU run caches its kernels as shared libraries"
    for kernel in kernels:
        kernel.write_bytes(b"")  # as a process killed while the compiler wrote them leaves them
    second = train(tmp_path / "second", cache)
    assert second.returncode == 0, second.stderr
    notes = [line for line in second.stderr.splitlines() if "could not be loaded" in line]
    assert len(notes) == 1 and str(cache) in notes[0]
    assert f"({cache}/" in notes[0]  # the file that could not be loaded
    assert all(kernel.stat().st_size > 0 for kernel in cache.rglob("*.so"))
    assert not list(tmp_path.glob("cache.damaged-*"))
    weights = [
        read_snapshot(run / "ckpt.pt").weights for run in (tmp_path / "first", tmp_path / "second")
    ]
    for name, value in weights[0].items():
        assert torch.equal(weights[1][name], value), name


@pytest.mark.parametrize("dropout", [0.1])
def test_compiled_and_eager_drop_the_same_elements(dropout: float) -> None:
    """On a CPU the compiled model draws dropout.py's masks from torch's generator, as eager."""
    from primal_dt.method.dropout import Dropout

    layer = Dropout(dropout)
    compiled = compile_model(layer, "default", torch.device("cpu"))
    x = torch.ones(4, 300)
    torch.manual_seed(3)
    eager = layer(x)
    torch.manual_seed(3)
    assert torch.equal(compiled(x), eager)
