#!/usr/bin/env bash
# Re-pin kubernetes/go.mod to another Kubernetes release: one `replace` per staging module that
# k8s.io/kubernetes requires at v0.0.0 (read from its go.mod on the proxy), then `go mod tidy`.
#   testenv/controlplane/update-kubernetes.sh v1.37.1
# Check first that the proxy serves the release's zip, not only its .info/.mod:
#   curl -sI "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/v1.37.1.zip"
set -euo pipefail
version="${1:?usage: $0 v1.MINOR.PATCH}"
[[ "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a v1.MINOR.PATCH version: $version" >&2; exit 1; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/kubernetes" && pwd)"
cd "$dir"

upstream="$(mktemp)"
trap 'rm -f "$upstream"' EXIT
(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$version") \
    | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p' | xargs cat >"$upstream"
go_line="$(awk '$1 == "go" { print $2; exit }' "$upstream")"

{
    echo '// Test tool only: builds kube-apiserver and kube-scheduler at a pinned version for the'
    echo '// cluster-test tier (see scripts/build-controlplane.sh). Never imported by gpushare.'
    echo 'module gpushare.test/controlplane/kubernetes'
    echo
    echo "go $go_line"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo '// k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with'
    echo '// ./staging/src/...; a consumer must point each one at the published v0.<minor>.<patch> tag.'
    echo 'replace ('
    awk '/^require \(/ { r = 1; next } r && /^\)/ { r = 0 } r && $2 == "v0.0.0" { print $1 }' "$upstream" \
        | while read -r module; do
            if grep -q "^[[:space:]]$module => ./staging" "$upstream"; then
                printf '\t%s => %s %s\n' "$module" "$module" "$staging"
            fi
        done
    echo ')'
} >go.mod
rm -f go.sum
nice -n 19 go mod tidy
echo "kubernetes/go.mod now pins k8s.io/kubernetes $version (staging $staging, go $go_line)"
