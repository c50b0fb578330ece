//go:build tools

// Package tools pins the helm command (helm.sh/helm/v4/cmd/helm), which renders the chart in
// deploy/helm/gpushare for scripts/render-manifests.sh and the deploy tests.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
