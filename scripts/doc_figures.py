"""The documentation's pictures and sample output from a real (small) run: what `primal-dt eval --ckpt`
prints, the return-conditioning curve and a still frame of a rendered episode, all of the
quick start's model (hopper-bundled, embed 64, 1000 steps on a CPU).

    python scripts/doc_figures.py      # writes scripts/figures/*.png and the quick start's sample (README.md, docs/quickstart.md)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bench_common import primal_dt
from doc_tables import write_section
from quickstart_command import quickstart_args

FIGURES = Path(__file__).resolve().parent / "figures"
STARTED = "20261204-120000"  # the time in the sample's run directory name
TRAIN = [*quickstart_args(), "--no-progress"]


def main() -> None:
    import imageio.v3 as iio

    from primal_dt.store.rundir import RunDir, run_dir_name

    FIGURES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "MINARI_DATASETS_PATH": str(Path(folder) / "minari")}
        # The path a user's run gets (runs/<task>/<config>-s<seed>-<time>), at a fixed time.
        shown = str(Path("runs") / run_dir_name("hopper-bundled", "primal-dt", 0, STARTED))
        run = RunDir(Path(folder) / shown)
        primal_dt(*TRAIN, "--run-dir", str(run.path), env=env)
        os.chdir(folder)  # so that the command prints the path a user would see
        printed = primal_dt("eval", "--ckpt", shown, env=env)
        sample = f"```\n$ primal-dt eval --ckpt {shown}\n{printed.rstrip()}\n```"
        write_section("eval-sample", sample)
        primal_dt(
            "eval",
            "--ckpt",
            str(run.path),
            "--target-sweep",
            "0:4000:9",
            "--episodes",
            "10",
            env=env,
        )
        shutil.copy(run.return_curve(1000)[1], FIGURES / "return_curve_hopper-bundled.png")
        primal_dt("eval", "--ckpt", str(run.path), "--targets", "3600", "--video", env=env)
        (video,) = run.videos.glob("*.mp4")
        frames = list(iio.imiter(video))
        iio.imwrite(FIGURES / "episode_frame_hopper-bundled.png", frames[len(frames) // 2])
        print(f"{video.name}: {len(frames)} frames; wrote the figures to {FIGURES}")


if __name__ == "__main__":
    main()
