#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the CUDA path checked and timed, in the order of what matters
# most, so that a step cut short leaves the evidence of the steps before it. Two device calls of at
# most 10 minutes each (docs/development.md, "The device call"), the steps in two parts:
#   part 1, `--only pack,fast,layers` (450 s of limits):
#     pack:   the pack benchmark at the DT paper's size: one run and packs of 32 and 128, the
#             whole step compiled (reduce-overhead) and eager, 500 steps or 60 s each; the
#             model-only compiled step of before; its table goes into docs/benchmarks.md
#     fast:   the fast-path tests (the compiled whole step against eager, no host sync) and the
#             pack tests on CUDA
#     layers: the layer and model tests (every attention kind, eager) on CUDA
#   part 2, `--only train,rest,eval` (370 s): the training benchmark (eager and compiled,
#     both papers' sizes), the rest of the test suite and the evaluation benchmark
# The attention and context-length benchmarks (`--only attention,context`) measured the same in
# three runs, and are left out of the two parts.
# Each step has a time limit, set from its cost (docs/development.md, "The GPU check's budget").
# Every step runs even if an earlier one fails; the exit status says whether all passed. Set
# WRITE_DOCS= (empty) to only print the tables.
#
#   bash scripts/gpu_check.sh --only STEP,...  # on the GPU machine, after the install
#   bash scripts/gpu_check.sh                  # every step (over 10 minutes on an H200)
#   bash scripts/gpu_check.sh --dry-run        # here, on a CPU: every step at a tiny size, same
#                                              # code paths, nothing written: the script's own
#                                              # logic, and a step whose CPU time is over 70% of
#                                              # its budget fails (.ci/run runs it, so that a step
#                                              # outgrowing its budget fails here, whatever else
#                                              # the machine runs: CPU seconds of work, not wall
#                                              # time)
#
# A step past its limit gets SIGINT first, so that pytest still prints the tests that failed; the
# test steps print each test's name and outcome as it ends (-v), so a cut log names them too.
#
# The tests record their own datasets (no network) with the policies in tests/policies. The GPU
# image lacks the video, ray and report (rliable) extras (too large to carry) and Sphinx (the docs
# tests read the config comments with it): their tests, none of which touches CUDA, are left out by
# name here, and run in CI.
set -uo pipefail
dry=0 only=""
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1 ;;
        --only) only=",${2:-},"
            for key in ${only//,/ }; do
                case $key in pack|fast|layers|train|rest|eval|attention|context) ;;
                    *) echo "gpu_check.sh: unknown step '$key' (steps: pack fast layers train rest eval attention context)"; exit 2 ;;
                esac
            done
            shift ;;
        *) echo "gpu_check.sh: unknown argument '$1' (use --dry-run or --only STEP,...)"; exit 2 ;;
    esac
    shift
done
# Every step runs with the command line's OpenMP waits (primal_dt/common/cpu.py: a short spin,
# then sleep; none added where the caller set one): a benchmark then times what `primal-dt` does,
# and the dry run's CPU seconds count work, not threads spinning while another process holds a
# core (docs/development.md, "The GPU check's budget"). `--only ''` runs no step and prints them.
waits=$(python3 -c "import os; from primal_dt.common.cpu import wait_settings
print(' '.join(f'{k}={v}' for k, v in wait_settings(os.environ).items()))") || exit 1
[ -z "$waits" ] || export ${waits?}
echo "=== OpenMP waits:" $(env | grep -E "^(OMP_WAIT_POLICY|GOMP_SPINCOUNT|KMP_BLOCKTIME)=" | sort)  # as the steps see them
status=0
cpu_seconds() {  # CPU=user + system CPU seconds of this shell's finished children, an integer
    # (bash's times builtin run in this shell: inside $(...) it would time a subshell's children)
    local file
    file=$(mktemp)
    times > "$file"
    CPU=$(python3 -c "import re, sys; print(int(sum(float(m) * 60 + float(s) for m, s in re.findall(r'(\d+)m([\d.]+)s', sys.argv[1]))))" "$(tail -1 "$file")")
    rm -f "$file"
}
step() {  # step KEY NAME DRY_BUDGET GPU_LIMIT COMMAND...: run with this mode's limit, time it
    local key=$1 name=$2 limit=$4 budget=$3
    shift 4
    if [ -n "$only" ] && [[ $only != *",$key,"* ]]; then return; fi
    # The dry run's budget is CPU seconds, which a busy machine does not inflate; its wall-clock
    # limit is three times that, a guard against a step that hangs.
    [ $dry = 1 ] && limit=$((budget * 3))
    echo "=== $name (limit ${limit} s)"
    local start=$SECONDS cpu_start
    cpu_seconds
    cpu_start=$CPU
    timeout -s INT -k 15 "$limit" "$@" || { echo "=== $name FAILED (exit $?; 124: over ${limit} s)"; status=1; }
    cpu_seconds
    local took=$((SECONDS - start)) cpu=$((CPU - cpu_start))
    echo "=== $name took $took s ($cpu CPU seconds)"
    if [ $dry = 1 ] && [ $((cpu * 10)) -gt $((budget * 7)) ]; then
        echo "=== $name took over 70% of its budget of $budget CPU seconds: the budget in docs/development.md needs a look"
        status=1
    fi
    if [ -n "${OUT:-}" ]; then cp docs/benchmarks.md "$OUT/"; fi  # on a device call: the tables so far
}
layers=(tests/test_attention.py tests/test_efficient_attention.py tests/test_model.py)
fast=(tests/test_performance.py tests/test_pack.py)
left_out=(--ignore=tests/test_video.py --ignore=tests/test_report.py --ignore=tests/test_statistics.py
          --ignore=tests/test_paired.py --ignore=tests/test_docs.py
          --deselect tests/test_sweep.py::test_sweep_on_a_local_ray_instance
          --deselect tests/test_sweep.py::test_sweep_resumes_and_reports
          --deselect tests/test_attention_kinds.py::test_the_papers_table_trains_evaluates_and_is_reported)
if [ $dry = 1 ]; then
    device=cpu write="" tiny=(--tiny) train_steps=4 rounds=2
    # The compiled-training tests compile cold on a CPU (minutes on 2 cores, nothing like a GPU's
    # compile): the suite runs them; the dry run checks this step with the others of its file.
    fast=(tests/test_performance.py -k "not compiled_training")
    pack=(--tiny --packs 1,2 --modes eager,model-compiled --steps 2 --warmup 1)
    attention=(--ks 20 --batch 2 --repeats 1)
    context=(--ks 20 --batch 2 --rounds 1 --tiny)
    evaluation=(--configs "dt+model.embed_dim=32+model.n_layer=1" --episodes 2 --sequential-episodes 1 --workers 2)
    rest=(tests/test_cli.py -k "end_to_end")  # one training-and-evaluation test stands for the rest
else
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)" || exit 1
    device=cuda write="${WRITE_DOCS---write-docs}" tiny=() train_steps=200 rounds=2
    pack=(--sizes dt --packs 1,32,128 --modes compiled,eager,model-compiled --steps 500 --warmup 3)
    attention=(--batch 64 --ks 20,100,500,2000)  # seven kinds per K
    context=(--ks 20,100,500)
    evaluation=(--configs primal-dt --workers 8 --sequential-episodes 2)  # launch-bound: one size
    rest=(tests "${layers[@]/#/--ignore=}" "${fast[@]/#/--ignore=}")
    # Where pytest-xdist is installed (the H200 image has it): the rest of the suite in 16
    # processes (14 took 127 s there), and the fast-path tests' nine cold compiles side by side
    # (one after another they took about 25 s each).
    if python3 -c "import xdist" 2>/dev/null; then
        rest+=(-n 16 --dist loadfile)
        fast+=(-n 9)
    fi
    # Inductor compiles in this process, not in a pool of 16 compile workers per test process: at
    # exit, a pytest-xdist process waited on its pool's shutdown, and the step ran past its limit
    # after all 9 tests had passed.
    export TORCHINDUCTOR_COMPILE_THREADS=1
fi
# Limits (dry run: CPU seconds, GPU: wall seconds): the dry run's measured on an idle 2-core CPU,
# each step to stay under 70% of it; the GPU's from docs/development.md's budget.
step pack "pack benchmark" 150 260 python3 scripts/bench_pack.py --device $device "${pack[@]}" $write
step fast "fast-path and pack tests on $device" 40 150 \
    env PRIMAL_DT_TEST_DEVICE=$device python3 -m pytest -v -rfE "${fast[@]}"
step layers "layer and model tests on $device" 40 40 \
    env PRIMAL_DT_TEST_DEVICE=$device python3 -m pytest -q -x "${layers[@]}"
step train "training benchmark" 400 150 python3 scripts/bench_train.py --device $device \
    --compile reduce-overhead --steps $train_steps --rounds $rounds "${tiny[@]}" $write
step rest "the rest of the tests on $device" 60 150 \
    env PRIMAL_DT_TEST_DEVICE=$device python3 -m pytest -v -rfE "${rest[@]}" "${left_out[@]}"
step eval "evaluation benchmark" 40 70 python3 scripts/bench_eval.py --device $device "${evaluation[@]}" $write
step attention "attention benchmark" 80 85 python3 scripts/bench_attention.py --device $device "${attention[@]}" $write
step context "context-length benchmark" 90 75 python3 scripts/bench_context.py --device $device "${context[@]}" $write
exit $status
