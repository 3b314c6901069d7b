"""The datasets the repository's studies record (scripts/results.py), from the behaviour policies
in tests/policies (tests/policies/README.md: how each was made, and what it reached).

<env>-medium: episodes of that environment's medium policy; <env>-medium-replay: every transition
of the SAC run that made the medium policy, trained again with the same seed, budget and one
thread, as D4RL made its medium-replay data; <env>-expert: episodes of the TQC expert in
tests/policies/tqc; <env>-medium-expert: the medium and expert datasets in one, equal in steps,
as D4RL's (a million steps of each). Every dataset of an environment is normalised with the same
reference scores (tests/policies/references.json), measured once for it.
"""

from __future__ import annotations

from pathlib import Path

# The repository's behaviour policies (a clone's tests/policies; not in an installed wheel), and
# the reference scores of each environment, measured once with its expert (data/references.py).
POLICIES = Path(__file__).resolve().parents[2] / "tests" / "policies"
REFERENCES = POLICIES / "references.json"
# Each environment recorded here, with the seed of the SAC run that made its medium policy.
RECORDED = {
    "halfcheetah": ("HalfCheetah-v5", 0),
    "hopper": ("Hopper-v5", 1),
    "walker2d": ("Walker2d-v5", 0),
}
QUALITIES = ("medium", "medium-replay", "medium-expert")
SAC_BUDGET = 120000  # SAC steps at most, as for the medium policies


def recorded_tasks(quality: str) -> list[str]:
    return [f"{name}-{quality}" for name in RECORDED]


def dataset_folder(root: Path, task: str) -> Path:
    """Where `datasets make` puts task's dataset under the Minari root."""
    name, _, quality = task.partition("-")
    return root / "primal-dt" / name / f"{quality}-v0"


def make_arguments(task: str, root: Path, steps: int) -> list[str] | None:
    """The `primal-dt datasets make` arguments that record task, or None for a task the studies do
    not record (it must then be in the Minari root already)."""
    name, _, quality = task.partition("-")
    if name not in RECORDED or quality not in ("expert", *QUALITIES):
        return None
    gym_id, sac_seed = RECORDED[name]
    common = [
        *("--env", name, "--expert-policy", str(POLICIES / "tqc" / f"{gym_id}.zip")),
        *("--reference", str(REFERENCES), "--no-progress"),
    ]
    if quality in ("medium", "expert"):
        policy = POLICIES / ("medium" if quality == "medium" else "tqc") / f"{gym_id}.zip"
        return [
            *common,
            *("--recipe", "policy", "--name", quality, "--steps", str(steps)),
            *("--policy", str(policy)),
        ]
    if quality == "medium-expert":
        return [*common, "--recipe", "medium-expert", "--offline"]
    return [
        *common,
        *("--recipe", "medium-replay", "--seed", str(sac_seed)),
        *("--max-steps", str(SAC_BUDGET)),
        *("--policy-out", str(root.parent / "replay-policies" / f"{gym_id}.zip")),
    ]


def recording_stages(tasks: list[str]) -> list[list[str]]:
    """The datasets to record for tasks, in two stages: first every single dataset (a
    combination's parts among them), then the combinations (medium-expert), which read them."""
    combined = [task for task in tasks if task.endswith("-medium-expert")]
    parts = [
        task.replace("-medium-expert", f"-{part}")
        for task in combined
        for part in ("medium", "expert")
    ]
    single = [task for task in tasks if task not in combined]
    return [list(dict.fromkeys([*single, *parts])), combined]
