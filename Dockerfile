# The gpushare image: one image, both commands.
#   gpushare extender        (the Deployment; runs as the non-root user below)
#   gpushare device-plugin   (the DaemonSet; runs as root by its securityContext, because
#                             kubelet's device-plugin sockets on the host are root's)
# Build:  docker build -t <registry>/gpushare:0.1.0 .
#    or:  scripts/build-image.sh (`make image`): no registry and no Docker engine; buildah runs
#         this file on a base made from Debian's packages (docs/install.md)
# The NVIDIA driver library (NVML) is not in the image: the NVIDIA container runtime mounts it
# into the device plugin's container (chart value devicePlugin.runtimeClassName).
# /opt/gpushare/lib/libgpushare-share.so: the share view for shared containers (docs/share-view.md),
# compiled in the `native` stage with the base's own gcc.
#
# PYTHON_IMAGE: the base of every stage. Any image with Python >= 3.11 as `python3` on PATH
# (with its venv module) and groupadd/useradd: python:3.11-slim by default, or the Debian
# bookworm base that scripts/build-image.sh makes with mmdebstrap.
ARG PYTHON_IMAGE=python:3.11-slim

# ---- deps: a venv with every runtime dependency of gpushare-k8s -------------------------------
# Built from pyproject.toml and constraints.txt alone (a stub package stands in for src/), so
# that this layer, the large one, is rebuilt only when the dependencies change. constraints.txt
# pins every version (the set `make test` ran on; `make constraints` moves it), so two builds of
# one commit install the same packages. The .pth file puts /opt/gpushare/app
# (stage `app`) on the venv's import path. The stub's build directory goes too: setuptools would
# reuse its empty gpushare/__init__.py when building the real package.
# The runtime dependencies only: the simulator's extra (`sim`: polars, matplotlib) is not
# installed, so neither command can load it.
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
RUN python3 -m venv /opt/gpushare/venv \
    && mkdir -p src/gpushare && touch src/gpushare/__init__.py \
    && /opt/gpushare/venv/bin/pip install --constraint constraints.txt . \
    && /opt/gpushare/venv/bin/pip uninstall --yes gpushare-k8s \
    && rm -rf src build ./*.egg-info \
    && /opt/gpushare/venv/bin/python -c "import pathlib, site; \
pathlib.Path(site.getsitepackages()[0], 'gpushare-app.pth').write_text('/opt/gpushare/app\n')"

# ---- app: gpushare itself, without its dependencies (rebuilt when src/ changes) ---------------
# The wheel's packages: the test harness (gpushare.testing) and the demo are left out by
# pyproject.toml's package list and by .dockerignore.
FROM deps AS app
COPY src ./src
RUN /opt/gpushare/venv/bin/pip install --no-deps --target /opt/gpushare/app .

# ---- native: libgpushare-share.so (native/share/, docs/share-view.md) --------------------------
# Compiled by the base distribution's gcc on the base itself, so that it links against the glibc
# of the image it ships in, with the flags of scripts/build-native.sh (what `make native` runs).
# Only the library leaves this stage.
FROM ${PYTHON_IMAGE} AS native
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/build-native.sh ./scripts/
COPY native ./native
RUN bash scripts/build-native.sh build/native

# ---- runtime: the directories above, no build context, no compilers ----------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/gpushare/app/bin:/opt/gpushare/venv/bin:$PATH
RUN groupadd --system --gid 10001 gpushare \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpushare
COPY --from=deps /opt/gpushare/venv /opt/gpushare/venv
COPY --from=app /opt/gpushare/app /opt/gpushare/app
COPY --from=native /src/build/native/libgpushare-share.so /opt/gpushare/lib/libgpushare-share.so
# The extender's port (the device plugin's metrics port is set by its flag).
EXPOSE 12345
USER 10001:10001
ENTRYPOINT ["gpushare"]
CMD ["extender"]
