"""The README's results section, made by the pipeline itself: record datasets from the policies in
tests/policies, `primal-dt sweep` DT and Primal-DT over 3 seeds, `primal-dt report`, and put the
report's tables and its aggregate figure into README.md.

    python scripts/results.py                     # the CPU budget of the README (about 15 minutes)
    python scripts/results.py --write-docs      # and write the section
    python scripts/results.py --steps 100000 --full-size --tasks halfcheetah-medium,...   # a GPU
    python scripts/results.py --compare-init --tasks hopper-bundled --write-docs
        # Primal-DT with each initialisation of We and Wr (model.primal_init), side by side

At the CPU budget (small models, a few hundred steps, datasets of 20000 steps) this demonstrates
the pipeline and its statistics; it does not reproduce the paper. With the paper's budget
(--steps 100000 --full-size, the paper's datasets as --tasks) it is the reproduction, on a GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from datetime import date
from pathlib import Path

from bench_common import device_name, primal_dt
from doc_tables import write_section

from primal_dt.common.config import PRIMAL_INITS, named_config_path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "tests" / "policies"
FIGURES = ROOT / "scripts" / "figures"
# Datasets recorded here: (env, quality, policy file, expert policy file for reference scores).
RECORDED = [
    ("hopper", "medium", "sac/Hopper-v5.zip", "tqc/Hopper-v5.zip"),
    ("halfcheetah", "medium", "sac/HalfCheetah-v5.zip", "tqc/HalfCheetah-v5.zip"),
    ("walker2d", "medium", "sac/Walker2d-v5.zip", "tqc/Walker2d-v5.zip"),
]
SMALL = ["model.embed_dim=64", "model.primal_rank=16", "train.warmup_steps=100"]


def record(root: Path, steps: int, env: dict[str, str]) -> list[str]:
    """The medium datasets of RECORDED in root (made once), with measured reference scores."""
    tasks = []
    for name, quality, policy, expert in RECORDED:
        if not (root / "primal-dt" / name / f"{quality}-v0").exists():
            primal_dt("datasets", "make", "--env", name, "--recipe", "policy", "--name", quality,
                      "--policy", str(POLICIES / policy), "--steps", str(steps),
                      "--expert-policy", str(POLICIES / expert), "--no-progress", env=env)  # fmt: skip
        tasks.append(f"{name}-{quality}")
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="training steps per run (500)")
    parser.add_argument("--dataset-steps", type=int, default=20000, help="steps recorded (20000)")
    parser.add_argument("--tasks", help="tasks instead of the bundled and recorded ones")
    parser.add_argument("--full-size", action="store_true", help="the configs' own model sizes")
    parser.add_argument("--episodes", type=int, default=10, help="final episodes per target (10)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="results", help="where datasets and runs go (results)")
    parser.add_argument(
        "--compare-init", action="store_true",
        help="Primal-DT with its default and with the public code's initialisation of We and Wr "
        "(model.primal_init) instead of DT against Primal-DT",
    )  # fmt: skip
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    env = {**os.environ, "MINARI_DATASETS_PATH": str(out / "minari")}
    start = time.monotonic()
    tasks = args.tasks.split(",") if args.tasks else ["hopper-bundled", *record(
        out / "minari", args.dataset_steps, env)]  # fmt: skip
    settings = [] if args.full_size else SMALL
    settings += ["train.eval_every=0", f"eval.final_episodes={args.episodes}"]
    configs, section, compared = "dt,primal-dt", "results", "DT and Primal-DT"
    if args.compare_init:
        configs = ",".join(str(init_config(out, init)) for init in PRIMAL_INITS)
        section, compared = "results-init", "Primal-DT with each initialisation of We and Wr"
    # Each section's runs and report apart: the report covers every run below its folder.
    runs, reported = out / f"{section}-runs", out / f"{section}-report"
    primal_dt("sweep", "--tasks", ",".join(tasks), "--seeds", "0,1,2", "--configs", configs,
              "--runs-dir", str(runs), "--steps", str(args.steps), "--device", args.device,
              "--parallel", str(args.parallel), "--offline",
              *[a for s in settings for a in ("--set", s)], env=env)  # fmt: skip
    primal_dt("report", str(runs), "--out", str(reported), env=env)
    minutes = (time.monotonic() - start) / 60
    report = (reported / "report.md").read_text()
    # Across tasks the aggregates; on one task its curves (scores and KSVD loss side by side).
    shown = "aggregates.png" if len(tasks) > 1 else f"curves_{tasks[0]}.png"
    figure = FIGURES / f"{section}_{shown}"
    shutil.copy(reported / shown, figure)
    size = "the configs' own sizes" if args.full_size else "embed 64, Primal rank 16"
    text = "\n".join([
        f"Made by `python scripts/results.py{' --compare-init' if args.compare_init else ''}` on "
        f"{date.today()}, {device_name_for(args.device)}, in {minutes:.0f} minutes: {len(tasks)} "
        f"task{'s' * (len(tasks) > 1)} ({', '.join(tasks)}) x {compared} x 3 seeds, {args.steps} "
        f"training steps each ({size}), {args.episodes} final episodes per target. A "
        f"demonstration of the pipeline and its statistics at a CPU budget, not a reproduction of "
        f"the paper (that is the same script with its budget, on a GPU).",
        "",
        section_of(report),
        "",
        f"![{shown}]({figure.relative_to(ROOT)})",
    ])  # fmt: skip
    print(text)
    if args.write_docs:
        write_section(section, text)


def init_config(out: Path, init: str) -> Path:
    """configs/primal-dt.toml with model.primal_init = init, as a config of its own name
    (primal-dt-<init>-init), so that the report sets the two side by side."""
    text = re.sub(r"(?m)^primal_init = .*\n", "", named_config_path("primal-dt").read_text())
    path = out / f"primal-dt-{init}-init.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("[model]\n", f'[model]\nprimal_init = "{init}"\n', 1))
    return path


def device_name_for(device: str) -> str:
    import torch

    return device_name(torch.device(device))


def section_of(report: str) -> str:
    """The report's Markdown after its title, headings one level down, without its pictures
    (which live beside report.md; the README shows the aggregate one)."""
    lines = report.splitlines()[1:]
    kept = [line for line in lines if not line.startswith("![")]
    return "\n".join("#" + line if line.startswith("## ") else line for line in kept).strip()


if __name__ == "__main__":
    main()
