"""A dataset recorded here, carried to another machine as its actions and made again there.

A device call carries at most 64 MiB, and a D4RL-sized dataset recorded here takes 140 to 200 MB
(over 64 MiB even compressed): nearly all of it is observations, which are a function of the
actions, the reset seeds and the simulator. So a carrier holds each episode's actions, its reset
seed and the flag it ended on, the dataset's metadata, and a digest of every array of every
episode. The other machine steps the same environment through the actions, checks the digest, and
only then writes the Minari dataset under the same id and metadata (recipes.write_in_place): the
same bits as recorded, or one line saying that the simulator stepped otherwise there (another
MuJoCo build or math library), and nothing written.

An episode recorded with a reset seed replays on its own. One without (a SAC run's replay buffer
resets its environment unseeded after the first episode) continues its predecessor's random
stream, so a seeded episode and the unseeded ones after it replay in order, in one process; those
chains replay in parallel. A dataset whose first episode has no seed (medium-expert, whose
episodes are copies) cannot be replayed: carry its parts and make it from them.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primal_dt.common.errors import DatasetError
from primal_dt.data.tasks import make_env, resolve_task

NO_SEED = -1  # an episode reset without a seed (continues its predecessor's stream)
ARRAYS = {  # what the digest covers, in the dtype Minari stores
    "observations": np.float64,
    "actions": np.float32,
    "rewards": np.float64,
    "terminations": np.bool_,
    "truncations": np.bool_,
}


@dataclass(frozen=True)
class About:
    """What the carrier says of its dataset besides the actions: enough to write it again."""

    dataset_id: str
    env_id: str
    algorithm_name: str
    description: str
    ref_min_score: float | None
    ref_max_score: float | None
    provenance: dict[str, Any] | None
    digest: str  # sha256 of every episode's arrays (digest())
    steps: int
    max_episode_steps: int | None  # the time limit it was recorded under (the env's own: None)


@dataclass(frozen=True)
class Carrier:
    """A dataset as its actions (steps, A), each episode's length, reset seed (NO_SEED: none) and
    final truncation flag (a step budget cuts the last episode where no time limit would)."""

    about: About
    actions: np.ndarray
    lengths: np.ndarray
    seeds: np.ndarray
    truncated: np.ndarray

    def write(self, path: Path) -> None:
        """One compressed .npz, written beside its name and renamed: never half a file."""
        partial = path.with_name(path.name + ".partial")
        with partial.open("wb") as file:
            np.savez_compressed(
                file,
                about=np.array(json.dumps(asdict(self.about))),
                actions=self.actions,
                lengths=self.lengths,
                seeds=self.seeds,
                truncated=self.truncated,
            )
        partial.replace(path)


def read_carrier(path: Path) -> Carrier:
    """The carrier `write` wrote, its arrays checked to agree with each other, or one line saying
    what is wrong with the file."""
    if not path.is_file():
        raise DatasetError(
            f"no carrier at {path}: primal-dt datasets carry ID --out FILE writes one"
        )
    try:
        with np.load(path, allow_pickle=False) as held:
            about = About(**json.loads(str(held["about"])))
            carrier = Carrier(
                about, held["actions"], held["lengths"], held["seeds"], held["truncated"]
            )
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
    ) as err:
        raise DatasetError(
            f"{path} is not a dataset carrier (primal-dt datasets carry writes one): {err}"
        ) from None
    episodes = len(carrier.lengths)
    if not (
        len(carrier.seeds) == len(carrier.truncated) == episodes
        and int(carrier.lengths.sum()) == len(carrier.actions) == about.steps
    ):
        raise DatasetError(f"{path} is damaged: its episodes' lengths, seeds and actions disagree")
    return carrier


def digest(episodes: Any) -> str:
    """sha256 of every episode's arrays, in order: Minari's EpisodeData and EpisodeBuffer alike."""
    found = hashlib.sha256()
    for episode in episodes:
        for name, dtype in ARRAYS.items():
            array: np.ndarray = np.ascontiguousarray(getattr(episode, name), dtype=dtype)
            found.update(f"{name}{array.shape}".encode())
            found.update(array.tobytes())
    return found.hexdigest()


def carry(name: str) -> Carrier:
    """The carrier of a dataset here (the Minari root or bundled), by id or task name."""
    from primal_dt.data.episodes import open_dataset

    ids = (name,) if "/" in name else resolve_task(name).dataset_ids
    if len(ids) != 1:
        raise DatasetError(
            f"{name} is read from {len(ids)} datasets ({', '.join(ids)}): carry each"
        )
    (dataset_id,) = ids
    dataset = open_dataset(dataset_id, download=False)
    metadata = dataset.storage.metadata
    count = metadata["total_episodes"]
    seeds = [e.get("seed") for e in dataset.storage.get_episode_metadata(range(count))]
    if count == 0:
        raise DatasetError(f"{dataset_id} holds no episode: nothing to carry")
    if seeds[0] is None:
        raise DatasetError(
            f"{dataset_id}'s first episode was reset without a seed, so replaying its actions "
            f"cannot make it again; carry the datasets it was made from (a medium-expert "
            f"dataset: its medium and expert parts) and make it from them there"
        )
    episodes = list(dataset.iterate_episodes())
    env_spec = json.loads(metadata["env_spec"])
    about = About(
        dataset_id=dataset_id,
        env_id=env_spec["id"],
        algorithm_name=metadata.get("algorithm_name", "unknown"),
        description=metadata.get("description", ""),
        ref_min_score=metadata.get("ref_min_score"),
        ref_max_score=metadata.get("ref_max_score"),
        provenance=metadata.get("provenance"),
        digest=digest(episodes),
        steps=int(metadata["total_steps"]),
        max_episode_steps=env_spec.get("max_episode_steps"),
    )
    return Carrier(
        about,
        actions=np.concatenate([e.actions for e in episodes]).astype(np.float32),
        lengths=np.array([len(e.rewards) for e in episodes], dtype=np.int64),
        seeds=np.array([NO_SEED if s is None else int(s) for s in seeds], dtype=np.int64),
        truncated=np.array([bool(e.truncations[-1]) for e in episodes]),
    )


def chains(seeds: np.ndarray) -> list[range]:
    """The episodes that replay in order in one process: each seeded one with the unseeded ones
    after it."""
    starts = [int(i) for i in np.flatnonzero(seeds != NO_SEED)]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(seeds)], strict=True)]


def _replay_chain(
    env_id: str, limit: int | None, chain: list[tuple[int, int, np.ndarray, bool]]
) -> list[Any]:
    """Step env_id through each (index, seed, actions, final truncation) of a chain, in order."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    env = make_env(env_id, limit)
    buffers = []
    try:
        for index, recorded, actions, truncated in chain:
            seed = None if recorded == NO_SEED else recorded
            observation, _ = env.reset(seed=seed)
            observations, rewards, terminations, truncations = [observation], [], [], []
            for action in actions:
                observation, reward, terminated, cut, _ = env.step(action)
                observations.append(observation)
                rewards.append(reward)
                terminations.append(terminated)
                truncations.append(cut)
            truncations[-1] = truncated
            buffers.append(
                EpisodeBuffer(
                    id=index,
                    seed=seed,
                    observations=np.asarray(observations),
                    actions=actions,
                    rewards=np.asarray(rewards),
                    terminations=np.asarray(terminations),
                    truncations=np.asarray(truncations),
                )
            )
    finally:
        env.close()
    return buffers


def replay(carrier: Carrier, workers: int = 1) -> list[Any]:
    """Every episode of the carrier stepped again, as Minari episode buffers in their order."""
    ends = np.cumsum(carrier.lengths)
    actions = np.split(carrier.actions, ends[:-1])
    work = [
        [(i, int(carrier.seeds[i]), actions[i], bool(carrier.truncated[i])) for i in chain]
        for chain in chains(carrier.seeds)
    ]
    env_id, limit = carrier.about.env_id, carrier.about.max_episode_steps
    if workers <= 1:
        done = [_replay_chain(env_id, limit, chain) for chain in work]
    else:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_replay_chain, [env_id] * len(work), [limit] * len(work), work))
    return [buffer for chain in done for buffer in chain]


def remake(path: Path, workers: int = 1, root: Path | None = None) -> str:
    """The carrier's dataset made again in the Minari root (root, else $MINARI_DATASETS_PATH) and
    checked against its digest; a dataset of that id already there must be the same one."""
    import minari

    from primal_dt.data.recipes import write_in_place
    from primal_dt.data.recording import write_dataset
    from primal_dt.data.sources import minari_root

    carrier = read_carrier(path)
    about = carrier.about
    root = Path(root or minari_root())
    if (root / about.dataset_id).exists():
        held = digest(minari.MinariDataset(root / about.dataset_id / "data").iterate_episodes())
        if held != about.digest:
            raise DatasetError(
                f"{root / about.dataset_id} holds another dataset than {path} carries; move it "
                f"away to make the carried one"
            )
        return about.dataset_id
    buffers = replay(carrier, workers)
    if digest(buffers) != about.digest:
        raise DatasetError(
            f"replaying {path} on this machine stepped {about.env_id} otherwise than where it was "
            f"recorded (another MuJoCo build or math library): carry the dataset's own files "
            f"instead; nothing was written"
        )
    write_in_place(
        root,
        about.dataset_id,
        False,
        lambda: write_dataset(
            about.dataset_id,
            about.env_id,
            buffers,
            ref_min_score=about.ref_min_score,
            ref_max_score=about.ref_max_score,
            algorithm_name=about.algorithm_name,
            description=about.description,
            provenance=about.provenance,
        ),
    )
    return about.dataset_id
