#!/usr/bin/env bash
# The benchmarks, on a release build installed into a venv of its own (target/bench):
#
#   scripts/bench.sh                  # pytest-benchmark suite in benches/ (correctness + ratios)
#   scripts/bench.sh --bench-100k     # ... with the 100k-item scenarios (slow, ~2 GB RAM)
#   REPORT=1 scripts/bench.sh         # then benches/report.py: prints the tables and writes
#                                     # them to benches/README.md and README.md's short table
#   REPORT=1 REPORT_ARGS="--sizes 1000,10000,100000" scripts/bench.sh
#   SUITE=0 REPORT=1 scripts/bench.sh # the report only
#
# Arguments go to pytest. The wheel is built with maturin (release profile: fat LTO, a few
# minutes from nothing) and installed, not linked: the tree's dev build (scripts/dev.sh) is
# left alone. Timings are ratios against references measured in the same run; run on an
# idle machine for numbers worth comparing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${BENCH_VENV:-target/bench}
PYTHON=${PYTHON:-python3}
SDK_VERSION=${SDK_VERSION:-0.24.0}
case "$SDK_VERSION" in 0.22.*) MCP_REQ="mcp>=1.19,<2" ;; *) MCP_REQ="mcp>=2,<3" ;; esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
"$VENV/bin/python" -m pip install --quiet 'maturin>=1.16,<2'
rm -rf target/bench-wheels
nice -n 10 "$VENV/bin/maturin" build --quiet --release --out target/bench-wheels \
  --features pyo3/extension-module,test-hooks --interpreter "$VENV/bin/python"
wheel=$(ls target/bench-wheels/protoprompt-*.whl | head -n 1)
"$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$VENV/bin/python" -m pip install --quiet "${wheel}[agents,mcp,test]" \
  "openai-agents==$SDK_VERSION" "$MCP_REQ"

if [ "${SUITE:-1}" = 1 ]; then
  # From target/: the installed package is benchmarked, not the tree's python/.
  (cd target && nice -n 10 "../$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    --rootdir .. -c ../pyproject.toml ../benches --benchmark-columns=mean,rounds "$@")
fi

if [ "${REPORT:-0}" = 1 ]; then
  # shellcheck disable=SC2086  # REPORT_ARGS is a list of options
  "$VENV/bin/python" benches/report.py --markdown benches/README.md --readme README.md \
    ${REPORT_ARGS:-}
fi
