"""A new attention kind is one file: written in a folder of its own that $PRIMAL_DT_KINDS names,
it is found everywhere a kind is (the exports, the configs' checks, training and its evaluation
process, the report and the configuration reference), with nothing else edited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOY_KIND = '''
"""A toy kind: each token's value averaged over the real tokens up to it."""

from dataclasses import dataclass
from typing import Any

from primal_dt.method.layer import ProjectedAttention, register


@dataclass
class ToySettings:
    """The toy's own settings, [model.attention_settings.toy]."""

    scale: float = 1.0  #: what the average is multiplied by

    def check(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")


@register("toy")
class ToyAttention(ProjectedAttention):
    """The running mean of the values, scaled: (B, L, D) in, (B, L, D) out, and the mask."""

    label = "toy mean"
    settings_class = ToySettings

    def __init__(self, embed_dim: int, n_head: int, dropout: float = 0.0, scale: float = 1.0):
        super().__init__(embed_dim, n_head, dropout)
        self.scale = scale

    @classmethod
    def from_config(cls, config: Any, settings: Any = None) -> "ToyAttention":
        return cls(config.embed_dim, config.n_head, config.dropout, settings.scale)

    def forward(self, x, mask, rows=None, objective=True):
        _, _, v = self.heads(x)
        real = mask.to(v.dtype)[:, None, :, None]
        y = self.scale * (v * real).cumsum(dim=2) / real.cumsum(dim=2).clamp(min=1.0)
        return self.output(y, rows), None
'''

CHECKS = """
import sys
from pathlib import Path
import primal_dt
from primal_dt.method import registry
from primal_dt.cli import main

# The exports.
assert primal_dt.ToyAttention is registry.ATTENTIONS["toy"], registry.ATTENTIONS
assert "ToyAttention" in primal_dt.__all__
# The configs' checks, with its settings' did-you-mean.
runs = Path(sys.argv[2])
tiny = ["model.embed_dim=16", "model.n_head=2", "model.context_len=5", "train.warmup_steps=5",
        "train.log_every=5", "eval.episodes=1", "model.attention=toy"]
train = ["train", "--env", "hopper-bundled", "--device", "cpu", "--steps", "10",
         "--final-episodes", "1"]
sets = [a for s in tiny for a in ("--set", s)]
assert main([*train, *sets, "--set", "model.attention_settings.toy.scael=2"]) == 2
# Training, and the report that names it by its label.
run_dir = runs / "hopper-bundled" / "toy-s0"
assert main([*train, *sets, "--set", "model.attention_settings.toy.scale=2",
             "--run-dir", str(run_dir)]) == 0
assert main(["report", str(runs), "--out", str(runs / "report")]) == 0
assert "toy mean" in (runs / "report" / "report.md").read_text()
# The configuration reference.
sys.path.insert(0, sys.argv[3])
from config_reference import _kind_settings
assert "[model.attention_settings.toy]" in [node.astext() for node in _kind_settings()]
print("found everywhere")
"""


def test_a_kind_in_a_file_of_its_own_is_found_everywhere(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "toy_attention.py").write_text(textwrap.dedent(TOY_KIND))
    args = [str(plugins), str(tmp_path / "runs"), str(ROOT / "docs" / "_ext")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRIMAL_DT_KINDS": str(plugins)}
    done = subprocess.run(
        [sys.executable, "-c", CHECKS, *args], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "found everywhere" in done.stdout
    assert "did you mean 'scale'?" in done.stderr
