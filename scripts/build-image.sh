#!/usr/bin/env bash
# Build the gpushare image from the repository's Dockerfile with no registry and no Docker
# engine, into an image archive that `ctr -n k8s.io images import` (and `docker load`) accepts.
#
#   base     Debian bookworm made by mmdebstrap from Debian's packages (python3 3.11, a venv with
#            pip first on PATH, ca-certificates, passwd), committed as a local image: it stands in
#            for the Dockerfile's default base python:3.11-slim (build argument PYTHON_IMAGE),
#            which would come from a registry.
#   build    `buildah bud` (Debian's buildah) with chroot isolation: no daemon, no user
#            namespaces, no registry; layer cache on (--layers), so a second build reuses every
#            step whose inputs did not change.
#   archive  `buildah push ... docker-archive:` under out/image/, tagged gpushare/gpushare:<version>.
#
# Why buildah: it runs the Dockerfile itself (multi-stage, ARG before FROM, RUN --mount from a
# stage), as root without a daemon, and ships in Debian. kaniko is not packaged in Debian and
# wants to own the whole root filesystem of the machine it runs on; umoci only unpacks and repacks
# OCI layouts and cannot run a Dockerfile. Why mmdebstrap (not debootstrap): it writes the root
# filesystem straight into a tarball, honours --no-install-recommends and dpkg path filters (a
# smaller base) and runs a hook inside the chroot (the venv).
#
# Caches (reused when present; any change to this script rebuilds the base):
#   ${GPUSHARE_IMAGE_CACHE:-$HOME/.cache/gpushare/image}/base/<fingerprint>.tar   the base rootfs
#   ${GPUSHARE_IMAGE_CACHE:-$HOME/.cache/gpushare/image}/storage                  buildah's images
# The archive is rebuilt only when the Dockerfile, .dockerignore, pyproject.toml, constraints.txt,
# README.md, src/ less the test harness and the demo, native/ and scripts/build-native.sh (what
# the Dockerfile copies) or this script change; its stamp file records that.
#
# Usage:
#   scripts/build-image.sh               build (or reuse) the archive, print progress
#   scripts/build-image.sh --print-path  print the archive's path and the image reference in it
#
# Environment: GPUSHARE_IMAGE_CACHE (cache directory), GPUSHARE_IMAGE_ARCHIVE (archive path),
# GPUSHARE_IMAGE_STORAGE_DRIVER (overlay or vfs; default overlay unless the cache is on overlayfs).
# Needs root (apt-get install of buildah and mmdebstrap when missing; chroot builds). Exits non-zero
# with the reason when it cannot build: the real-node chart test needs the image and never skips.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[image] %s\n' "$*" >&2; }
die() {
    printf '[image] ERROR: %s\n' "$*" >&2
    printf '[image] The real-node chart test (tests/node) needs this image; it is not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

VERSION="$(awk -F'"' '/^version *=/ { print $2; exit }' "$ROOT/pyproject.toml")"
[[ -n "$VERSION" ]] || die "cannot read the version from $ROOT/pyproject.toml"
CACHE_DIR="${GPUSHARE_IMAGE_CACHE:-${HOME}/.cache/gpushare/image}"
ARCHIVE="${GPUSHARE_IMAGE_ARCHIVE:-$ROOT/out/image/gpushare-$VERSION.tar}"
IMAGE_REF="gpushare/gpushare:$VERSION"

if [[ "${1:-}" == "--print-path" ]]; then
    printf '%s\n%s\n' "$ARCHIVE" "$IMAGE_REF"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--print-path])"
fi

# ---- the base: Debian packages only ------------------------------------------------------
SUITE=bookworm
MIRRORS=(
    "deb http://deb.debian.org/debian $SUITE main"
    "deb http://deb.debian.org/debian $SUITE-updates main"
    "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# python3 (3.11 in bookworm), python3-venv (pip through ensurepip), passwd (groupadd/useradd).
BASE_PACKAGES=python3,python3-venv,ca-certificates,passwd
# Like python:3.11-slim, `pip` and `python3` on PATH install where they may: a venv at /opt/venv
# (Debian's own python3 refuses pip installs, PEP 668).
VENV=/opt/venv
BASE_ENV=(
    "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "LANG=C.UTF-8"
)
MMDEBSTRAP_ARGS=(
    --variant=minbase --include="$BASE_PACKAGES"
    # merged /usr as debootstrap makes it, without the usrmerge package (and the perl it needs)
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='APT::Install-Recommends "false"'
    --aptopt='Acquire::Check-Valid-Until "false"'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --customize-hook="chroot \"\$1\" python3 -m venv $VENV"
)

ARCH="$(dpkg --print-architecture 2>/dev/null || uname -m)"
fingerprint_base() {
    printf '%s\n' "$SUITE" "$ARCH" "${MIRRORS[@]}" "${MMDEBSTRAP_ARGS[@]}" "${BASE_ENV[@]}" \
        | sha256sum | cut -c1-16
}
# What the Dockerfile copies (pyproject.toml, constraints.txt, README.md, src/ less what
# .dockerignore drops: gpushare.testing and gpushare.demo; native/ and scripts/build-native.sh
# for the share-view library), the recipe itself, and this script.
fingerprint_image() {
    (
        cd "$ROOT"
        printf '%s\n' "$BASE_REF"
        find Dockerfile .dockerignore pyproject.toml constraints.txt README.md src native \
            scripts/build-native.sh scripts/build-image.sh \
            -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
            ! -path '*.egg-info/*' ! -path 'src/gpushare/testing/*' ! -path 'src/gpushare/demo/*' \
            -print0 \
            | LC_ALL=C sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -c1-16
}

BASE_FP="$(fingerprint_base)"
BASE_REF="localhost/gpushare-base:$SUITE-$BASE_FP"
BASE_TAR="$CACHE_DIR/base/$SUITE-$BASE_FP.tar"
WANT="$(fingerprint_image)"
STAMP="$ARCHIVE.stamp"
cached() { [[ -f "$STAMP" && -f "$ARCHIVE" && "$(head -1 "$STAMP")" == "$WANT" ]]; }

say "image: $IMAGE_REF (base $BASE_REF)"
say "archive: $ARCHIVE"
if cached; then
    say "present and up to date; nothing to build"
    exit 0
fi

# ---- preconditions: root, buildah, mmdebstrap -------------------------------------------
[[ "$(id -u)" -eq 0 ]] || die "building the image needs root (chroot builds, mmdebstrap's root mode)"
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [[ ${#need[@]} -gt 0 ]]; then
    apt_install "${need[@]}"
fi

mkdir -p "$CACHE_DIR/base" "$(dirname "$ARCHIVE")"
exec 9>"$CACHE_DIR/.lock"
flock 9
if cached; then
    say "another build finished meanwhile; nothing to build"
    exit 0
fi
START=$SECONDS
step() { say "$1 (t+$((SECONDS - START))s)"; }

DRIVER="${GPUSHARE_IMAGE_STORAGE_DRIVER:-}"
if [[ -z "$DRIVER" ]]; then
    # overlay cannot stack on overlayfs (a cache inside a container's root filesystem).
    if [[ "$(stat -f -c %T "$CACHE_DIR")" == overlayfs ]]; then DRIVER=vfs; else DRIVER=overlay; fi
fi
BUILDAH=(buildah --root "$CACHE_DIR/storage" --runroot "$CACHE_DIR/run" --storage-driver "$DRIVER")
export BUILDAH_ISOLATION=chroot
step "buildah $(buildah version | awk '/^Version:/ { print $2 }'), storage driver $DRIVER"

SCRATCH="$(mktemp -d "$CACHE_DIR/.partial.XXXXXX")"
WORKING_CONTAINER=""
cleanup() {
    [[ -n "$WORKING_CONTAINER" ]] && "${BUILDAH[@]}" rm "$WORKING_CONTAINER" >/dev/null 2>&1
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

if "${BUILDAH[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
    step "base $BASE_REF: in buildah's storage"
else
    if [[ -f "$BASE_TAR" ]]; then
        step "base rootfs: cached $BASE_TAR"
    else
        step "base rootfs: mmdebstrap $SUITE with $BASE_PACKAGES (a few minutes, once)"
        mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$SUITE" "$SCRATCH/base.tar" "${MIRRORS[@]}" \
            >"$SCRATCH/mmdebstrap.log" 2>&1 \
            || { tail -30 "$SCRATCH/mmdebstrap.log" >&2; die "mmdebstrap failed (log above)"; }
        mv -f "$SCRATCH/base.tar" "$BASE_TAR"
        step "base rootfs: $(du -m "$BASE_TAR" | cut -f1) MiB"
    fi
    step "base image: committing $BASE_REF"
    WORKING_CONTAINER="$("${BUILDAH[@]}" from --pull=false scratch)"
    mnt="$("${BUILDAH[@]}" mount "$WORKING_CONTAINER")"
    # Device nodes are the runtime's business, not the image's.
    tar -x -C "$mnt" --numeric-owner --exclude='./dev/*' -f "$BASE_TAR"
    "${BUILDAH[@]}" umount "$WORKING_CONTAINER" >/dev/null
    env_args=()
    for e in "${BASE_ENV[@]}"; do env_args+=(--env "$e"); done
    "${BUILDAH[@]}" config "${env_args[@]}" --cmd python3 \
        --label "org.opencontainers.image.description=Debian $SUITE + python3 venv (scripts/build-image.sh)" \
        "$WORKING_CONTAINER"
    "${BUILDAH[@]}" commit --quiet --rm "$WORKING_CONTAINER" "$BASE_REF" >/dev/null
    WORKING_CONTAINER=""
fi

# The build's RUN steps use the machine's network (pip fetches the wheels from the index the
# machine's pip uses) and, when the machine trusts extra certificate authorities (a proxy),
# its CA bundle, mounted for the build only: nothing of it lands in the image.
volumes=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    volumes+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
step "building the Dockerfile (buildah bud --layers, PYTHON_IMAGE=$BASE_REF)"
"${BUILDAH[@]}" bud --layers --pull=false --network host "${volumes[@]}" \
    --build-arg "PYTHON_IMAGE=$BASE_REF" --iidfile "$SCRATCH/iid" \
    --tag "localhost/gpushare:$VERSION" --file "$ROOT/Dockerfile" "$ROOT" >"$SCRATCH/bud.log" 2>&1 \
    || { tail -40 "$SCRATCH/bud.log" >&2; die "buildah bud failed (log above)"; }
grep -E 'STEP [0-9]+/[0-9]+:|Using cache' "$SCRATCH/bud.log" | cut -c1-110 | sed 's/^/[image]   /' >&2 \
    || true
IMAGE_ID="$(cat "$SCRATCH/iid")"

step "writing the archive ($IMAGE_REF)"
rm -f "$ARCHIVE" "$STAMP"
"${BUILDAH[@]}" push --quiet "$IMAGE_ID" "docker-archive:$SCRATCH/image.tar:$IMAGE_REF" >&2 \
    || die "buildah push to a docker-archive failed (output above)"
mv -f "$SCRATCH/image.tar" "$ARCHIVE"
printf '%s\n%s\n' "$WANT" "$IMAGE_ID" >"$STAMP"
step "done: $ARCHIVE ($(du -m "$ARCHIVE" | cut -f1) MiB, image $IMAGE_ID)"
