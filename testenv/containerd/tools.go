//go:build tools

// Package tools pins containerd 2.x (the daemon, its runc shim and ctr), the container runtime
// of the real-node test tier's DRA tests: kubelet passes CDI device IDs in the CRI field that
// containerd reads from 1.7.2 and reads by default in 2.x (docs/dra.md).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
