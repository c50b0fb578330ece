# Shared by scripts/install-node-runtime.sh and scripts/build-image.sh: installing Debian
# packages with apt-get. Source it after defining `say MESSAGE` and `die MESSAGE` (each script
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
