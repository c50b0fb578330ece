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

install_provided scripts/install-observe-tools.sh "$@"
