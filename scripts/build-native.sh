#!/usr/bin/env bash
# Build libgpushare-share.so, the share-view library loaded into shared containers
# (native/share/, docs/share-view.md), with the machine's C compiler.
#
# Usage: scripts/build-native.sh [OUTDIR]      (default: build/native/ in the repository)
#
# The last line on stdout is the library's absolute path (OUTDIR/libgpushare-share.so); progress
# and the compiler's messages go to stderr. Exit 0 when the library is there, non-zero with the
# reason otherwise. Rebuilt only when native/share/, this script, the compiler or the flags
# changed (the stamp OUTDIR/libgpushare-share.so.stamp records them); two builds into one OUTDIR
# at once take turns (flock).
#
# The compiler: $CC when set, else `cc`, else `gcc`. With none (or without the C library's
# headers) it installs Debian's gcc and libc6-dev with apt-get when run as root
# (scripts/lib/apt.sh), and otherwise fails saying what to install. The Dockerfile's `native`
# stage runs this script too, so the image's library is built with the same flags.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[native] %s\n' "$*" >&2; }
die() {
    printf '[native] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $# -le 1 ]] || die "usage: $0 [OUTDIR]"
OUT="${1:-$ROOT/build/native}"
[[ -n "$OUT" ]] || OUT="$ROOT/build/native"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT="$(cd "$OUT" && pwd)"
LIB="$OUT/libgpushare-share.so"
STAMP="$LIB.stamp"
SRC_DIR="$ROOT/native/share"

# Export only the interposed functions (the source marks them); C11 with warnings as errors.
CFLAGS=(-O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror -std=c11)
# libdl.so.2 and libpthread.so.0 by name and kept (--no-as-needed): under a glibc older than
# 2.34 the dl* and pthread_once functions live there, and a container's glibc may be older than
# the one this builds with (the source binds them to their first symbol versions).
LIBS=("-Wl,--no-as-needed" -l:libdl.so.2 -l:libpthread.so.0 -ldl -lpthread)
# The newest glibc symbol version the library may need: CentOS 7's and Ubuntu 14.04's glibc.
MAX_GLIBC=2.17

shopt -s nullglob
SOURCES=("$SRC_DIR"/*.c)
HEADERS=("$SRC_DIR"/*.h)
shopt -u nullglob
[[ ${#SOURCES[@]} -gt 0 ]] || die "no C sources in $SRC_DIR"

find_cc() {
    if [[ -n "${CC:-}" ]]; then
        command -v "$CC"
    else
        command -v cc || command -v gcc
    fi
}

# Installing needs root and apt-get; say what to do otherwise.
install_toolchain() {
    local why="$1"
    [[ -z "${CC:-}" ]] || die "$why (CC=$CC); install it, or unset CC to use cc/gcc"
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "$why: install a C compiler and the C library's headers" \
            "(Debian/Ubuntu: apt-get install gcc libc6-dev), or run this as root on Debian" \
            "to have them installed"
    fi
    # shellcheck source=lib/apt.sh
    source "$ROOT/scripts/lib/apt.sh"
    apt_install gcc libc6-dev
}

CC_BIN="$(find_cc || true)"
if [[ -z "$CC_BIN" ]]; then
    install_toolchain "no C compiler (cc or gcc) on PATH"
    CC_BIN="$(find_cc || true)"
    [[ -n "$CC_BIN" ]] || die "gcc installed but neither cc nor gcc is on PATH"
fi
# The headers come from libc6-dev, which gcc only recommends.
if ! printf '#include <dlfcn.h>\n#include <pthread.h>\n' | "$CC_BIN" -E -x c - >/dev/null 2>&1; then
    install_toolchain "$CC_BIN cannot find the C library's headers (dlfcn.h, pthread.h)"
    printf '#include <dlfcn.h>\n#include <pthread.h>\n' | "$CC_BIN" -E -x c - >/dev/null \
        || die "$CC_BIN still cannot find dlfcn.h/pthread.h after installing libc6-dev"
fi

fingerprint() {
    {
        printf '%s\n' "$CC_BIN" "${CFLAGS[*]}" "${LIBS[*]}"
        "$CC_BIN" --version 2>/dev/null | head -1
        (cd "$ROOT" \
            && sha256sum "${SOURCES[@]#"$ROOT/"}" "${HEADERS[@]#"$ROOT/"}" scripts/build-native.sh)
    } | sha256sum | cut -c1-16
}
WANT="$(fingerprint)"

exec 9>"$OUT/.build-native.lock"
flock 9
if [[ -f "$LIB" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    say "up to date: $LIB"
    printf '%s\n' "$LIB"
    exit 0
fi

say "compiling ${SOURCES[*]#"$ROOT/"} with $CC_BIN ($("$CC_BIN" --version 2>/dev/null | head -1))"
TMP="$OUT/.libgpushare-share.so.$$"
trap 'rm -f "$TMP"' EXIT
"$CC_BIN" "${CFLAGS[@]}" -o "$TMP" "${SOURCES[@]}" "${LIBS[@]}" >&2 \
    || die "$CC_BIN failed on ${SOURCES[*]#"$ROOT/"} (messages above)"

# Nothing but the interposed entry points may be exported (a program's own symbols would
# otherwise be shadowed by the library's internals). nm comes with binutils, beside gcc.
if command -v nm >/dev/null 2>&1; then
    unexpected="$(nm -D --defined-only "$TMP" | awk '{ print $NF }' \
        | grep -Ev '^(cu[A-Za-z0-9_]+|nvml[A-Za-z0-9_]+|dlsym)$' || true)"
    [[ -z "$unexpected" ]] \
        || die "the library exports more than the interposed functions: $unexpected"
fi

# A version need past MAX_GLIBC would stop every process of a container with an older glibc.
if command -v objdump >/dev/null 2>&1; then
    newest="$(objdump -p "$TMP" | grep -Eo 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/^GLIBC_//' \
        | sort -V | tail -1)"
    if [[ -n "$newest" && "$(printf '%s\n' "$newest" "$MAX_GLIBC" | sort -V | tail -1)" != "$MAX_GLIBC" ]]
    then
        die "the library needs GLIBC_$newest (at most GLIBC_$MAX_GLIBC allowed):" \
            "$(objdump -T "$TMP" | grep -F "GLIBC_$newest" | awk '{ print $NF }' | tr '\n' ' ')"
    fi
fi

mv -f "$TMP" "$LIB"
printf '%s\n' "$WANT" >"$STAMP"
say "built $LIB"
printf '%s\n' "$LIB"
