#!/usr/bin/env bash
# Build protoprompt from this checkout and install it into a dev venv, for fast iteration:
#
#   scripts/dev.sh                          # target/dev: openai-agents 0.24.0, mcp 2.x, debug build
#   RELEASE=1 scripts/dev.sh                # optimised build (benchmarks: scripts/bench.sh,
#                                           # which installs a release wheel of its own)
#   DEV_VENV=target/dev22 SDK_VERSION=0.22.3 scripts/dev.sh
#
# The package is installed editable (maturin develop): python/ is imported from the tree, and
# the native module is rebuilt incrementally by the next run. Then, for example:
#
#   target/dev/bin/python -m pytest tests/packing/test_core.py
#   scripts/lint.sh                         # fmt, clippy, ruff, mypy, stubtest on this build
#
# The build has the test hooks (cargo feature test-hooks, see rust/python/src/hooks.rs) the
# suite uses; release wheels do not.
# scripts/test.sh does not use this venv: it tests the release wheel in fresh venvs.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${DEV_VENV:-target/dev}
SDK_VERSION=${SDK_VERSION:-0.24.0}

# protoprompt.mcp serves with either mcp major: 2.x with the newest SDK line, 1.x with 0.22.
case "$SDK_VERSION" in 0.22.*) MCP_REQ="mcp>=1.19,<2" ;; *) MCP_REQ="mcp>=2,<3" ;; esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
"$VENV/bin/python" -m pip install --quiet 'maturin>=1.16,<2' "openai-agents==$SDK_VERSION" "$MCP_REQ"

profile=()
[ "${RELEASE:-0}" = 1 ] && profile=(--release)
VIRTUAL_ENV=$(cd "$VENV" && pwd) nice -n 10 "$VENV/bin/maturin" develop --quiet "${profile[@]}" \
  --features pyo3/extension-module,test-hooks --extras agents,mcp,test
"$VENV/bin/python" -c "import protoprompt; print('protoprompt', protoprompt.__version__, 'in $VENV')"
