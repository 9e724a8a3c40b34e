# One command per job; each target calls the script that does the job (scripts/), so CI
# (.ci/run -> scripts/test.sh) and a contributor run the same thing. `make help` lists them.
.DEFAULT_GOAL := help
.PHONY: help dev dev22 test test-fast test-rust test-python lint fmt bench report services-start services-stop docs wheels clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

dev: ## the dev venv target/dev: editable debug build, openai-agents 0.24.0 (scripts/dev.sh)
	bash scripts/dev.sh

dev22: ## a second dev venv target/dev22 on openai-agents 0.22.3 and mcp 1.x
	DEV_VENV=target/dev22 SDK_VERSION=0.22.3 bash scripts/dev.sh

test: ## everything CI runs, on a fresh machine (scripts/test.sh; ~35 min on 2 cores)
	bash scripts/test.sh

test-fast: ## the fast loop: lint, Rust tests, the Python suite on target/dev (scripts/test.sh quick)
	bash scripts/test.sh quick

test-rust: ## the core's tests (cargo test -p protoprompt-core)
	nice -n 10 cargo test -p protoprompt-core

test-python: dev ## the Python suite on target/dev in parallel (pytest-xdist); server tests skip without services
	target/dev/bin/python -m pytest -q -n auto -m "not serial" -p no:cacheprovider tests
	target/dev/bin/python -m pytest -q -m serial -p no:cacheprovider tests

lint: ## every lint gate: cargo fmt, clippy, import cycles, ruff, mypy --strict, stubtest (scripts/lint.sh)
	bash scripts/lint.sh

fmt: ## format the tree: cargo fmt, ruff format, ruff check --fix
	cargo fmt --all
	target/dev/bin/python -m ruff format python tests benches scripts examples
	target/dev/bin/python -m ruff check --fix python tests benches scripts examples

bench: ## the benchmarks on a release build (scripts/bench.sh)
	bash scripts/bench.sh

report: ## the benchmarks, then benches/README.md and the README's table (REPORT=1 scripts/bench.sh)
	REPORT=1 bash scripts/bench.sh

services-start: ## PostgreSQL and redis-server on loopback for the tests (scripts/services.sh)
	bash scripts/services.sh start

services-stop: ## stop them and delete their data
	bash scripts/services.sh stop

docs: dev ## run every code block of README.md, DEVELOPING.md and docs/*.md (tests/package/test_docs.py)
	target/dev/bin/python -m pytest -q -p no:cacheprovider tests/package/test_docs.py

wheels: ## the release sdist and manylinux2014 abi3 wheel in dist/ (scripts/build-wheels.sh)
	bash scripts/build-wheels.sh

clean: ## delete build outputs (target/, dist/)
	rm -rf target dist
