#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the test suite on CUDA, then the benchmarks on CUDA, each
# writing its table into README.md (labelled with the GPU's name). Under 8 minutes on an H200;
# each step has a time limit (9 minutes 20 s in all), so the script always ends within one device call.
# Run from the repository root after `pip install -e ".[test]"`:   bash scripts/gpu_check.sh
# The tests record their own datasets (no network) with the policies in tests/policies. Every
# step runs even if an earlier one fails; the exit status says whether all passed. Set
# WRITE_README= (empty) to only print the tables. The GPU image lacks the video and ray extras
# (too large to carry): their tests are left out here by name, and run in CI.
set -uo pipefail
write="${WRITE_README---write-readme}"
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, time it, remember a failure
    local name=$1 limit=$2; shift 2
    echo "=== $name"
    local start=$SECONDS
    timeout "$limit" "$@" || { echo "=== $name FAILED (exit $?; 124: over ${limit} s)"; status=1; }
    echo "=== $name took $((SECONDS - start)) s"
}
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)" || exit 1
# Layer and model tests with CUDA as the default device; training and evaluation with --device cuda.
step "tests on CUDA" 200 env PRIMAL_DT_TEST_DEVICE=cuda python3 -m pytest -q \
    --ignore=tests/test_video.py --deselect tests/test_sweep.py::test_sweep_on_a_local_ray_instance
step "training benchmark" 170 python3 scripts/bench_train.py --device cuda --compile reduce-overhead $write
step "attention benchmark" 80 python3 scripts/bench_attention.py --device cuda --batch 64 --ks 20,50,100,200,500,1000,2000 $write
step "evaluation benchmark" 110 python3 scripts/bench_eval.py --device cuda --workers 8 --sequential-episodes 5 $write
exit $status
