#!/usr/bin/env bash
# The lint gates, with pinned tools (scripts/lint-requirements.txt):
#   rust      cargo fmt --check; cargo clippy -D warnings (Cargo.toml's [workspace.lints]
#             make clippy::too_many_lines an error: clippy.toml has the threshold)
#   ruff      ruff check and ruff format --check over the tree (pyproject.toml [tool.ruff])
#   mypy      mypy --strict over python/ (pyproject.toml [tool.mypy])
#   stubtest  mypy.stubtest protoprompt._core: _core.pyi against the built native module,
#             every name stubbed (no --ignore-missing-stub)
#   imports   no import cycle in python/protoprompt, imports inside functions counted, and no
#             module cycle in rust/core/src (scripts/import_cycles.py; --stats: the numbers)
#
#   scripts/lint.sh                          # every gate, Python ones in target/dev (scripts/dev.sh)
#   LINT_STEPS="ruff mypy" scripts/lint.sh   # some gates only
#   LINT_VENV=/some/venv scripts/lint.sh     # the Python gates in another venv (stubtest needs
#                                            # protoprompt installed there)
#
# ruff, mypy and stubtest take ~10 s together; clippy is incremental (~10 s after a build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

LINT_STEPS=${LINT_STEPS:-"rust imports ruff mypy stubtest"}
VENV=${LINT_VENV:-target/dev}
SDK_VERSION=${SDK_VERSION:-0.24.0}

gate() { printf -- '-- lint: %s\n' "$*"; }

python_env() {
  [ -n "${PY:-}" ] && return 0
  if [ ! -x "$VENV/bin/python" ]; then
    if [ -z "${LINT_VENV:-}" ]; then
      bash scripts/dev.sh # the dev venv: protoprompt (for stubtest), openai-agents, mcp
    else
      local mcp
      # mypy needs the packages python/ imports; stubtest needs protoprompt (not here).
      "${PYTHON:-python3}" -m venv "$VENV"
      "$VENV/bin/python" -m pip install --quiet --upgrade pip
      case "$SDK_VERSION" in 0.22.*) mcp="mcp>=1.19,<2" ;; *) mcp="mcp>=2,<3" ;; esac
      # and the [postgres] extra's driver (memory/_postgres.py), SQLAlchemy and redis (the
      # session's stores of SQLAlchemySession and RedisSession, integrations/_stores/_*_store.py)
      # and the [embed] extra (protoprompt/embed.py: numpy, safetensors, tokenizers)
      "$VENV/bin/python" -m pip install --quiet "openai-agents==$SDK_VERSION" "$mcp" \
        "psycopg[binary]>=3.2,<4" "psycopg-pool>=3.2,<4" "SQLAlchemy[asyncio]>=2.0" "redis>=7" \
        "wordllama>=0.4,<0.5"
    fi
  fi
  "$VENV/bin/python" -m pip install --quiet -r scripts/lint-requirements.txt
  PY=$(cd "$VENV" && pwd)/bin/python
}

lint_rust() {
  gate "cargo fmt --check"
  cargo fmt --all -- --check
  gate "cargo clippy -D warnings (too_many_lines included)"
  nice -n 10 cargo clippy --workspace --all-targets --features pyo3/extension-module -- -D warnings
  gate "cargo clippy -D warnings, with the binding's test hooks (feature test-hooks)"
  nice -n 10 cargo clippy -p protoprompt-python --all-targets \
    --features pyo3/extension-module,protoprompt-python/test-hooks -- -D warnings
}

lint_imports() {
  gate "no import cycles in python/protoprompt (imports inside functions count) nor rust/core/src"
  "${PYTHON:-python3}" scripts/import_cycles.py
}

lint_ruff() {
  python_env
  gate "ruff check"
  "$PY" -m ruff check --no-cache "$ROOT"
  gate "ruff format --check"
  "$PY" -m ruff format --check --no-cache "$ROOT"
}

lint_mypy() {
  python_env
  gate "mypy --strict python/"
  # One cache per venv: the cache records the third-party packages it was checked against.
  "$PY" -m mypy --cache-dir "$(dirname "$(dirname "$PY")")/mypy-cache" "$ROOT/python"
}

lint_stubtest() {
  python_env
  gate "stubtest protoprompt._core"
  # From outside the tree: the installed package is checked, whatever python/ holds.
  (cd /tmp && "$PY" -m mypy.stubtest --mypy-config-file "$ROOT/pyproject.toml" protoprompt._core)
}

for s in $LINT_STEPS; do
  "lint_$s"
done
gate "all passed ($LINT_STEPS)"
