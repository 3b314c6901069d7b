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
# here from them, as from every section's kept data: one call makes one task's whole section.
# SEEDS (default 0,...,9), STEPS (default the budget's), PARALLEL (packs at once, default 3: one
# per config) and CALL (the seconds from the remake on, default 560 of a 600 s call) may be set.
# The sweep gets what is left of CALL after the remake, less RESERVE (default 120) for the report
# and the archive; how many seeds fit is for the pack rates of scripts/gpu_check.sh (docs/
# benchmarks.md) to say, which no device has measured yet. A sweep stopped at its limit leaves runs without a final evaluation,
# which --take refuses: train that task again with fewer seeds.
set -euo pipefail
SEEDS=${SEEDS:-0,1,2,3,4,5,6,7,8,9}
PARALLEL=${PARALLEL:-3}
STUDY=.gpu/study
CARRY_LIMIT=$((64 * 1024 * 1024))  # what a device call carries

# As a module, not the console script: the device's image runs the checkout from PYTHONPATH.
primal_dt() { python3 -m primal_dt.cli "$@"; }
section_of() { echo "results-budget-${1%%-*}"; }  # hopper-medium -> results-budget-hopper

prepare() {  # TASK: the carrier and the configs, from the dataset in the Minari root
    local task=$1
    mkdir -p "$STUDY"
    rm -f "$STUDY"/*.npz  # one task a call: the carry holds its dataset alone
    primal_dt datasets carry "$task" --out "$STUDY/$task.npz"
    python3 -c "import sys
from pathlib import Path
from primal_dt.tools.study_configs import bc_config, matched_config
out = Path(sys.argv[1])
for path in (matched_config(out, 'softmax', True), matched_config(out, 'primal', True), bc_config(out, True)):
    print(path)" "$STUDY"
    local carried
    carried=$(du -sb "$(dirname "$STUDY")" | cut -f1)
    if [ "$carried" -gt $CARRY_LIMIT ]; then
        echo "gpu_study.sh: $(dirname "$STUDY") holds $carried bytes, over the 64 MiB a call carries" >&2
        exit 1
    fi
}

train() {  # TASK DEVICE OUT [SET...]: remake, sweep, and the runs' data as OUT/<section>.tar.gz
    local task=$1 device=$2 out=$3 work started=$SECONDS
    shift 3
    work=$(mktemp -d)
    export MINARI_DATASETS_PATH=$work/minari
    primal_dt datasets remake "$STUDY/$task.npz" --workers "$(nproc)"
    echo "=== the dataset made again in $((SECONDS - started)) s"
    local configs steps=() limit rc=0
    configs=$(ls "$STUDY"/budget-configs/matched-{softmax,primal,bc}.toml | paste -sd,)
    [ -n "${STEPS:-}" ] && steps=(--steps "$STEPS")
    limit=$(( ${CALL:-560} - (SECONDS - started) - ${RESERVE:-120} ))
    if [ "$limit" -lt 60 ]; then echo "gpu_study.sh: $limit s left for the sweep; raise CALL" >&2; return 1; fi
    echo "=== the sweep, stopped at $limit s (SIGTERM: every run checkpoints and stops)"
    timeout -s TERM -k 45 "$limit" python3 -m primal_dt.cli sweep --tasks "$task" \
        --seeds "$SEEDS" --configs "$configs" --runs-dir "$work/runs" --device "$device" \
        --parallel "$PARALLEL" --offline "${steps[@]}" "$@" || rc=$?
    echo "=== the sweep ended at $((SECONDS - started)) s (exit $rc; 124: stopped at its limit)"
    local reported=$SECONDS
    primal_dt report "$work/runs" --out "$work/report" --data-only
    local section
    section=$(section_of "$task")
    mv "$work/report/runs" "$work/report/$section"
    tar -czf "$out/$section.tar.gz" -C "$work/report" "$section"
    echo "=== the runs' data in $((SECONDS - reported)) s: $out/$section.tar.gz"
    rm -rf "$work"
    return $rc
}

take() {  # ARCHIVE [DATA]: its section written from it, then its data kept in DATA (results-data)
    local archive=$1 data=${2:-results-data} section unpacked
    section=$(tar -tzf "$archive" | sed -n 1p | cut -d/ -f1)  # sed reads all: no SIGPIPE under pipefail
    if [[ $section != results-budget-* ]]; then
        echo "gpu_study.sh: $archive holds $section, not a results-budget-<env> section" >&2
        exit 2
    fi
    unpacked=$(mktemp -d)
    tar -xzf "$archive" -C "$unpacked"
    python3 scripts/results.py --from-data "$unpacked/$section" --out "${RESULTS_OUT:-results}" \
        ${WRITE_DOCS---write-docs} || { rm -rf "$unpacked"; exit 1; }
    mkdir -p "$data"
    rm -rf "${data:?}/$section"  # the section's runs are one call's, whole
    mv "$unpacked/$section" "$data/$section"
    rm -rf "$unpacked"
    if [ -n "${WRITE_DOCS---write-docs}" ]; then  # the first screens, now with this section's runs
        python3 scripts/results.py --refresh
    fi
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
        STUDY=$scratch/carry/study prepare hopper-medium
        mkdir -p "$scratch/out"
        STUDY=$scratch/carry/study SEEDS=0,1 STEPS=4 PARALLEL=1 train hopper-medium cpu "$scratch/out" \
            --pack 2 --set model.embed_dim=16 --set eval.episodes=1 --set eval.final_episodes=1 \
            --set train.eval_every=2 --set train.ckpt_every=2 --set eval.service=inline
        WRITE_DOCS= RESULTS_OUT=$scratch/results \
            take "$scratch/out/$(section_of hopper-medium).tar.gz" "$scratch/data"
        ;;
    -*|"") echo "gpu_study.sh: use TASK, --prepare TASK, --take ARCHIVE or --dry-run" >&2; exit 2 ;;
    *)
        python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
        # The whole step compiled with CUDA graphs (docs/training.md, "Compiled training").
        train "$1" cuda "${OUT:?set OUT: where the device call returns files}" \
            --set train.compile=true --set train.compile_mode=reduce-overhead
        ;;
esac
