# syntax=docker/dockerfile:1
# One image for every Treadle process:
#   docker run IMAGE                                    -> treadle serve --host 0.0.0.0
#   docker run IMAGE worker --handlers examples.orders  -> a worker
#   docker run IMAGE migrate                            -> upgrade the schema to head
# Configuration is TREADLE_* environment variables (docs/operations.md). A team's own
# handlers go in an image built FROM this one (docs/your-project.md).
#
# PYTHON_IMAGE is any Debian-like image with Python 3.11+ as `python3` and the venv
# module; where no registry serves python:3.11-slim, `make image-test` builds one with
# debootstrap (scripts/image-base).

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: the wheel, then the locked dependencies and the wheel into /opt/treadle ------
FROM ${PYTHON_IMAGE} AS build

# pip and uv verify TLS against the system trust store (ca-certificates), so a build
# behind a TLS-inspecting proxy works once the proxy's CA is in the base image.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    UV_SYSTEM_CERTS=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never

# uv in a venv of its own: Debian's python3 refuses `pip install` into the system.
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install uv==0.13.8
ENV PATH=/opt/uv/bin:$PATH

WORKDIR /src

# The runtime venv with the exact versions of uv.lock (the wheel itself declares ranges),
# in a layer of its own that is reused until pyproject.toml or uv.lock change.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv export --frozen --no-dev --extra postgres --extra otel --no-emit-project --no-hashes \
        -o /tmp/requirements.txt \
    && uv venv --python python3 /opt/treadle \
    && uv pip install --python /opt/treadle/bin/python -r /tmp/requirements.txt

# Then Treadle as a wheel: the same artifact a team installs with pip, migrations inside
# (no source tree, no editable install: nothing refers to /src at run time).
COPY README.md alembic.ini ./
COPY alembic ./alembic
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv \
    uv build --wheel -o /tmp/dist \
    && uv pip install --python /opt/treadle/bin/python --no-deps /tmp/dist/*.whl

# The example workflows, importable from anywhere through a .pth file (they are not in the
# wheel). A team's package is importable the same way, or by `pip install`, or PYTHONPATH.
COPY examples /opt/treadle-examples/examples
RUN /opt/treadle/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))" \
        > /tmp/purelib \
    && echo /opt/treadle-examples > "$(cat /tmp/purelib)/treadle-examples.pth" \
    && /opt/treadle/bin/python -m compileall -q /opt/treadle-examples

# --- runtime: the venv only, run as an unprivileged user ---------------------------------
FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 treadle \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/treadle \
        --no-create-home --shell /usr/sbin/nologin treadle

# Same path as in the build stage: the venv's scripts refer to /opt/treadle/bin/python.
COPY --from=build /opt/treadle /opt/treadle
COPY --from=build /opt/treadle-examples /opt/treadle-examples

ENV PATH=/opt/treadle/bin:$PATH \
    PYTHONUNBUFFERED=1

# The default SQLite database and dev secret live in ./.treadle of the working directory,
# the only place the service user may write; the code is root-owned and read-only.
WORKDIR /var/lib/treadle
RUN mkdir -p /var/lib/treadle/.treadle && chown -R 10001:10001 /var/lib/treadle

USER 10001:10001

EXPOSE 8000

# Liveness of `serve` (follows TREADLE_PORT). Workers override it with
# `treadle worker --check --handlers …` (database reachable, schema at head, handlers
# importable), as docker-compose.yml does; `migrate` disables it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TREADLE_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["treadle"]
CMD ["serve", "--host", "0.0.0.0"]
