"""Episode videos: MuJoCo rendered offscreen, frames written to MP4 as they come, and short GIFs
for TensorBoard.

Rendering needs an OpenGL back-end for MuJoCo. primal-dt uses EGL: on a machine with an NVIDIA GPU
it draws there, and on a headless machine without one Mesa's EGL draws on the CPU (llvmpipe). It
needs the system's EGL and Mesa libraries (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0
libgl1-mesa-dri libopengl0, present on most desktop and CI images) and MUJOCO_GL=egl, which
headless_rendering sets while it draws, unless MUJOCO_GL is set already (MUJOCO_GL=osmesa with
libosmesa6 is the other CPU back-end). Only drawing needs the back-end: MuJoCo is imported without
one (tasks.import_mujoco), so an evaluation without video works whatever MUJOCO_GL says. MP4 files
are written with imageio and its bundled ffmpeg (the `video` extra). Rendering only reads the
simulation, so an episode returns the same whether it is rendered or not (the tests check it).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import PrimalDTError, first_line

# The system packages (Debian/Ubuntu) each CPU-capable offscreen back-end of MuJoCo needs.
BACK_END_PACKAGES = {
    "egl": "libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0",
    "osmesa": "libosmesa6",
}


def install_hint(back_end: str | None) -> str:
    """What to install for the back-end MUJOCO_GL names; for any other, EGL (the default)."""
    back_end = (back_end or "").lower().strip()
    packages = BACK_END_PACKAGES.get(back_end)
    if packages is not None:
        return f"install MuJoCo's {back_end} back-end (Debian/Ubuntu: apt-get install {packages})"
    return (
        "install MuJoCo's offscreen back-end, EGL with Mesa (Debian/Ubuntu: apt-get install "
        f"{BACK_END_PACKAGES['egl']}) and leave MUJOCO_GL unset or set it to egl"
    )


class VideoUnavailable(PrimalDTError):
    """Videos cannot be made here: no rendering back-end, or no MP4 writer."""


def cannot_render(err: BaseException) -> VideoUnavailable:
    """Why nothing can be drawn: the back-end MUJOCO_GL names, the error, and what to install."""
    back_end = os.environ.get("MUJOCO_GL")
    return VideoUnavailable(
        f"cannot render offscreen (MUJOCO_GL={back_end}): "
        f"{type(err).__name__}: {first_line(err)}; {install_hint(back_end)}"
    )


@contextmanager
def headless_rendering() -> Iterator[None]:
    """MUJOCO_GL=egl while frames are drawn (Gymnasium reads it when an environment draws its
    first frame), unless the user chose a back-end; restored afterwards, so that processes
    started later (environment workers, the evaluation process) import MuJoCo as before.

    The back-end's module (mujoco.egl, mujoco.osmesa) is imported first, as Gymnasium does at the
    first frame: a missing library is one VideoUnavailable before any environment is made."""
    chosen = "MUJOCO_GL" in os.environ
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        back_end = os.environ["MUJOCO_GL"].lower().strip()
        if back_end in BACK_END_PACKAGES:
            try:
                importlib.import_module(f"mujoco.{back_end}")
            except Exception as err:  # ImportError, or AttributeError from PyOpenGL without it
                raise cannot_render(err) from None
        yield
    finally:
        if not chosen:
            os.environ.pop("MUJOCO_GL", None)


def video_name(step: int, target: float, seed: int, episode_return: float) -> str:
    """An episode's MP4 file name: step, target, episode seed and return (video_target_and_seed
    reads it back)."""
    return f"step_{step:08d}_target_{target:g}_seed_{seed}_return_{episode_return:.1f}.mp4"


def video_target_and_seed(name: str) -> tuple[str, str]:
    """The target and seed a video_name holds, as written."""
    match = re.fullmatch(r"step_\d+_target_(.+)_seed_(\d+)_return_.+\.mp4", name)
    if match is None:
        raise ValueError(f"{name} is not a primal-dt video name")
    return match[1], match[2]


def check_mp4_writer() -> None:
    """A VideoUnavailable naming the extra to install where imageio or its ffmpeg is missing:
    checked before anything is evaluated or a folder made."""
    for module in ("imageio", "imageio_ffmpeg"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise VideoUnavailable(
                f"videos need imageio and imageio-ffmpeg ({module} is not installed): "
                f"pip install 'primal-dt[video]'"
            ) from None


@contextmanager
def mp4_writer(path: Path, fps: float) -> Iterator[Any]:
    """An MP4 writer taking (H, W, 3) uint8 frames with .append_data; a missing writer or
    rendering back-end is one VideoUnavailable, and a failed file is removed."""
    check_mp4_writer()
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer = imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=1)
    except Exception as err:  # imageio-ffmpeg missing, no ffmpeg binary
        raise VideoUnavailable(f"cannot write {path}: {first_line(err)}") from None
    try:
        yield writer
    except VideoUnavailable:
        writer.close()
        path.unlink(missing_ok=True)
        raise
    except Exception as err:  # no OpenGL back-end: ImportError, AttributeError, mujoco.FatalError
        writer.close()
        path.unlink(missing_ok=True)
        raise cannot_render(err) from None
    writer.close()


def read_frames(path: Path, every: int = 1) -> tuple[list[np.ndarray], float]:
    """Every `every`-th frame of an MP4 file, and the frame rate that keeps them in real time."""
    import imageio

    # Not `with ... as reader` nor `for frame in reader`: imageio's stubs type __enter__ as the
    # base class and __iter__ as one array; iterating a reader is iter_data().
    reader = imageio.get_reader(path)
    with reader:
        fps = float(reader.get_meta_data()["fps"])
        return [frame for i, frame in enumerate(reader.iter_data()) if i % every == 0], fps / every


def gif_summary(tag: str, frames: list[np.ndarray], fps: float) -> Any:
    """A TensorBoard image summary holding an animated GIF (what SummaryWriter.add_video makes,
    without its moviepy dependency); shown in the IMAGES tab."""
    import imageio.v3 as iio
    from tensorboard.compat.proto.summary_pb2 import Summary

    gif = iio.imwrite("<bytes>", frames, extension=".gif", duration=1000 / fps, loop=0)
    height, width = frames[0].shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    return Summary(value=[Summary.Value(tag=tag, image=image)])
