#!/usr/bin/env bash
# The benchmarks, on an optimised build in a venv of their own (target/bench):
#
#   scripts/bench.sh                  # pytest-benchmark suite in benches/ (correctness + ratios)
#   scripts/bench.sh --bench-100k     # ... with the 100k-item scenarios (slow, ~2 GB RAM)
#   REPORT=1 scripts/bench.sh         # then benches/report.py: the readable tables
#   REPORT=1 REPORT_ARGS="--sizes 1000" scripts/bench.sh
#
# Arguments go to pytest. Timings are ratios against references measured in the same run
# (benches/README.md); run on an idle machine for numbers worth comparing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${BENCH_VENV:-target/bench}
RELEASE=1 DEV_VENV="$VENV" bash scripts/dev.sh

nice -n 10 "$VENV/bin/python" -m pytest -q -p no:cacheprovider benches \
  --benchmark-columns=mean,rounds "$@"

if [ "${REPORT:-0}" = 1 ]; then
  # shellcheck disable=SC2086  # REPORT_ARGS is a list of options
  "$VENV/bin/python" benches/report.py ${REPORT_ARGS:-}
fi
