# One task runner for humans and CI. `make dev` runs the service; `make test` runs everything.
.PHONY: dev test lint fmt openapi install bench bench-quick image-test deps-lowest ha

# Every top-level examples/*.py as a dotted module, for the determinism checker.
EXAMPLE_MODULES := $(filter-out examples.__init__,$(basename $(subst /,.,$(wildcard examples/*.py))))

# pytest-xdist worker processes for `make test` (docs/adr/0019-test-parallelism.md): 2 suits
# the 2-core machines CI runs on; `make test PYTEST_WORKERS=0` runs in one process (a failure
# is easier to read), `auto` takes one per core. loadgroup keeps the tests that share one
# expensive fixture (the built wheel, the npm install) on one worker.
PYTEST_WORKERS ?= 2

install:
	scripts/bootstrap

dev: install
	uv run treadle dev

test: install
	scripts/ensure-postgres
	scripts/install-chromium
	scripts/install-pgbouncer
	scripts/install-ha
	$(MAKE) --no-print-directory lint
	uv run pytest -n $(PYTEST_WORKERS) --dist loadgroup

lint:
	uv run ruff check .
	uv run ruff format --check .
	uv run mypy app examples tests benchmarks
	uv run lint-imports
	uv run treadle check $(EXAMPLE_MODULES)

fmt:
	uv run ruff format .
	uv run ruff check --fix .

openapi:
	uv run python -m app.api.openapi > openapi/openapi.json

# The long HA failover test (tests/ha, docs/deployment.md#high-availability-with-patroni):
# more runs and three kill -9 failovers in a row, then a switchover, each followed by the
# per-worker LISTEN and NOTIFY wake-up checks; then the read-replica test on the Patroni
# standby (one cluster for both). `make test` runs the bounded version (one failover, one
# switchover).
ha: install
	scripts/install-ha
	TREADLE_HA_LONG=1 uv run pytest tests/ha -p no:randomly -s -q

# Benchmarks against the local PostgreSQL (docs/benchmarks.md). Creates the peer venv (DBOS
# and pgqueuer, with uv) on first use. Never installs system packages: without wrk on PATH
# the HTTP benchmark says so and uses its httpx load generator (its figures are marked).
bench: install
	scripts/ensure-postgres
	@command -v wrk >/dev/null || echo "wrk not found: HTTP figures come from the httpx \
	load generator (install wrk, e.g. apt-get install wrk, for the wrk figures)"
	uv run python -m benchmarks.bench $(BENCH_ARGS)

bench-quick:
	$(MAKE) --no-print-directory bench BENCH_ARGS=--quick

# Build the image and run migrate, serve, a worker and one run against it (podman or
# docker; scripts/image-test). Not in `make test`: a cold build takes minutes.
image-test:
	scripts/ensure-postgres
	scripts/image-test

# Install every dependency at its declared lower bound and complete a run on it
# (scripts/check-lowest-deps; needs the package index). Run it when changing a range.
deps-lowest:
	scripts/check-lowest-deps
