#!/usr/bin/env bash
# The Primal-Attention paper's D4RL locomotion experiment on one GPU: halfcheetah, hopper, walker2d
# x medium, medium-replay, medium-expert x DT, Primal-DT x seeds 0, 1, 2 (54 runs of 100k steps),
# then the score table, learning curves and attention spectra (primal-dt report).
#
#   pip install -e ".[download,record,report]"
#   bash scripts/reproduce_paper.sh                     # extra arguments go to primal-dt sweep,
#   RUNS=runs/paper PARALLEL=6 bash scripts/reproduce_paper.sh --offline   # e.g. --offline
#
# Datasets. medium and expert are Minari's official v5 datasets, downloaded on first use (network
# and the [download] extra; or copy them into $MINARI_DATASETS_PATH and pass --offline);
# medium-expert is the two combined. Minari has no medium-replay for v5: it is recorded here with
# `primal-dt datasets make --env ENV --recipe medium-replay` (a SAC agent's replay buffer up to a
# medium return, the [record] extra), which trains SAC on the CPU: hours per environment. Made once,
# it is found by name afterwards. Pass MEDIUM_REPLAY_ARGS (e.g. "--expert-policy FILE" to measure
# v5 reference scores) to the make command.
#
# Expected wall-clock time, from one run's rate measured on an H200 (docs/benchmarks.md, its CUDA
# training table: bf16, batch 64, K 20): eager, DT trains 89 steps/s at the DT paper's size and
# Primal-DT 73 at the Primal paper's (the GPU waits on kernel launches, not arithmetic), so the 54
# runs one after another take about 19 hours. Compiled with CUDA graphs
# (`--set train.compile=true --set train.compile_mode=reduce-overhead`), about 7 hours, at the 239
# and 188 steps/s measured when it compiled the model alone (it now compiles the whole step, not
# yet timed on a GPU). How much 6 runs sharing the GPU (--parallel) gain is not measured: if eager throughput
# grows 3 to 5 times (the GPU idles between one process's launches), the sweep takes about 4 to 6
# hours eager; evaluations (10 during training and a final one of 100 episodes per target, in a
# process beside each run) add CPU load and the tail of the last runs. Measure your machine's
# single-run rate with scripts/bench_train.py and scale:
# hours ~ 54 x 100000 / (rate x speed-up from --parallel) / 3600.
set -euo pipefail
RUNS="${RUNS:-runs/paper}"
PARALLEL="${PARALLEL:-6}"
ENVS=(halfcheetah hopper walker2d)
QUALITIES=(medium medium-replay medium-expert)

for env in "${ENVS[@]}"; do
    if ! primal-dt datasets info "$env-medium-replay" > /dev/null 2>&1; then
        echo "recording $env-medium-replay (SAC training: hours on a CPU)"
        # shellcheck disable=SC2086
        primal-dt datasets make --env "$env" --recipe medium-replay ${MEDIUM_REPLAY_ARGS:-}
    fi
done

tasks=()
for env in "${ENVS[@]}"; do
    for quality in "${QUALITIES[@]}"; do
        tasks+=("$env-$quality")
    done
done

# Interrupted? Run this script again: finished runs are skipped, the others resume.
primal-dt sweep --tasks "$(IFS=,; echo "${tasks[*]}")" --seeds 0,1,2 --configs dt,primal-dt \
    --runs-dir "$RUNS" --parallel "$PARALLEL" --device cuda "$@"
primal-dt report "$RUNS"
echo "table: $RUNS/report/report.md; dashboards: tensorboard --logdir $RUNS"
