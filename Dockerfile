# syntax=docker/dockerfile:1
# The gpushare image: one image, both commands.
#   gpushare extender        (the Deployment; runs as the non-root user below)
#   gpushare device-plugin   (the DaemonSet; runs as root by its securityContext, because
#                             kubelet's device-plugin sockets on the host are root's)
# Build:  docker build -t <registry>/gpushare:0.1.0 .
# The NVIDIA driver library (NVML) is not in the image: the NVIDIA container runtime mounts it
# into the device plugin's container (chart value devicePlugin.runtimeClassName).

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: a wheel of gpushare-k8s and of every runtime dependency ---------------------------
# The runtime dependencies only: the simulator's extra (`sim`: polars, matplotlib) is not built
# or installed, so neither command can load it.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels .

# ---- runtime: the wheels installed, no build context, no compilers ---------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels gpushare-k8s \
    && groupadd --system --gid 10001 gpushare \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpushare
# The extender's port (the device plugin's metrics port is set by its flag).
EXPOSE 12345
USER 10001:10001
ENTRYPOINT ["gpushare"]
CMD ["extender"]
