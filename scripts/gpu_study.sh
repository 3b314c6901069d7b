#!/usr/bin/env bash
# The matched comparison at the papers' budget, one task per device call (docs/results.md, "At the
# papers' budget"): matched-softmax, matched-primal and matched-bc (configs/matched.toml with
# primal_dt/tools/papers_budget.toml over it: embed 128, 100,000 steps at batch 64), SEEDS seeds
# each, every config's seeds one pack on the GPU, evaluated during training and at the end.
#
#   bash scripts/gpu_study.sh --prepare TASK   # here: .gpu/study/ gets TASK's dataset as its
#                                              # actions (datasets carry) and the three configs
#   bash scripts/gpu_study.sh TASK             # on the device, after the install (docs/
#                                              # development.md, "The device call"): remake the
#                                              # dataset, train, and put the runs' data in $OUT
#   bash scripts/gpu_study.sh --take ARCHIVE   # here: the runs' data into results-data/, and
#                                              # the section written from it (results.py)
#   bash scripts/gpu_study.sh --dry-run        # here, in CI: every step on the CPU at a tiny size
#
# The device's image lacks the report's statistics packages, so it only trains and sends back each
# run's records (`primal-dt report --data-only`); the report, the section and its figures are made
# here from them, as from every section's kept data. SEEDS (default 0,...,9), STEPS (default the
# budget's), PARALLEL (packs at once, default 3: one per config) and LIMIT (the sweep's seconds,
# default 480 of a 600 s call) may be set: how many seeds fit a call is for the pack rate that
# scripts/gpu_check.sh measures (docs/benchmarks.md) to say, which no device has measured yet.
set -euo pipefail
SEEDS=${SEEDS:-0,1,2,3,4,5,6,7,8,9}
PARALLEL=${PARALLEL:-3}
STUDY=.gpu/study

# As a module, not the console script: the device's image runs the checkout from PYTHONPATH.
primal_dt() { python3 -m primal_dt.cli "$@"; }
section_of() { echo "results-budget-${1%%-*}"; }  # hopper-medium -> results-budget-hopper

prepare() {  # TASK [ROOT]: the carrier and the configs, from the dataset in ROOT's Minari root
    local task=$1
    mkdir -p "$STUDY"
    primal_dt datasets carry "$task" --out "$STUDY/$task.npz"
    python3 -c "import sys
from pathlib import Path
from primal_dt.tools.study_configs import bc_config, matched_config
out = Path(sys.argv[1])
for path in (matched_config(out, 'softmax', True), matched_config(out, 'primal', True), bc_config(out, True)):
    print(path)" "$STUDY"
}

train() {  # TASK DEVICE OUT [SET...]: remake, sweep, and the runs' data as OUT/<section>.tar.gz
    local task=$1 device=$2 out=$3 work
    shift 3
    work=$(mktemp -d)
    export MINARI_DATASETS_PATH=$work/minari
    primal_dt datasets remake "$STUDY/$task.npz" --workers "$(nproc)"
    local configs
    configs=$(ls "$STUDY"/budget-configs/matched-{softmax,primal,bc}.toml | paste -sd,)
    local steps=()
    [ -n "${STEPS:-}" ] && steps=(--steps "$STEPS")
    # Stopped at LIMIT seconds (SIGINT: every run checkpoints and stops), so that the runs' data
    # still goes back inside the device call; a run stopped early says so in its records.
    timeout -s INT -k 60 "${LIMIT:-480}" python3 -m primal_dt.cli sweep --tasks "$task" --seeds "$SEEDS" \
        --configs "$configs" --runs-dir "$work/runs" --device "$device" --parallel "$PARALLEL" \
        --offline "${steps[@]}" "$@" || echo "the sweep stopped early (exit $?): sending what it made"
    primal_dt report "$work/runs" --out "$work/report" --data-only
    local section
    section=$(section_of "$task")
    mv "$work/report/runs" "$work/report/$section"
    tar -czf "$out/$section.tar.gz" -C "$work/report" "$section"
    echo "the runs' data: $out/$section.tar.gz"
    rm -rf "$work"
}

take() {  # ARCHIVE [DATA]: unpack into DATA (results-data), then write its section from it
    local archive=$1 data=${2:-results-data} section
    section=$(basename "$archive" .tar.gz)
    mkdir -p "$data"
    rm -rf "${data:?}/$section"
    tar -xzf "$archive" -C "$data"
    python scripts/results.py --from-data "$data/$section" --out "${RESULTS_OUT:-results}" \
        ${WRITE_DOCS---write-docs}
}

case ${1:-} in
    --prepare) prepare "${2:?--prepare TASK}" ;;
    --take) take "${2:?--take ARCHIVE}" ;;
    --dry-run)
        # The same steps at a tiny size on this CPU: a short hopper-medium recorded here, carried
        # and made again, a pack of two seeds per config for a few steps, its data taken back into
        # a scratch results-data and its section made (printed, nothing written to the docs).
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        export MINARI_DATASETS_PATH=$scratch/here
        P=tests/policies
        primal_dt datasets make --env hopper --recipe policy --name medium --steps 400 \
            --policy $P/medium/Hopper-v5.zip --reference $P/references.json \
            --expert-policy $P/tqc/Hopper-v5.zip --no-progress
        STUDY=$scratch/study prepare hopper-medium
        mkdir -p "$scratch/out"
        STUDY=$scratch/study SEEDS=0,1 STEPS=4 PARALLEL=1 train hopper-medium cpu "$scratch/out" \
            --pack 2 --set model.embed_dim=16 --set eval.episodes=1 --set eval.final_episodes=1 \
            --set train.eval_every=2 --set train.ckpt_every=2 --set eval.service=inline
        WRITE_DOCS= RESULTS_OUT=$scratch/results \
            take "$scratch/out/$(section_of hopper-medium).tar.gz" "$scratch/data"
        ;;
    -*|"") echo "gpu_study.sh: use TASK, --prepare TASK, --take ARCHIVE or --dry-run"; exit 2 ;;
    *)
        python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
        # The whole step compiled with CUDA graphs (docs/training.md, "Compiled training").
        train "$1" cuda "${OUT:?set OUT: where the device call returns files}" \
            --set train.compile=true --set train.compile_mode=reduce-overhead
        ;;
esac
