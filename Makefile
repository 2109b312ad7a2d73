# One task runner for humans and CI. `make dev` runs the service; `make test` runs everything.
.PHONY: dev test lint fmt openapi install

# Every top-level examples/*.py as a dotted module, for the determinism checker.
EXAMPLE_MODULES := $(filter-out examples.__init__,$(basename $(subst /,.,$(wildcard examples/*.py))))

install:
	scripts/bootstrap

dev: install
	uv run treadle dev

test: install
	scripts/ensure-postgres
	$(MAKE) --no-print-directory lint
	uv run pytest

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
