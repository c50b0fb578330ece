//go:build tools

// Package tools pins the Kubernetes commands this module builds: the control plane the cluster
// tests run (kube-apiserver, kube-scheduler, kube-controller-manager), the node of the node tier
// (kubelet, kube-proxy) and kubectl (the tests run `kubectl inspect gpushare` through it).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
