# syntax=docker/dockerfile:1
# Two images, one per kind of pod (see charts/tessera); the command chooses the role:
#   --target control-plane   `tessera operator` (a Deployment) and `tessera gateway` (Deployments
#                            made by the operator): no torch, no transformers. The project is
#                            installed with --no-deps over requirements/control-plane.lock, the
#                            hash-locked closure of what those two roles import (`make lock`).
#   --target agent           `tessera agent` (a DaemonSet on GPU nodes), the node agent hosting
#                            the block engine: the whole project with torch. The last stage, so
#                            a plain `docker build .` makes it; it runs every other command too.
#
# Build arguments:
#   PYTHON_IMAGE     base image of every stage. Pinned to a patch release; pin a digest in your
#                    registry mirror (`--build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:…`).
#                    `make image` builds without a registry from a debootstrap stand-in with the
#                    same layout (scripts/image/base.sh).
#   TORCH_VARIANT    agent image only: which torch wheel to install: `cpu` (default; CPU agents)
#                    or a CUDA variant such as `cu124` / `cu126` / `cu128` for agents on GPU nodes.
#                    The CUDA wheels bundle the CUDA user-space libraries, so the base image stays
#                    python-slim; the node needs only the NVIDIA driver and container toolkit.
#                    Pick the variant your driver supports (CUDA 12.4 needs driver >= 550).
#   TORCH_INDEX_URL  the wheel index for that variant; derived from TORCH_VARIANT.
#
#   docker build --target control-plane -t tessera-control-plane:0.1.0 .
#   docker build --target agent -t tessera-agent:0.1.0 .                    # CPU torch
#   docker build --target agent --build-arg TORCH_VARIANT=cu124 -t tessera-agent:0.1.0-cu124 .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- wheel: the project's wheel, built once for both images ----
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY agent ./agent
COPY operator ./operator
RUN python -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-deps --wheel-dir /wheels .

# ---- control-plane-builder: pinned dependencies, then the project without its own ----
FROM ${PYTHON_IMAGE} AS control-plane-builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY requirements/control-plane.lock /tmp/control-plane.lock
RUN python -m venv /opt/tessera \
    && /opt/tessera/bin/pip install --require-hashes --no-deps --no-compile \
       --requirement /tmp/control-plane.lock
COPY --from=wheel /wheels /wheels
# --no-deps: the wheel's metadata asks for torch and transformers, which these roles never
# import (tests/image/test_control_plane_imports.py). Then what they never load goes: pip,
# setuptools, the test suites of numpy, scipy and networkx, the kubernetes client's unused
# asyncio copy (kubernetes.aio). Bytecode is compiled only for what the roles import at start
# (the pods' root filesystem is read-only: without it every start would compile them again).
# The build fails if torch or transformers are importable or the CLI does not start.
WORKDIR /opt/tessera
RUN bin/pip install --no-deps --no-compile /wheels/tessera-*.whl \
    && bin/python -m pip uninstall --yes pip setuptools \
    && rm -rf lib/python3.*/site-packages/kubernetes/aio \
    && find lib/python3.*/site-packages/numpy lib/python3.*/site-packages/scipy \
       lib/python3.*/site-packages/networkx -type d -name tests -prune -exec rm -rf {} + \
    && PYTHONDONTWRITEBYTECODE='' bin/python -c "import tessera.cli.main as m, \
tessera_operator.runner, tessera.gateway.server, tessera.planner.assign; m.build_parser()" \
    && bin/python -c "import importlib.util as u, sys; \
sys.exit(any(u.find_spec(m) for m in ('torch', 'transformers')))" \
    && bin/tessera --help > /dev/null

# ---- agent-builder: torch of the chosen variant, then the project with its dependencies ----
FROM ${PYTHON_IMAGE} AS agent-builder
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# The dependencies from requirements/agent.lock, hash-checked, in their own layer (the slow
# one, cached across source changes). `cpu`: the whole lock, torch's CPU wheel (from the CPU
# index) included. A CUDA variant: the lock without its torch entry, then torch==2.13.0 of
# that variant (and the CUDA libraries it needs) from the variant's index, the one install no
# hash covers (docs/dependencies.md). The project's wheel goes in last with --no-deps.
COPY requirements/agent.lock /tmp/agent.lock
RUN python -m venv /opt/tessera \
    && if [ "${TORCH_VARIANT}" = cpu ]; then \
         /opt/tessera/bin/pip install --require-hashes --no-deps \
           --extra-index-url "${TORCH_INDEX_URL}" --requirement /tmp/agent.lock; \
       else \
         awk '/^torch==/{skip=1; next} skip && /^ /{next} {skip=0; print}' /tmp/agent.lock \
           > /tmp/agent-no-torch.lock \
         && /opt/tessera/bin/pip install --require-hashes --no-deps \
           --requirement /tmp/agent-no-torch.lock \
         && /opt/tessera/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"; \
       fi
COPY --from=wheel /wheels /wheels
RUN /opt/tessera/bin/pip install --no-deps /wheels/tessera-*.whl \
    && /opt/tessera/bin/pip check \
    && /opt/tessera/bin/tessera --help > /dev/null

# ---- runtime: a non-root user and the environment both images share ----
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 tessera \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/tessera --create-home \
       --shell /usr/sbin/nologin tessera
# Caches go to /tmp so that the pods can run with a read-only root filesystem (the chart
# mounts an emptyDir there).
ENV PATH=/opt/tessera/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    TRITON_CACHE_DIR=/tmp/.cache/triton
WORKDIR /home/tessera

# ---- control-plane: the operator and the gateway ----
FROM runtime AS control-plane
LABEL org.opencontainers.image.title="tessera-control-plane" \
      org.opencontainers.image.description="Tessera operator and gateway (no torch)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=control-plane-builder /opt/tessera /opt/tessera
USER 10001:10001
# 8000: gateway HTTP (/v1/*, /metrics); 8080: the operator's liveness endpoint.
EXPOSE 8000 8080
ENTRYPOINT ["tessera"]
CMD ["--help"]

# ---- agent: the node agent (and every other command) ----
FROM runtime AS agent
ARG TORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="tessera-agent" \
      org.opencontainers.image.description="Tessera node agent (block engine, torch)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.tessera.torch-variant="${TORCH_VARIANT}"
COPY --from=agent-builder /opt/tessera /opt/tessera
USER 10001:10001
# 50051: agent gRPC (Agent + grpc.health.v1).
EXPOSE 50051
ENTRYPOINT ["tessera"]
CMD ["--help"]
