//go:build tools

// Package tools pins the kwok controller command.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
