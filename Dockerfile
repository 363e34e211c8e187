# agent-server container image.
#
#   podman build --format docker -t agent-server .      (or: docker build -t agent-server .)
#   podman run --rm -p 127.0.0.1:8000:8000 agent-server
#
# The server is PID 1 (exec-form ENTRYPOINT), so `docker stop` / `podman stop` / the kubelet
# deliver SIGTERM to it and it runs its graceful shutdown. Configure it with AGENT_SERVER_*
# environment variables (or flags after the image name): AGENT_SERVER_APP=module:attribute
# serves your agent instead of the embedded demo; put your module under /app (on PYTHONPATH)
# or install it into /opt/venv in an image built FROM this one.
#
# BASE_IMAGE must provide python3 (3.11 or newer) with the venv module. Everything is installed
# into a venv (/opt/venv), never into the system Python, so a base whose python3 is
# "externally managed" (PEP 668, e.g. Debian's) works as well as the official python images.
# Both stages use the same BASE_IMAGE: the venv built in one runs in the other.
ARG BASE_IMAGE=python:3.11-slim

# ---- builder: wheels of the project and its dependencies, installed into a venv -----------
FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent_server ./agent_server
# Build every wheel first, then install from those wheels only (no index, no build tools in
# the venv). The runtime stage copies the venv: a COPY --from is keyed on its content, so a
# changed wheel always reaches the image (a RUN --mount of the builder is not, in buildah).
RUN /opt/venv/bin/pip wheel --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-index --find-links=/wheels agent-server

# ---- runtime: the base image, a non-root user and the venv ---------------------------------
FROM ${BASE_IMAGE} AS runtime
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --gid 10001 agent \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin agent \
    && mkdir -p /app
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
USER 10001:10001

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    AGENT_SERVER_HOST=0.0.0.0 \
    AGENT_SERVER_PORT=8000
EXPOSE 8000

# The server handles SIGTERM itself: readiness 503, drain, cancel, report, exit.
STOPSIGNAL SIGTERM
# Liveness only (/healthz stays 200 while draining). No curl in slim images: Python's urllib.
# Kept in the image with `podman build --format docker` (the OCI format has no HEALTHCHECK).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AGENT_SERVER_PORT', '8000'), timeout=2)"]

ENTRYPOINT ["agent-server", "run"]
