#!/usr/bin/env bash
# The CUDA path of primal-dt on a machine with an NVIDIA GPU: bf16 autocast, fused AdamW and
# device-resident sampling, train -> checkpoint -> eval at the Primal paper's model size.
# Run from the repository root after `pip install -e ".[test]"`:  bash scripts/gpu_check.sh
# Datasets are recorded here (no network): the SB3 expert policy of ../shared/policies (or
# $PRIMAL_DT_POLICIES) where present, a uniform-random policy otherwise. Takes a few minutes.
set -euo pipefail
work=$(mktemp -d)
export MINARI_DATASETS_PATH="$work/minari"
export PRIMAL_DT_POLICIES="${PRIMAL_DT_POLICIES:-$(cd .. && pwd)/shared/policies}"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
python3 - <<'PY'
import os
from pathlib import Path

import gymnasium as gym

from primal_dt.recording import random_policy, record_episodes, sb3_policy, write_dataset

policy_file = Path(os.environ["PRIMAL_DT_POLICIES"]) / "tqc" / "Hopper-v5.zip"
if policy_file.is_file():
    policy, name = sb3_policy(policy_file), "TQC"
else:
    policy, name = random_policy(gym.make("Hopper-v5").action_space, 0), "random"
buffers = record_episodes("Hopper-v5", policy, episodes=20, seed=0)
write_dataset("mujoco/hopper/expert-v0", "Hopper-v5", buffers, algorithm_name=name)
print(f"recorded {sum(len(b.rewards) for b in buffers)} steps with the {name} policy")
PY
primal-dt train --env hopper-expert --offline --device cuda --steps 5000 --no-progress \
    --run-dir "$work/run" --set train.warmup_steps=500 --set train.eval_every=5000 \
    --set train.log_every=500 --set eval.episodes=10
primal-dt eval --ckpt "$work/run" --device cuda --episodes 10 --json
python3 - "$work/run" <<'PY'
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

events = EventAccumulator(sys.argv[1])
events.Reload()
rates = [e.value for e in events.Scalars("train/steps_per_sec")][1:]
print(f"training steps per second on CUDA (Primal paper size, batch 64, K 20): {max(rates):.0f}")
PY
