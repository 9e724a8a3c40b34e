#!/usr/bin/env bash
# Run every test of protoprompt on a fresh machine: Rust (fmt, clippy, cargo test), then the
# Python suite against a freshly built release wheel, once per supported openai-agents line.
#
#   scripts/test.sh            # everything
#   SDK_VERSIONS="0.24.0" scripts/test.sh   # one SDK line only
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
SDK_VERSIONS=${SDK_VERSIONS:-"0.24.0 0.22.3"}
# protoprompt.mcp serves with either mcp major: 2.x in the newest SDK line's venv, 1.x in the other's.
mcp_requirement() { case "$1" in 0.22.*) echo "mcp>=1.19,<2" ;; *) echo "mcp>=2,<3" ;; esac; }
WORK=${PROTOPROMPT_CI_DIR:-target/ci}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --features pyo3/extension-module -- -D warnings

step "cargo test (core crate: item graph vectors, counting, packing)"
cargo test -p protoprompt-core

step "build the release wheel (maturin, abi3)"
if [ ! -x "$WORK/build-venv/bin/python" ]; then
  "$PYTHON" -m venv "$WORK/build-venv"
fi
"$WORK/build-venv/bin/python" -m pip install --quiet --upgrade pip 'maturin>=1.7,<2'
rm -rf "$WORK/wheels"
"$WORK/build-venv/bin/maturin" build --release --out "$WORK/wheels"
WHEEL=$(ls "$WORK"/wheels/protoprompt-*.whl | head -n 1)
echo "wheel: $WHEEL"

first=1
for sdk in $SDK_VERSIONS; do
  venv="$WORK/venv-agents-$sdk"
  step "python tests with openai-agents==$sdk (fresh venv $venv)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "${WHEEL}[agents,mcp,test]" "openai-agents==$sdk" "$(mcp_requirement "$sdk")"
  "$venv/bin/python" -c "import agents, mcp, protoprompt; print('openai-agents', agents.__version__ if hasattr(agents, '__version__') else '$sdk', '| protoprompt', protoprompt.__version__)"
  # Run from a directory without the source tree so the installed wheel is what is tested.
  (cd "$WORK" && "$venv/bin/python" -m pytest "$OLDPWD/tests" -q -p no:cacheprovider --rootdir "$OLDPWD" -c "$OLDPWD/pyproject.toml")
  if [ "$first" = 1 ]; then
    step "stubs: mypy.stubtest protoprompt._core"
    (cd "$WORK" && "$venv/bin/python" -m mypy.stubtest protoprompt._core --ignore-missing-stub)
    step "benchmarks (correctness assertions + ratios; openai-agents==$sdk)"
    compgen -G "benches/test_*.py" > /dev/null && (cd "$WORK" && "$venv/bin/python" -m pytest "$OLDPWD/benches" -q -p no:cacheprovider --rootdir "$OLDPWD" -c "$OLDPWD/pyproject.toml" --benchmark-columns=mean,rounds)
    first=0
  fi
done

step "all tests passed"
