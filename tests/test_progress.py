"""Progress output: a bar on a terminal; readable lines, not a bar redrawn every step, in a file."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from conftest import train_args

from primal_dt.common.progress import LineProgress


def test_progress_lines_come_at_the_interval_and_at_the_end() -> None:
    out = io.StringIO()
    progress = LineProgress(total=10, initial=2, desc="hopper-medium", interval=0.2, file=out)
    progress.set_postfix(action="0.1234")
    progress.update()  # too soon for a line
    time.sleep(0.25)
    progress.update()
    progress.write("step 4: evaluation over 1 episodes")
    for _ in range(6):
        progress.update()
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("hopper-medium: step 4/10 (40%), ")
    assert lines[0].endswith("s left, action=0.1234")
    assert lines[1] == "step 4: evaluation over 1 episodes"
    assert lines[2].startswith("hopper-medium: step 10/10 (100%)") and len(lines) == 3


def test_training_into_a_file_writes_progress_lines_not_a_bar(minari_root, tmp_path) -> None:
    args = [a for a in train_args(tmp_path / "run", 40) if a != "--no-progress"]
    log = tmp_path / "train.log"
    with log.open("w") as file:
        result = subprocess.run(
            [sys.executable, "-m", "primal_dt.cli", *args], stderr=file, stdout=file
        )
    text = log.read_text()
    assert result.returncode == 0, text
    assert "\r" not in text  # no bar redrawn in place
    progress = [line for line in text.splitlines() if line.startswith("hopper-medium: step")]
    # 40 steps take a few seconds, under the 30 s between lines: only the closing line.
    assert [line.split(",")[0] for line in progress] == ["hopper-medium: step 40/40 (100%)"]
