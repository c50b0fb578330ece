#!/usr/bin/env bash
# Re-render deploy/manifests/ from the chart in deploy/helm/gpushare with the helm that
# scripts/build-helm.sh builds (it builds it first when missing). tests/test_deploy_manifests.py
# fails when the committed files differ from a fresh render: run this after changing the chart.
#
#   deploy/manifests/gpushare.yaml                 default values, the extender's TLS Secret named
#                                                  gpushare-extender-tls and kube-scheduler's client
#                                                  certificate gpushare-extender-client (the user
#                                                  creates both: docs/install.md)
#   deploy/manifests/gpushare-with-scheduler.yaml  plus the second scheduler (gpushare-scheduler)
#
# Both are rendered for namespace kube-system, release gpushare and Kubernetes 1.37.1 (the
# second scheduler's image tag): the same arguments as gpushare.testing.helm.MANIFESTS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/build-helm.sh"
HELM="$("$ROOT/scripts/build-helm.sh" --print-path)"
RELEASE=gpushare
NAMESPACE=kube-system
KUBE_VERSION=1.37.1
VERSION="$("$HELM" version --short)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export HELM_CACHE_HOME="$TMP" HELM_CONFIG_HOME="$TMP" HELM_DATA_HOME="$TMP"

render() {
    local name="$1" how="$2"
    shift 2
    {
        printf '# Rendered from deploy/helm/gpushare by scripts/render-manifests.sh: do not edit.\n'
        printf '# helm %s template %s --namespace %s --kube-version %s (%s).\n' \
            "$VERSION" "$RELEASE" "$NAMESPACE" "$KUBE_VERSION" "$how"
        "$HELM" template "$RELEASE" "$ROOT/deploy/helm/gpushare" --namespace "$NAMESPACE" \
            --kube-version "$KUBE_VERSION" "$@"
    } >"$TMP/$name"
    mv "$TMP/$name" "$ROOT/deploy/manifests/$name"
    printf '[render] deploy/manifests/%s\n' "$name" >&2
}

mkdir -p "$ROOT/deploy/manifests"
TLS=(--set extender.tls.secretName=gpushare-extender-tls
    --set extender.tls.clientAuth.secretName=gpushare-extender-client)
render gpushare.yaml "${TLS[*]}" "${TLS[@]}"
render gpushare-with-scheduler.yaml "${TLS[*]} --set scheduler.second.enabled=true" \
    "${TLS[@]}" --set scheduler.second.enabled=true
