# syntax=docker/dockerfile:1
# One image for the three Tessera roles; the command chooses the role (see charts/tessera):
#   tessera operator ...   the kopf operator (a Deployment)
#   tessera agent ...      the node agent hosting the block engine (a DaemonSet on GPU nodes)
#   tessera gateway ...    the OpenAI-compatible HTTP gateway (Deployments made by the operator)
#
# Build arguments:
#   PYTHON_IMAGE     base image of both stages. Pinned to a patch release; pin a digest in your
#                    registry mirror (`--build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:…`).
#   TORCH_VARIANT    which torch wheel to install: `cpu` (default; operator, gateway, CPU agents)
#                    or a CUDA variant such as `cu124` / `cu126` / `cu128` for agents on GPU nodes.
#                    The CUDA wheels bundle the CUDA user-space libraries, so the base image stays
#                    python-slim; the node needs only the NVIDIA driver and container toolkit.
#                    Pick the variant your driver supports (CUDA 12.4 needs driver >= 550).
#   TORCH_INDEX_URL  the wheel index for that variant; derived from TORCH_VARIANT.
#
#   docker build -t tessera:0.1.0 .                                        # CPU torch
#   docker build --build-arg TORCH_VARIANT=cu124 -t tessera:0.1.0-cu124 .  # CUDA torch for agents
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- builder: build the wheel, install it with its dependencies into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# torch first, from the chosen variant's index, in its own layer (the slow one, cached across
# source changes): pyproject pins torch==2.13.0, which the variant's build (2.13.0+cu124,
# say) already satisfies, so installing the wheel next keeps it.
RUN python -m venv /opt/tessera \
    && /opt/tessera/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY agent ./agent
COPY operator ./operator
RUN /opt/tessera/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/tessera/bin/pip install /wheels/tessera-*.whl \
    && /opt/tessera/bin/tessera --help > /dev/null

# ---- runtime: the venv and a non-root user, nothing else ----
FROM ${PYTHON_IMAGE} AS runtime
ARG TORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Tessera operator, node agent and gateway" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.tessera.torch-variant="${TORCH_VARIANT}"
RUN groupadd --system --gid 10001 tessera \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/tessera --create-home \
       --shell /usr/sbin/nologin tessera
COPY --from=builder /opt/tessera /opt/tessera
# Caches go to /tmp so that the pods can run with a read-only root filesystem (the chart
# mounts an emptyDir there).
ENV PATH=/opt/tessera/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    TRITON_CACHE_DIR=/tmp/.cache/triton
USER 10001:10001
WORKDIR /home/tessera
# 50051: agent gRPC (Agent + grpc.health.v1); 8000: gateway HTTP (/v1/*, /metrics).
EXPOSE 50051 8000
ENTRYPOINT ["tessera"]
CMD ["--help"]
