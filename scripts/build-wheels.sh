#!/usr/bin/env bash
# Build the release artifacts this machine can build into dist/:
#
#   dist/protoprompt-X.Y.Z.tar.gz    the sdist (Rust sources, Cargo.lock, the package, its tests)
#   dist/protoprompt-X.Y.Z-cp310-abi3-manylinux_2_17_<arch>.manylinux2014_<arch>.whl
#
# One abi3 wheel serves every CPython >= 3.10. It is linked by zig (maturin --zig, zig from the
# `ziglang` package on PyPI) against glibc 2.17's symbols, so it installs on any Linux with
# glibc >= 2.17 whatever glibc this machine has. A wheel is built for each Linux target whose
# Rust standard library is installed (`rustup target list --installed`): the host's glibc
# target, and also musllinux_1_2 when the musl target is there. macOS and Windows wheels and
# the targets missing here are built by .github/workflows/release.yml.
#
#   scripts/build-wheels.sh            # -> dist/
#   DIST_DIR=/tmp/out scripts/build-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DIST=${DIST_DIR:-dist}
TOOLS=${BUILD_TOOLS_VENV:-target/build-tools}
# Build tools, pinned to the ranges this script was verified with.
MATURIN_REQ=${MATURIN_REQ:-'maturin>=1.16,<2'}
ZIG_REQ=${ZIG_REQ:-'ziglang>=0.17,<0.18'}

log() { printf '\n==> %s\n' "$*"; }

install_tools() {
  if [ ! -x "$TOOLS/bin/python" ]; then
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --upgrade pip
  fi
  "$TOOLS/bin/python" -m pip install --quiet "$MATURIN_REQ" "$ZIG_REQ"
  # maturin runs zig as `python -m ziglang` with the python on PATH: the tools' one first.
  PATH="$(cd "$TOOLS/bin" && pwd):$PATH"
  echo "maturin $(maturin --version | cut -d' ' -f2), zig $(python -m ziglang version)"
}

target_installed() { [ -d "$(rustc --print sysroot)/lib/rustlib/$1/lib" ]; }

build_sdist() {
  log "sdist"
  maturin sdist --out "$DIST"
}

# build_wheel TARGET COMPATIBILITY
build_wheel() {
  log "wheel for $1 ($2, abi3, zig)"
  nice -n 10 maturin build --release --locked --zig --target "$1" --compatibility "$2" --out "$DIST"
}

main() {
  log "build tools ($TOOLS)"
  install_tools
  mkdir -p "$DIST"
  rm -f "$DIST"/protoprompt-*.whl "$DIST"/protoprompt-*.tar.gz
  build_sdist

  local arch skipped=()
  arch=$(rustc -vV | sed -n 's/^host: \([^-]*\)-.*/\1/p')
  case "$(rustc -vV | sed -n 's/^host: //p')" in
    *-linux-gnu) ;;
    *) echo "host is not Linux: build its wheel with 'maturin build --release'"; arch="" ;;
  esac
  if [ -n "$arch" ]; then
    build_wheel "$arch-unknown-linux-gnu" manylinux2014
    if target_installed "$arch-unknown-linux-musl"; then
      build_wheel "$arch-unknown-linux-musl" musllinux_1_2
    else
      skipped+=("musllinux_1_2 (no Rust standard library for it: rustup target add $arch-unknown-linux-musl)")
    fi
  fi

  log "dist/"
  ls -l "$DIST"/protoprompt-*
  for s in "${skipped[@]}"; do echo "not built here: $s"; done
}

main "$@"
