"""Record the dataset shipped inside the package: primal-dt/hopper/bundled-v0 (task hopper-bundled).

Small enough to ship (about 2.5 MB), big enough to train on: 16000 steps of Hopper-v5 with the SAC
policy of tests/policies (a "medium" policy: mean return about 1700, wide spread), stochastic
actions, episodes seeded 0, 1, 2...; reference scores measured on Hopper-v5 over 10 episodes each of
uniform-random actions and of the TQC expert policy. Everything is recorded in its provenance.

Run from the repository root:  python3 scripts/make_bundled_dataset.py [--policies DIR]
"""

from __future__ import annotations

import argparse
import os

from primal_dt.data.recipes import MakeOptions, make_dataset
from primal_dt.data.sources import BUNDLED_ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="tests/policies", help="SB3 policies folder")
    args = parser.parse_args()
    options = MakeOptions(
        env="hopper",
        recipe="policy",
        name="bundled",
        policy=os.path.join(args.policies, "sac", "Hopper-v5.zip"),
        steps=16000,
        seed=0,
        expert_policy=os.path.join(args.policies, "tqc", "Hopper-v5.zip"),
        ref_episodes=10,
        root=str(BUNDLED_ROOT),
        force=True,
    )
    make_dataset(options, log=print, progress=True)


if __name__ == "__main__":
    main()
