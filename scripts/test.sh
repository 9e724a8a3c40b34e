#!/usr/bin/env bash
# Run every test of protoprompt on a fresh machine:
#   lint    scripts/lint.sh's Python source gates: ruff check, mypy --strict over python/
#           (pinned tools, a venv of their own with openai-agents 0.24.0 and mcp 2.x; ~30 s)
#   rust    scripts/lint.sh's Rust gates (cargo fmt, clippy -D warnings with
#           clippy::too_many_lines), cargo test
#   dist    scripts/build-wheels.sh: the sdist and the manylinux2014 abi3 wheel in dist/,
#           checked for their tags, metadata and the glibc symbols they need, twine check
#   python  the Python suite against that wheel, once per supported openai-agents line
#           (mcp 2.x with the newest line, 1.x with the other), then that SDK version's own
#           session tests on ProtoPromptSession (the conformance job), plus stubtest
#           (scripts/lint.sh, on the installed wheel) and the benchmarks with the first line;
#           against PostgreSQL and redis-server that scripts/services.sh installs (apt-get,
#           when missing) and starts on 127.0.0.1 for this run (also for the sdist step), and
#           with headless Chromium for the HTML plan's screenshot (apt-get, when missing)
#   smoke   the same wheel in fresh venvs of CPython 3.10, 3.12 and 3.13 with no Rust
#           toolchain on PATH: imports, counts, packs, runs the offline example, the README's
#           Quick start on the public offline model (protoprompt.testing) and `protoprompt demo`
#   sdist   the sdist built from source in a fresh venv (Rust on PATH), its own tests
#
#   bench   the benchmarks (benches/, correctness assertions + ratios) on the wheel with the
#           first SDK line, alone at the end so that their ratios are measured on a quiet machine
#
# Independent steps run at the same time, each into a log of its own under $WORK/logs that is
# printed when it ends: lint, rust and dist first (dist builds in a Cargo target dir of its
# own, so it does not wait for rust's lock), then the python suites (one job per SDK line,
# pytest-xdist inside each, every job and worker on a PostgreSQL database of its own), smoke
# and sdist, then bench. PARALLEL=0 runs the steps one after the other, in this order.
#
#   scripts/test.sh                          # everything (~25-35 min on 2 cores)
#   scripts/test.sh quick                    # the fast loop (make test-fast): every lint gate,
#                                            # cargo test and the Python suite (pytest -n) on the
#                                            # dev venv target/dev (scripts/dev.sh, incremental
#                                            # debug build, openai-agents 0.24.0), with the
#                                            # servers; no wheel, no second SDK line (< 5 min)
#   SDK_VERSIONS="0.24.0" scripts/test.sh    # one SDK line only
#   STEPS="dist smoke" scripts/test.sh       # some steps only (python/smoke/sdist/bench use dist/)
#   PYTEST_WORKERS=4 scripts/test.sh         # pytest -n (default: auto, one per core)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PYTHON=${PYTHON:-python3}
SDK_VERSIONS=${SDK_VERSIONS:-"0.24.0 0.22.3"}
SMOKE_PYTHONS=${SMOKE_PYTHONS:-"3.10.13 3.12.1 3.13.0"}
SDIST_PYTHON=${SDIST_PYTHON:-3.10.13}
STEPS=${STEPS:-"lint rust dist python smoke sdist bench"}
PARALLEL=${PARALLEL:-1}
PYTEST_WORKERS=${PYTEST_WORKERS:-auto}
MODE=${1:-full}
case "$MODE" in
  full) WORK=${PROTOPROMPT_CI_DIR:-target/ci} ;;
  quick) WORK=${PROTOPROMPT_CI_DIR:-target/quick} ;;
  *) echo "usage: scripts/test.sh [quick]" >&2; exit 2 ;;
esac
DIST=$ROOT/dist
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# protoprompt.mcp serves with either mcp major: 2.x in the newest SDK line's venv, 1.x in the other's.
mcp_requirement() { case "$1" in 0.22.*) echo "mcp>=1.19,<2" ;; *) echo "mcp>=2,<3" ;; esac; }

# Each step line shows the time since the start (m:ss), to keep CI's time in view.
step() { printf '\n==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# The one version: the Cargo workspace version.
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
ARCH=$(uname -m)

# fresh_venv DIR PYTHON: an empty virtual environment with a current pip.
fresh_venv() {
  rm -rf "$1"
  "$2" -m venv "$1"
  "$1/bin/python" -m pip install --quiet --upgrade pip
}

# python_for 3.10.13: that CPython (pyenv), else python3.10 on PATH.
python_for() {
  local prefix
  if prefix=$(pyenv prefix "$1" 2>/dev/null) && [ -x "$prefix/bin/python3" ]; then
    echo "$prefix/bin/python3"
  elif command -v "python${1%.*}" > /dev/null; then
    command -v "python${1%.*}"
  else
    echo "CPython $1 not found (pyenv install $1)" >&2
    return 1
  fi
}

# no_rust CMD...: run CMD with no Rust toolchain reachable (PATH without cargo/rustc/rustup).
no_rust() {
  local dir path=""
  local IFS=:
  for dir in $PATH; do
    [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] || [ -e "$dir/rustup" ] || path="${path:+$path:}$dir"
  done
  env -u CARGO_HOME -u RUSTUP_HOME -u RUSTC PATH="$path" "$@"
}

wheel_path() {
  WHEEL=$(ls "$DIST"/protoprompt-"$VERSION"-cp310-abi3-*manylinux_2_17_"$ARCH".whl 2> /dev/null | head -n 1)
  SDIST=$DIST/protoprompt-$VERSION.tar.gz
  if [ -z "$WHEEL" ] || [ ! -f "$SDIST" ]; then
    echo "no protoprompt $VERSION wheel and sdist in $DIST: run the dist step (scripts/build-wheels.sh)" >&2
    return 1
  fi
}

# test_wheel: the suite's wheel in $TEST_WHEEL, the release build with the test hooks the tests
# use (cargo feature test-hooks, rust/python/src/hooks.rs); the dist wheels leave them out.
test_wheel() {
  local venv="$WORK/venv-maturin" out="$WORK/test-wheels"
  if [ ! -x "$venv/bin/maturin" ]; then
    fresh_venv "$venv" "$PYTHON"
    "$venv/bin/python" -m pip install --quiet 'maturin>=1.16,<2'
  fi
  rm -rf "$out"
  nice -n 10 "$venv/bin/maturin" build --quiet --release --locked --out "$out" \
    --features pyo3/extension-module,test-hooks --interpreter "$PYTHON"
  TEST_WHEEL=$(ls "$out"/protoprompt-"$VERSION"-*.whl | head -n 1)
}

# pytest_from SRC VENV ARGS...: pytest ARGS with SRC's configuration, run from outside SRC so
# the package installed in VENV is what is tested, not the tree.
pytest_from() {
  local src=$1 venv=$2
  shift 2
  (cd "$WORK" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$src" -c "$src/pyproject.toml" "$@")
}

step_lint() {
  step "lint: import cycles, ruff check, mypy --strict python/ (scripts/lint.sh, venv $WORK/venv-lint)"
  LINT_VENV="$WORK/venv-lint" SDK_VERSION=0.24.0 LINT_STEPS="imports ruff mypy" bash scripts/lint.sh
}

step_rust() {
  step "lint: cargo fmt --check, cargo clippy -D warnings (scripts/lint.sh)"
  LINT_STEPS=rust bash scripts/lint.sh

  step "cargo test (core crate: item graph vectors, counting, packing)"
  cargo test -p protoprompt-core
}

step_dist() {
  step "release artifacts (scripts/build-wheels.sh -> dist/)"
  DIST_DIR="$DIST" bash scripts/build-wheels.sh
  wheel_path

  step "check the wheels: tags, metadata, glibc symbol versions <= 2.17 (scripts/check_wheel.py)"
  local venv="$WORK/check-venv" musl
  [ -x "$venv/bin/twine" ] || { fresh_venv "$venv" "$PYTHON" && "$venv/bin/python" -m pip install --quiet twine; }
  "$venv/bin/python" scripts/check_wheel.py "$WHEEL" --platform "manylinux_2_17_$ARCH" --max-glibc 2.17 --version "$VERSION"
  # Built when the Rust musl target is installed; nothing here can run it (no musl CPython).
  for musl in "$DIST"/protoprompt-"$VERSION"-cp310-abi3-musllinux_1_2_"$ARCH".whl; do
    [ -f "$musl" ] && "$venv/bin/python" scripts/check_wheel.py "$musl" --platform "musllinux_1_2_$ARCH" --version "$VERSION"
  done

  step "check the sdist: what its build and its tests need is in it"
  local name=protoprompt-$VERSION listing
  listing=$(tar -tzf "$SDIST")
  for f in pyproject.toml Cargo.toml Cargo.lock LICENSE README.md CHANGELOG.md DEVELOPING.md \
           rust/core/Cargo.toml rust/python/Cargo.toml python/protoprompt/__init__.py \
           rust/core/tests/data/item-graph-vectors.json docs/item-graph.md tests/conftest.py \
           benches/reference_tokenizer.py examples/openai_agents_session.py \
           scripts/import_cycles.py; do
    grep -qx "$name/$f" <<< "$listing" || { echo "sdist lacks $f" >&2; return 1; }
  done
  echo "$(basename "$SDIST"): ok ($(wc -l <<< "$listing") files)"

  step "twine check --strict"
  "$venv/bin/twine" check --strict "$DIST"/protoprompt-"$VERSION"*
}

# ---------------------------------------------------------------------------- SDK conformance
# The SDK's own session tests (tests/memory/, tests/extensions/memory/test_encrypt_session.py,
# test_sqlalchemy_session.py and test_redis_session.py, tests/deferred_session_writes/,
# tests/test_hitl_session_scenario.py and the session tests of the runner test files), taken
# from the sdist of the openai-agents version installed in the venv, run with every
# SQLiteSession, SQLAlchemySession and RedisSession they build replaced by ProtoPromptSession
# over one (tests/sdk_conformance/protoprompt_conformance.py), without and with our input
# callback: as upstream runs them (SQLite in memory, fakeredis), then the SQLAlchemy and Redis
# tests once more against the services' PostgreSQL (psycopg, the one driver protoprompt uses) and redis-server, where the tests
# allow a real server. Skipped tests are listed with their reason at the end of each run. All
# modes together take 3-5 min for 0.24.0 and 2-3 min for 0.22.3 on the 2-core machine.
sdk_conformance() {
  local venv=$1 version src dist
  version=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('openai-agents'))")
  src="$WORK/sdk-src/openai_agents-$version"
  dist="$WORK/sdk-sdist"
  step "SDK conformance: openai-agents $version's own session tests on ProtoPromptSession"
  "$venv/bin/python" -m pip install --quiet httpx fakeredis
  mkdir -p "$dist" "$WORK/sdk-src"
  if [ ! -f "$dist/openai_agents-$version.tar.gz" ]; then
    "$venv/bin/python" -m pip download --quiet --no-binary :all: --no-deps \
      --dest "$dist" "openai-agents==$version"
  fi
  rm -rf "$src"
  tar -xzf "$dist/openai_agents-$version.tar.gz" -C "$WORK/sdk-src"
  local tests=()
  local servers=(tests/extensions/memory/test_sqlalchemy_session.py tests/extensions/memory/test_redis_session.py)
  for t in tests/memory tests/extensions/memory/test_encrypt_session.py "${servers[@]}" \
           tests/deferred_session_writes tests/test_hitl_session_scenario.py \
           tests/test_agent_runner.py tests/test_agent_runner_streamed.py; do
    [ -e "$src/$t" ] && tests+=("$t")
  done
  local callback
  for callback in 0 1; do
    echo "-- callback $([ $callback = 1 ] && echo on || echo off)"
    (cd "$src" && PROTOPROMPT_CONFORMANCE_CALLBACK=$callback \
      PYTHONPATH="$ROOT/tests/sdk_conformance" \
      "$venv/bin/python" -m pytest -q -rx -p no:cacheprovider -p protoprompt_conformance \
      "${tests[@]}")
    echo "-- callback $([ $callback = 1 ] && echo on || echo off), on PostgreSQL and redis-server"
    (cd "$src" && PROTOPROMPT_CONFORMANCE_CALLBACK=$callback \
      PROTOPROMPT_CONFORMANCE_POSTGRES="${PROTOPROMPT_TEST_POSTGRES_URL/postgresql:/postgresql+psycopg:}" \
      PROTOPROMPT_CONFORMANCE_REDIS="${PROTOPROMPT_TEST_REDIS_URL%/*}/${CONFORMANCE_REDIS_DB:-15}" \
      PYTHONPATH="$ROOT/tests/sdk_conformance" \
      "$venv/bin/python" -m pytest -q -rx -p no:cacheprovider -p protoprompt_conformance \
      "${servers[@]}")
  done
}

# The servers the suites run against (scripts/services.sh): PostgreSQL (MemoryStore on
# postgresql:// URLs) and redis-server (RedisSession), installed through apt-get when missing,
# on 127.0.0.1 with throw-away data under $WORK/services, stopped when this script ends. Their
# URLs are exported (PROTOPROMPT_TEST_POSTGRES_URL, PROTOPROMPT_TEST_REDIS_URL) and
# PROTOPROMPT_REQUIRE_SERVICES=1 turns a test's skip for a missing server into a failure.
# Install + start: ~25 s on a fresh machine; ~7 s when the packages are there (an apt-get
# update looks for a pgvector package, which Debian 12 does not have).
SERVICES_STARTED=0
start_services() {
  [ "$SERVICES_STARTED" = 1 ] && return 0
  step "services: PostgreSQL and redis-server on 127.0.0.1 (scripts/services.sh)"
  export PROTOPROMPT_SERVICES_DIR="$WORK/services"
  bash scripts/services.sh start > /dev/null
  eval "$(bash scripts/services.sh env)"
  export PROTOPROMPT_REQUIRE_SERVICES=1 PROTOPROMPT_REQUIRE_REDIS=1
  SERVICES_STARTED=1
}

# The browser the HTML plan's test loads its page in (tests/packing/test_plan_html.py): Debian's
# chromium, installed through apt-get when missing (as root; ~35 s and 124 MB of packages on a
# fresh Debian 12 machine, nothing when it is there). PROTOPROMPT_REQUIRE_BROWSER=1 turns the
# test's skip for a missing browser into a failure.
ensure_browser() {
  if ! command -v chromium > /dev/null; then
    step "browser: apt-get install chromium (for the HTML plan's screenshot test)"
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium > /dev/null
    else
      echo "chromium is missing and this is not root: install Debian's chromium" >&2
      return 1
    fi
  fi
  export PROTOPROMPT_BROWSER
  PROTOPROMPT_BROWSER=$(command -v chromium)
  export PROTOPROMPT_REQUIRE_BROWSER=1
}

# own_database VENV NAME: a PostgreSQL database of its own on the test server for one job that
# runs next to others (the SDK's conformance tests drop their tables between tests), exported
# as PROTOPROMPT_TEST_POSTGRES_URL for that job only (tests/conftest.py then gives each
# pytest-xdist worker a database of its own in turn).
own_database() {
  PROTOPROMPT_TEST_POSTGRES_URL=$("$1/bin/python" - "$PROTOPROMPT_TEST_POSTGRES_URL" "$2" <<'PY'
import os, sys
from urllib.parse import urlsplit, urlunsplit
import psycopg
url, name = sys.argv[1], sys.argv[2]
with psycopg.connect(url, autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.execute(f'CREATE DATABASE "{name}"')
own = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
if os.environ.get("PROTOPROMPT_TEST_PGVECTOR") == "1":
    with psycopg.connect(own, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
print(own)
PY
  )
  export PROTOPROMPT_TEST_POSTGRES_URL
}

# agents_venv SDK: the fresh venv of that openai-agents line with the wheel installed.
agents_venv() {
  local sdk=$1 venv="$WORK/venv-agents-$1"
  [ -n "${TEST_WHEEL:-}" ] || test_wheel
  step "venv with openai-agents==$sdk (fresh venv $venv, $(basename "$TEST_WHEEL"))"
  fresh_venv "$venv" "$PYTHON"
  "$venv/bin/python" -m pip install --quiet "${TEST_WHEEL}[agents,mcp,test]" "openai-agents==$sdk" "$(mcp_requirement "$sdk")"
  "$venv/bin/python" -c "import agents, mcp, protoprompt; print('openai-agents', agents.__version__ if hasattr(agents, '__version__') else '$sdk', '| protoprompt', protoprompt.__version__)"
}

# python_line SDK INDEX: the suite (pytest -n) and the SDK's conformance tests on one SDK line
# (INDEX 0 is the first line: also stubtest); a job of its own next to the other lines.
python_line() {
  local sdk=$1 index=$2 venv="$WORK/venv-agents-$1"
  agents_venv "$sdk"
  own_database "$venv" "pp_ci_agents_${sdk//./_}"
  # The conformance run empties its Redis database: one per job.
  CONFORMANCE_REDIS_DB=$((15 - index))
  step "python tests with openai-agents==$sdk (pytest -n $PYTEST_WORKERS, then the serial ones)"
  PROTOPROMPT_REQUIRE_TEST_HOOKS=1 pytest_from "$ROOT" "$venv" -n "$PYTEST_WORKERS" -m "not serial" "$ROOT/tests"
  PROTOPROMPT_REQUIRE_TEST_HOOKS=1 pytest_from "$ROOT" "$venv" -m serial "$ROOT/tests"
  sdk_conformance "$venv"
  if [ "$index" = 0 ]; then
    step "stubs: mypy.stubtest protoprompt._core on the installed wheel (scripts/lint.sh)"
    LINT_VENV="$venv" LINT_STEPS=stubtest bash scripts/lint.sh
  fi
}

step_python() {
  wheel_path
  step "the test build: release wheel with the test hooks (cargo feature test-hooks)"
  test_wheel
  start_services
  ensure_browser
  local sdk index=0
  for sdk in $SDK_VERSIONS; do
    if [ "$PARALLEL" = 1 ]; then
      spawn "python-$sdk" python_line "$sdk" "$index"
    else
      python_line "$sdk" "$index"
    fi
    index=$((index + 1))
  done
}

step_bench() {
  wheel_path
  start_services
  local sdk=${SDK_VERSIONS%% *}
  local venv="$WORK/venv-agents-$sdk"
  [ -x "$venv/bin/pytest" ] || agents_venv "$sdk"
  step "benchmarks (correctness assertions + ratios; openai-agents==$sdk)"
  compgen -G "benches/test_*.py" > /dev/null && pytest_from "$ROOT" "$venv" "$ROOT/benches" --benchmark-columns=mean,rounds
}

step_smoke() {
  wheel_path
  local ver py venv
  for ver in $SMOKE_PYTHONS; do
    py=$(python_for "$ver")
    venv="$WORK/venv-smoke-$ver"
    step "wheel on CPython $ver: fresh venv, no Rust toolchain on PATH, binary packages only"
    if no_rust sh -c 'command -v cargo || command -v rustc'; then
      echo "a Rust toolchain is still on PATH" >&2
      return 1
    fi
    rm -rf "$venv"
    no_rust "$py" -m venv "$venv"
    # The pip that comes with that CPython, as a user would have it.
    no_rust "$venv/bin/python" -m pip install --quiet --only-binary=:all: "${WHEEL}[agents]"
    (cd "$WORK" && no_rust "$venv/bin/python" "$ROOT/scripts/smoke_wheel.py" --version "$VERSION" \
      --example "$ROOT/examples/openai_agents_session.py" --readme "$ROOT/README.md" --demo)
  done
}

step_sdist() {
  wheel_path
  start_services
  ensure_browser
  local py venv="$WORK/venv-sdist" src="$WORK/sdist-src" sdk=${SDK_VERSIONS%% *}
  py=$(python_for "$SDIST_PYTHON")
  step "sdist: build from source into a fresh venv (CPython $SDIST_PYTHON, Rust on PATH)"
  fresh_venv "$venv" "$py"
  # The build's target dir outlives pip's build directory, so a local re-run is incremental.
  # It has the test hooks (cargo feature test-hooks) the sdist's tests use.
  MATURIN_PEP517_ARGS="--features pyo3/extension-module,test-hooks" \
    CARGO_TARGET_DIR="$WORK/sdist-target" nice -n 10 "$venv/bin/python" -m pip install --quiet \
    --no-binary=protoprompt "${SDIST}[agents,mcp,test]" "openai-agents==$sdk" "$(mcp_requirement "$sdk")"
  rm -rf "$src" && mkdir -p "$src" && tar -xzf "$SDIST" -C "$src" --strip-components=1

  own_database "$venv" pp_ci_sdist
  step "the sdist's own tests against its build (openai-agents==$sdk, CPython $SDIST_PYTHON)"
  PROTOPROMPT_REQUIRE_TEST_HOOKS=1 pytest_from "$src" "$venv" -n "$PYTEST_WORKERS" -m "not serial" "$src/tests"
  PROTOPROMPT_REQUIRE_TEST_HOOKS=1 pytest_from "$src" "$venv" -m serial "$src/tests"
}

# ------------------------------------------------------------------------------- jobs
# spawn NAME CMD...: run CMD as a job in the background, its output in $WORK/logs/NAME.log.
# join: wait for every job spawned; print each log as its job ends; fail if one failed.
declare -A JOB_NAMES=()
spawn() {
  local name=$1
  shift
  mkdir -p "$WORK/logs"
  step "started: $name (log $WORK/logs/$name.log)"
  ("$@") > "$WORK/logs/$name.log" 2>&1 &
  JOB_NAMES[$!]=$name
}
join() {
  local pid rc name failed=()
  while ((${#JOB_NAMES[@]})); do
    rc=0
    wait -n -p pid "${!JOB_NAMES[@]}" || rc=$?
    name=${JOB_NAMES[$pid]}
    unset "JOB_NAMES[$pid]"
    step "$name: $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)"); its output:"
    sed "s|^|[$name] |" "$WORK/logs/$name.log"
    [ "$rc" = 0 ] || failed+=("$name")
  done
  if ((${#failed[@]})); then
    step "failed: ${failed[*]}"
    return 1
  fi
}

# kill_tree PID: end a job and every process it started.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2> /dev/null || true); do
    kill_tree "$child"
  done
  kill -- "$1" 2> /dev/null || true
}

# On exit (also after a failure or ^C): end the jobs still running, stop the servers.
cleanup() {
  local pid
  for pid in "${!JOB_NAMES[@]}"; do
    kill_tree "$pid"
  done
  wait 2> /dev/null || true
  [ "$SERVICES_STARTED" = 0 ] || bash scripts/services.sh stop
}
trap cleanup EXIT

has_step() { [[ " $STEPS " == *" $1 "* ]]; }

# ------------------------------------------------------------------------------ quick
# The fast loop on the dev venv: build (incremental), then the lint gates and cargo test as
# one job next to the Python suite (pytest -n) against the servers. The editable install has
# no wheel metadata of the tree's version: that one test is left to the full run.
quick() {
  local venv=${DEV_VENV:-target/dev}
  step "dev build: scripts/dev.sh ($venv: editable, incremental debug build)"
  DEV_VENV=$venv bash scripts/dev.sh
  start_services
  if command -v chromium > /dev/null; then
    export PROTOPROMPT_BROWSER
    PROTOPROMPT_BROWSER=$(command -v chromium)
  fi
  spawn rust-and-lint bash -c "LINT_VENV=$venv bash scripts/lint.sh && nice -n 10 cargo test -p protoprompt-core"
  step "python tests on $venv (pytest -n $PYTEST_WORKERS)"
  venv=$(cd "$venv" && pwd)
  local rc=0 tests=("$ROOT/tests" -rs
    --deselect "tests/package/test_version.py::test_metadata_and_dunder_version_equal_the_cargo_version")
  pytest_from "$ROOT" "$venv" -n "$PYTEST_WORKERS" -m "not serial" "${tests[@]}" || rc=$?
  step "the serial python tests, alone"
  pytest_from "$ROOT" "$venv" -m serial "${tests[@]}" || rc=$?
  join
  return "$rc"
}

if [ "$MODE" = quick ]; then
  quick
  step "quick: all passed"
  exit 0
fi

job_lint() { step_lint; }
job_rust() { step_rust; }
# dist builds in a target dir of its own: Cargo's lock on target/ would make it wait for rust.
job_dist() {
  export CARGO_TARGET_DIR="$WORK/dist-target"
  step_dist
}
job_smoke() { step_smoke; }
job_sdist() { step_sdist; }

if [ "$PARALLEL" != 1 ]; then
  for s in $STEPS; do
    "step_$s"
  done
else
  # The servers and the browser are set up here, once, for the jobs that use them.
  if has_step python || has_step sdist || has_step bench; then
    start_services
  fi
  if has_step python || has_step sdist; then
    ensure_browser
  fi
  # Phase 1: nothing in it needs another.
  for s in lint rust dist; do
    if has_step "$s"; then spawn "$s" "job_$s"; fi
  done
  join
  # Phase 2: the wheel and sdist of phase 1 under test; one job per SDK line.
  if has_step python; then step_python; fi
  for s in smoke sdist; do
    if has_step "$s"; then spawn "$s" "job_$s"; fi
  done
  join
  # Phase 3: the benchmarks' ratios on a machine with nothing else of this run on it.
  if has_step bench; then step_bench; fi
fi

step "all tests passed"
