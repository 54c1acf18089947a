# syntax=docker/dockerfile:1
# tokengate container image (deploy/DEPLOYMENT.md explains how to run it).
#
# Two stages: the builder turns the source into a wheel and collects the wheels of
# its runtime dependencies (never the `dev` extra); the final stage installs those
# wheels offline, so no compiler, source tree or build tool reaches the image.
# Secrets (TAOTOKEN_API_KEY, TOKENGATE_ADMIN_KEY, TOKENGATE_KEYS, a Redis URL with a
# password) are never written here: pass them at run time (`docker run -e`, a
# Compose `environment:`, a Kubernetes Secret).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
# COMPILE=1 (the default) compiles the request's path with mypyc into C extensions
# (setup.py, app/build.py): about 24 % fewer instructions per request, the same code.
# `--build-arg COMPILE=0` builds the pure-Python wheel. The compiler (mypy) and a
# setuptools that builds wheels by itself are pinned.
ARG COMPILE=1
ARG MYPY_VERSION=2.4.1
ARG SETUPTOOLS_VERSION=84.2.1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from: pyproject.toml, setup.py (the compiled build's
# hook), README.md (its long description, when present) and the `app` package.
COPY pyproject.toml setup.py README.md* ./
COPY app ./app
# With the `otel` extra's wheels, so traces can be turned on by the environment alone
# (TOKENGATE_TRACING__ENABLED=true); they are never imported while tracing is off.
RUN python -m pip wheel --wheel-dir /wheels ".[otel]"
# The compiled wheel replaces the pure one. mypyc type-checks the package, so the
# runtime dependencies are installed here (from the wheels just built) beside mypy;
# gcc stays in this stage. Its version follows the base image's Debian release.
# hadolint ignore=DL3008
RUN if [ "$COMPILE" = "1" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/* \
        && python -m pip install --no-index --find-links=/wheels /wheels/*.whl \
        && python -m pip install "mypy==${MYPY_VERSION}" "setuptools==${SETUPTOOLS_VERSION}" \
        && rm /wheels/tokengate-*.whl \
        && TOKENGATE_COMPILE=1 python -m pip wheel --no-deps --no-build-isolation \
            --wheel-dir /wheels . ; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from the builder, so they never become a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels /wheels/tokengate-*.whl \
        /wheels/opentelemetry_sdk-*.whl /wheels/opentelemetry_exporter_otlp_proto_http-*.whl

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without a name.
RUN groupadd --system --gid 10001 tokengate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin tokengate \
    && mkdir -p /app/config /app/var \
    && chown 10001:10001 /app/var

# The repo's seed files are the defaults; mount a directory over /app/config to
# replace them (a Compose volume, a Kubernetes ConfigMap). Owned by root: read-only
# for the app user.
COPY config/config.toml config/settings.json /app/config/
WORKDIR /app

# Container defaults; every one can be overridden at run time.
# - listen on all interfaces (the CLI's own default is loopback);
# - logs to stdout (the seed config.toml names a file under /var/log/supernode);
# - the embedded SQLite database (ledger, batches, live limits) in /app/var, the one
#   directory the app user may write; replicas set TOKENGATE_DATABASE_URL instead.
# DL3064 flags "TOKEN" in the TOKENGATE_ prefix; none of these values is a secret.
# hadolint ignore=DL3064
ENV TOKENGATE_HOST=0.0.0.0 \
    TOKENGATE_PORT=8080 \
    TOKENGATE_WORKERS=1 \
    TOKENGATE_CONFIG=/app/config/config.toml \
    TOKENGATE_SETTINGS=/app/config/settings.json \
    TOKENGATE_LOGGING__OUTPUT=stdout \
    TOKENGATE_DATABASE__PATH=/app/var/tokengate.sqlite3

USER 10001:10001
EXPOSE 8080

# slim has no curl: probe liveness with the interpreter that is already there.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('TOKENGATE_PORT', '8080') + '/health', timeout=2)"]

# SIGTERM drains: readiness turns 503, in-flight and queued work finishes within
# server.drain_timeout_sec (TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC, default 30), exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tokengate", "serve"]
