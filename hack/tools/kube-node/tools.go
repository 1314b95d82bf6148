//go:build tools

// Package tools pins k8s.io/kubernetes so that the node and control-plane components the
// cluster harness (test/kubecluster) runs build in this module: kubelet, kube-proxy,
// kube-scheduler and kube-controller-manager, of the same release as the tests' kube-apiserver.
// A module of its own, so that adding it did not change the kube-apiserver build's pin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
