"""Where a dataset comes from: the Minari root, the datasets bundled with primal-dt, or Minari's remote.

Datasets primal-dt makes live in their own namespace, `primal-dt/<env>/<quality>-v0`, so they are never
mistaken for Minari's official `mujoco/...` ones. The bundled folder is itself a Minari root inside
the package; it is read in place (never copied into ~/.minari), and a dataset of the same id in the
Minari root takes precedence over it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCAL_NAMESPACE = "primal-dt"
BUNDLED_ROOT = Path(__file__).resolve().parents[1] / "bundled"  # primal_dt/bundled


def minari_root() -> str:
    """$MINARI_DATASETS_PATH, or Minari's default ~/.minari/datasets."""
    return os.environ.get("MINARI_DATASETS_PATH") or os.path.join(
        os.path.expanduser("~"), ".minari", "datasets"
    )


def local_id(env: str, quality: str) -> str:
    """The id of a dataset primal-dt makes, e.g. primal-dt/hopper/medium-replay-v0."""
    return f"{LOCAL_NAMESPACE}/{env}/{quality}-v0"


def is_local_id(dataset_id: str) -> bool:
    return dataset_id.startswith(f"{LOCAL_NAMESPACE}/")


def _holds(root: str | Path, dataset_id: str) -> bool:
    return (Path(root) / dataset_id / "data" / "metadata.json").is_file()


def find_dataset(dataset_id: str) -> Path | None:
    """The folder of a dataset present on this machine (Minari root first, then bundled), or None."""
    for root in (minari_root(), BUNDLED_ROOT):
        if _holds(root, dataset_id):
            return Path(root) / dataset_id
    return None


def ids_here() -> list[str]:
    """The ids of the datasets present on this machine (Minari root and bundled), for a
    did-you-mean when an id is misspelt."""
    found = set()
    for root in (Path(minari_root()), BUNDLED_ROOT):
        for metadata in root.glob("**/data/metadata.json") if root.is_dir() else ():
            found.add(metadata.parents[1].relative_to(root).as_posix())
    return sorted(found)


def origin(dataset_id: str) -> str:
    """A few words for logs: which kind of dataset this is and where it is."""
    root = minari_root()
    if _holds(root, dataset_id):
        kind = "made locally" if is_local_id(dataset_id) else "present"
        return f"{kind}, in {root}"
    if _holds(BUNDLED_ROOT, dataset_id):
        return "bundled with primal-dt"
    return "not on this machine"


def describe_sources(dataset_ids: tuple[str, ...] | list[str]) -> str:
    """`primal-dt/hopper/bundled-v0 (bundled with primal-dt)`, joined with + for combined tasks."""
    return " + ".join(f"{dataset_id} ({origin(dataset_id)})" for dataset_id in dataset_ids)


def local_qualities(env: str) -> list[str]:
    """Qualities of the primal-dt datasets present for `env`, in the Minari root or bundled."""
    found = set()
    for root in (Path(minari_root()), BUNDLED_ROOT):
        folder = root / LOCAL_NAMESPACE / env
        if folder.is_dir():
            for path in folder.glob("*-v0"):
                if _holds(root, f"{LOCAL_NAMESPACE}/{env}/{path.name}"):
                    found.add(path.name.removesuffix("-v0"))
    return sorted(found)


@contextmanager
def minari_root_at(root: str | Path) -> Iterator[None]:
    """Point Minari (which reads MINARI_DATASETS_PATH at each call) at another root for a while."""
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
