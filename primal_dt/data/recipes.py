"""`primal-dt datasets make`: D4RL-style Minari datasets recorded here, by recipe.

Made datasets are written as `primal-dt/<env>/<quality>-v0` in the Minari root, first into a hidden
staging folder there and then renamed into place, so a failed or interrupted recording never leaves
a half-written dataset. Recipes (after D4RL, Fu et al. 2020):

- policy: episodes of a Stable-Baselines3 policy file (SAC or TQC), stochastic or deterministic;
- random: uniform-random actions (D4RL's "random"; Minari's "simple" is a weak policy instead);
- medium-replay: every transition a SAC agent saw while training up to a "medium" return;
- medium-expert: the medium and expert datasets combined into one.

Reference scores, when an expert policy is given, are measured on the v5 environment: the mean
return of uniform-random actions and of the expert, stored as ref_min_score / ref_max_score.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from primal_dt.common.errors import DatasetError, TaskError, did_you_mean
from primal_dt.data.episodes import open_dataset
from primal_dt.data.recording import (
    action_space,
    mean_return,
    policy_record,
    random_policy,
    record_episodes,
    sb3_policy,
    sha256,
    versions,
    write_dataset,
)
from primal_dt.data.references import Reference, reference_for
from primal_dt.data.sources import local_id, minari_root, minari_root_at, origin
from primal_dt.data.tasks import EnvInfo, load_envs, resolve_dataset_ids

RECIPES = ("policy", "random", "medium-replay", "medium-expert")
DEFAULT_QUALITY = {q: q for q in ("random", "medium-replay", "medium-expert")}  # policy: --name
DEFAULT_STEPS = 1_000_000  # D4RL's and Minari's MuJoCo datasets hold a million steps
Log = Callable[[str], None]


@dataclass
class MakeOptions:
    """What `primal-dt datasets make` was asked for (see the module docstring for the recipes)."""

    env: str
    recipe: str
    name: str | None = None  # the quality in primal-dt/<env>/<name>-v0; default from the recipe
    policy: str | None = None
    episodes: int | None = None
    steps: int | None = None
    deterministic: bool = False
    seed: int = 0
    expert_policy: str | None = None
    ref_episodes: int = 10
    reference: str | None = None  # a references file (references.py): its pair, not measured
    target_return: float | None = None  # medium-replay: default a third of the expert reference
    max_steps: int = 1_000_000
    eval_every: int = 5000
    eval_episodes: int = 5
    learning_starts: int = 10000
    policy_out: str | None = None  # medium-replay: where the reached policy goes
    download: bool = True  # medium-expert: fetch official parts missing here (--offline: never)
    force: bool = False
    root: str | None = None  # the Minari root to write to (default: minari_root())


def _check(options: MakeOptions) -> tuple[EnvInfo, str, Reference | None]:
    """Refuse bad combinations before anything slow runs; returns the env, the dataset id and
    the --reference file's reference scores (None without one), read and checked once here."""
    env = load_envs().get(options.env)
    if env is None:
        envs = list(load_envs())
        raise TaskError(
            f"unknown env {options.env!r}{did_you_mean(options.env, envs)}: one of {', '.join(envs)}"
        )
    _check_recipe(options)
    name = options.name or DEFAULT_QUALITY.get(options.recipe)
    if name is None:
        raise DatasetError(
            "--recipe policy needs --name QUALITY (e.g. medium or expert): the dataset is "
            f"{local_id(env.name, 'QUALITY')}"
        )
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) or re.search(r"-v\d+$", name):
        raise DatasetError(
            f"--name {name!r} must be lower-case words joined by '-' (e.g. medium), no version"
        )
    for label, path in (("--policy", options.policy), ("--expert-policy", options.expert_policy)):
        if path and not Path(path).is_file():
            raise DatasetError(f"{label} {path}: no such file")
    if options.reference and not options.expert_policy:
        raise DatasetError("--reference FILE gives the expert's scores: give --expert-policy too")
    given = None  # read and checked now, not after an hour of recording; then used as read
    if options.reference:
        given = reference_for(Path(options.reference), env.gym_id, options.expert_policy or "")
    _check_counts(options)
    dataset_id = local_id(env.name, name)
    root = Path(options.root or minari_root())
    if (root / dataset_id).exists() and not options.force:
        raise DatasetError(
            f"dataset {dataset_id} already exists in {root}; pass --force to replace it"
        )
    return env, dataset_id, given


def _check_recipe(options: MakeOptions) -> None:
    """The recipe is known and given the options it takes, and only those."""
    if options.recipe not in RECIPES:
        raise DatasetError(
            f"unknown recipe {options.recipe!r}{did_you_mean(options.recipe, RECIPES)}: one of "
            f"{', '.join(RECIPES)}"
        )
    if options.recipe == "policy" and not options.policy:
        raise DatasetError("--recipe policy needs --policy FILE (a Stable-Baselines3 .zip)")
    if options.recipe != "policy" and options.policy:
        raise DatasetError(f"--policy is for --recipe policy, not {options.recipe}")
    recorded = options.recipe in ("policy", "random")
    if not recorded and (options.episodes or options.steps):
        raise DatasetError(
            f"--episodes/--steps are for the policy and random recipes, not {options.recipe}"
        )
    if options.episodes is not None and options.steps is not None:
        raise DatasetError("give --episodes N or --steps N, not both")


def _check_counts(options: MakeOptions) -> None:
    """Every count given is positive."""
    for label, value in (
        ("--episodes", options.episodes),
        ("--steps", options.steps),
        ("--ref-episodes", options.ref_episodes),
        ("--max-steps", options.max_steps),
        ("--eval-every", options.eval_every),
        ("--eval-episodes", options.eval_episodes),
    ):
        if value is not None and value <= 0:
            raise DatasetError(f"{label} must be > 0, got {value}")


def _reference(
    options: MakeOptions, env: EnvInfo, log: Log, given: Reference | None
) -> dict[str, Any] | None:
    """Mean returns of uniform-random actions and of the expert policy, measured on v5 (or given:
    the --reference file's, measured once for the environment: references.py)."""
    if given is not None:
        return given.provenance()
    if not options.expert_policy:
        return None
    n = options.ref_episodes
    log(f"measuring reference scores on {env.gym_id}: {n} random and {n} expert episodes")
    space = action_space(env.gym_id)
    random_seed = options.seed + 100_000
    low = mean_return(env.gym_id, random_policy(space, random_seed), n, seed=random_seed)
    expert_seed = options.seed + 200_000
    expert = sb3_policy(options.expert_policy, False, expert_seed, env.gym_id)
    high = mean_return(env.gym_id, expert, n, seed=expert_seed)
    name = _short(options.expert_policy)
    return {
        "random": low,
        "expert": high,
        "episodes": n,
        "expert_policy": policy_record(options.expert_policy, deterministic=False),
        "how": f"measured on {env.gym_id}: mean return over {n} episodes of uniform-random "
        f"actions and of {name} (stochastic actions)",
    }


def _short(path: str) -> str:
    """sac/Hopper-v5.zip: enough of a policy path to tell it apart in a one-line description."""
    return "/".join(Path(path).parts[-2:])


def _record(options: MakeOptions, env: EnvInfo, dataset_id: str, log: Log, progress: bool):
    """The recipe's episodes, algorithm name, description and recipe-specific provenance."""
    count = (
        {"episodes": options.episodes}
        if options.episodes
        else {"steps": options.steps or DEFAULT_STEPS}
    )
    if options.recipe == "policy":
        assert options.policy is not None
        policy = sb3_policy(options.policy, options.deterministic, options.seed, env.gym_id)
        buffers = record_episodes(env.gym_id, policy, seed=options.seed, progress=progress, **count)
        used = policy_record(options.policy, options.deterministic)
        mode = "deterministic" if options.deterministic else "stochastic"
        about = f"{used['algorithm']} policy {_short(options.policy)}, {mode} actions"
        return buffers, used["algorithm"], about, {"policy": used, **count}
    if options.recipe == "random":
        space = action_space(env.gym_id)
        policy = random_policy(space, options.seed)
        buffers = record_episodes(env.gym_id, policy, seed=options.seed, progress=progress, **count)
        return buffers, "random", "uniform-random actions", {"policy": "uniform-random", **count}
    if options.recipe == "medium-replay":
        return _medium_replay(options, env, dataset_id, log)
    return _medium_expert(options, env)


def _medium_replay(options: MakeOptions, env: EnvInfo, dataset_id: str, log: Log):
    try:
        from primal_dt.data.replay import train_sac_replay
    except ImportError:
        raise DatasetError(
            "--recipe medium-replay trains SAC and needs pip install 'primal-dt[record]'"
        ) from None
    target = options.target_return
    if target is None:
        target = round(env.ref_expert / 3, 1)
    log(
        f"training SAC on {env.gym_id} until its evaluation return reaches {target} "
        f"or {options.max_steps} steps"
    )
    sac_training = train_sac_replay(
        env.gym_id,
        target,
        options.max_steps,
        seed=options.seed,
        eval_every=options.eval_every,
        eval_episodes=options.eval_episodes,
        learning_starts=options.learning_starts,
        log=log,
    )
    root = Path(options.root or minari_root())
    policy_out = Path(options.policy_out or root / f"{dataset_id}-medium-policy.zip")
    policy_out.parent.mkdir(parents=True, exist_ok=True)
    sac_training.model.save(policy_out)
    outcome = "reached" if sac_training.reached else "did not reach"
    log(f"{outcome} {target} after {sac_training.steps} steps; policy saved to {policy_out}")
    training = {
        "algorithm": "SAC (stable-baselines3 defaults, MlpPolicy)",
        "target_return": target,
        "max_steps": options.max_steps,
        "learning_starts": options.learning_starts,
        "eval_every": options.eval_every,
        "eval_episodes": options.eval_episodes,
        "eval_deterministic": True,
        "steps": sac_training.steps,
        "reached": sac_training.reached,
        "eval_history": [[step, value] for step, value in sac_training.history],
        "medium_policy": {"file": str(policy_out), "sha256": sha256(policy_out)},
    }
    about = f"every transition of SAC training until return {target} ({sac_training.steps} steps)"
    return sac_training.episodes, "SAC (training replay)", about, {"training": training}


def _medium_expert(options: MakeOptions, env: EnvInfo):
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers: list[Any] = []
    sources = []
    for part in ("medium", "expert"):
        (dataset_id,) = resolve_dataset_ids(env, part)
        dataset = open_dataset(dataset_id, options.download)
        metadata = dataset.storage.metadata
        sources.append(
            {
                "id": dataset_id,
                "origin": origin(dataset_id),
                "episodes": metadata["total_episodes"],
                "steps": metadata["total_steps"],
                "ref_min_score": metadata.get("ref_min_score"),
                "ref_max_score": metadata.get("ref_max_score"),
                "provenance": metadata.get("provenance"),
            }
        )
        for episode in dataset.iterate_episodes():
            buffers.append(
                EpisodeBuffer(
                    id=len(buffers),
                    observations=episode.observations,
                    actions=episode.actions,
                    rewards=episode.rewards,
                    terminations=episode.terminations,
                    truncations=episode.truncations,
                )
            )
    about = f"{sources[0]['id']} and {sources[1]['id']} combined"
    return buffers, "medium + expert", about, {"sources": sources}


def _copied_reference(extra: dict[str, Any]) -> dict[str, Any] | None:
    """medium-expert without an expert policy: the expert part's own scores, else the medium's."""
    for source in reversed(extra.get("sources", [])):
        if source["ref_min_score"] is not None and source["ref_max_score"] is not None:
            return {
                "random": source["ref_min_score"],
                "expert": source["ref_max_score"],
                "how": f"copied from the metadata of {source['id']}",
            }
    return None


def make_dataset(
    options: MakeOptions, log: Log = lambda message: None, progress: bool = False
) -> str:
    """Record the recipe's dataset into the Minari root; returns its id."""
    env, dataset_id, given = _check(options)
    buffers, algorithm, about, extra = _record(options, env, dataset_id, log, progress)
    reference = _reference(options, env, log, given) or _copied_reference(extra)
    provenance = {
        "recipe": options.recipe,
        "env_id": env.gym_id,
        "seed": options.seed,
        **extra,
        "reference": reference,
        "made_by": "primal-dt datasets make",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
    }
    steps = sum(len(b.rewards) for b in buffers)
    root = Path(options.root or minari_root())
    description = f"primal-dt {options.recipe} recipe on {env.gym_id}: {about}"
    write_in_place(
        root,
        dataset_id,
        options.force,
        lambda: write_dataset(
            dataset_id,
            env.gym_id,
            buffers,
            ref_min_score=reference["random"] if reference else None,
            ref_max_score=reference["expert"] if reference else None,
            algorithm_name=algorithm,
            description=description,
            provenance=provenance,
        ),
    )
    log(f"wrote {dataset_id}: {len(buffers)} episodes, {steps} steps, in {root}")
    return dataset_id


def write_in_place(root: Path, dataset_id: str, force: bool, write: Callable[[], Any]) -> None:
    """Run `write` into a hidden staging root, then rename the dataset into `root` in one step."""
    final = root / dataset_id
    if final.exists() and not force:
        raise DatasetError(f"dataset {dataset_id} already exists in {root}; pass --force")
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".primal-dt-staging-", dir=root))
    try:
        with minari_root_at(staging):
            write()
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            final.rename(staging / "replaced")
        (staging / dataset_id).rename(final)
        for folder in (final.parent, final.parent.parent):  # Minari's namespace markers
            marker = folder / "namespace_metadata.json"
            if folder != root and not marker.exists():
                marker.write_text("{}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
