# syntax=docker/dockerfile:1
# One image for every Treadle process:
#   docker run IMAGE                                    -> treadle serve --host 0.0.0.0
#   docker run IMAGE worker --handlers examples.orders  -> a worker
#   docker run IMAGE migrate                            -> upgrade the schema to head
# Configuration is TREADLE_* environment variables (docs/operations.md).

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: resolve the locked dependencies into /app/.venv ------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=python3.11

RUN pip install uv==0.13.8

WORKDIR /app

# Dependencies only, so this layer is reused until pyproject.toml or uv.lock change.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project

# Then the project itself. It stays an editable install pointing at /app on purpose:
# app/db/migrations.py finds alembic.ini and alembic/ relative to the source tree, so the
# runtime stage must keep the source at the same path (/app) as here.
COPY README.md ./
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev

# --- runtime: the venv plus the source, run as an unprivileged user ---------------------
FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 treadle \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin treadle

WORKDIR /app

# Same path as in the build stage: the venv's scripts and its .pth file refer to /app.
COPY --from=build /app/.venv /app/.venv
COPY app ./app
COPY alembic ./alembic
COPY alembic.ini ./
COPY examples ./examples

ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1

# The code is root-owned and read-only for the service user, so compile it now. The
# default SQLite database and dev secret live in ./.treadle (relative to the working
# directory), the only directory the service user may write.
RUN python -m compileall -q app alembic examples \
    && mkdir -p /app/.treadle \
    && chown 10001:10001 /app/.treadle

USER 10001:10001

EXPOSE 8000

# Liveness of `serve` only (a worker has no HTTP port: disable this check for workers and
# `migrate`, as docker-compose.yml does). Follows TREADLE_PORT, not a --port flag.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TREADLE_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["treadle"]
CMD ["serve", "--host", "0.0.0.0"]
