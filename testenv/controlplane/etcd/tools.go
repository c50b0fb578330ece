//go:build tools

// Package tools pins the etcd server (its module root is package main).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
