#!/usr/bin/env bash
# The dashboards' screenshots of docs/quickstart.md and docs/training.md, made by the browser test
# itself (tests/test_dashboards.py, headless Chromium on TensorBoard after the quick start's
# command as the docs write it): run it again whenever the dashboards or the quick start change.
set -euo pipefail
cd "$(dirname "$0")/.."
PRIMAL_DT_SCREENSHOTS="$PWD/scripts/figures" python3 -m pytest -q tests/test_dashboards.py \
    -k "quick_start"
ls -l scripts/figures/dashboard_*.png
