# Shared by scripts/install-node-runtime.sh, scripts/install-observe-tools.sh and
# scripts/build-image.sh: installing Debian packages with apt-get. Source it after defining `say MESSAGE` and `die MESSAGE` (each script
# prefixes its own name). Needs root; the caller checks that first with its own message.

# apt_install PACKAGE...: install the packages without their recommends, under the machine-wide
# lock /run/gpushare-apt.lock (two checkouts installing at once must not collide, and dpkg's own
# lock is waited for up to 10 minutes); when the install fails, refresh the package lists once
# and retry. Dies with apt-get's output above the message when that fails too.
apt_install() {
    command -v apt-get >/dev/null 2>&1 \
        || die "no apt-get here: install $* (or their equivalents) yourself"
    say "installing $* with apt-get"
    exec 8>/run/gpushare-apt.lock
    flock 8
    if ! _apt_get install -y --no-install-recommends "$@"; then
        say "install failed; refreshing the package lists once and retrying"
        _apt_get update || die "apt-get update failed"
        _apt_get install -y --no-install-recommends "$@" || die "apt-get install $* failed (output above)"
    fi
    exec 8>&-
}

_apt_get() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q "$@" >&2
}

# install_provided SCRIPT [--check]: the whole flow of an installer that keeps a table of
# packages, PROVIDES (an associative array the caller declares: package -> a file it installs
# that the project uses): with --check, die listing what is missing; otherwise install only
# what is missing (no apt-get call when nothing is), with package scripts kept from starting
# services (no init system runs here), and check that each file is there after. Returns 0 with
# nothing installed, 0 after installing; dies on any failure. SCRIPT names the caller in the
# messages.
install_provided() {
    local script="$1"
    shift
    local missing=() pkg
    for pkg in "${!PROVIDES[@]}"; do
        [[ -x "${PROVIDES[$pkg]}" ]] || missing+=("$pkg")
    done
    if [[ "${1:-}" == "--check" ]]; then
        [[ ${#missing[@]} -eq 0 ]] || die "missing packages: ${missing[*]} (run $script)"
        return 0
    elif [[ $# -gt 0 ]]; then
        die "unknown argument: $1 (usage: $script [--check])"
    fi
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "${!PROVIDES[*]}: all present"
        return 0
    fi
    [[ "$(id -u)" -eq 0 ]] \
        || die "installing ${missing[*]} needs root (apt-get); run as root or install them yourself"
    local policy=/usr/sbin/policy-rc.d
    if [[ ! -e "$policy" ]]; then  # removed again however this ends
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt_install "${missing[@]}"
    for pkg in "${missing[@]}"; do
        [[ -x "${PROVIDES[$pkg]}" ]] || die "$pkg installed but ${PROVIDES[$pkg]} is missing"
    done
    say "installed: ${missing[*]}"
}
