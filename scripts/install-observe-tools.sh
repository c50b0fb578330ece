#!/usr/bin/env bash
# Install what the observability tests need, from the distribution's packages with apt-get:
# Prometheus and promtool (the Grafana dashboard's queries evaluated on a real Prometheus, the
# alert rules checked and unit-tested: tests/cluster/test_prometheus.py, tests/test_alert_rules.py)
# and Chromium (the GPU map of `kubectl inspect gpushare --web` in a real headless browser:
# tests/cluster/test_inspect_web.py).
#
# Idempotent: installs only what is missing (no apt-get call at all when everything is there).
#
# Usage: scripts/install-observe-tools.sh            install what is missing
#        scripts/install-observe-tools.sh --check    exit 1 listing what is missing, install nothing
set -euo pipefail

say() { printf '[observe-tools] %s\n' "$*" >&2; }
die() {
    printf '[observe-tools] ERROR: %s\n' "$*" >&2
    exit 1
}

# shellcheck source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

# package -> a file it installs that the tests use
declare -A PROVIDES=(
    [prometheus]=/usr/bin/promtool
    [chromium]=/usr/bin/chromium
)

missing=()
for pkg in "${!PROVIDES[@]}"; do
    [[ -x "${PROVIDES[$pkg]}" ]] || missing+=("$pkg")
done

if [[ "${1:-}" == "--check" ]]; then
    [[ ${#missing[@]} -eq 0 ]] || die "missing packages: ${missing[*]} (run scripts/install-observe-tools.sh)"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--check])"
fi

if [[ ${#missing[@]} -eq 0 ]]; then
    say "prometheus, promtool, chromium: all present"
    exit 0
fi

[[ "$(id -u)" -eq 0 ]] || die "installing ${missing[*]} needs root (apt-get); run as root or install them yourself"

# No init system runs services here; keep the prometheus package from trying to start itself.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
fi
cleanup() { [[ $added_policy -eq 1 ]] && rm -f "$policy"; return 0; }
trap cleanup EXIT

apt_install "${missing[@]}"
for pkg in "${missing[@]}"; do
    [[ -x "${PROVIDES[$pkg]}" ]] || die "$pkg installed but ${PROVIDES[$pkg]} is missing"
done
say "installed: $(promtool --version 2>&1 | head -1); $(chromium --version 2>/dev/null || echo chromium)"
