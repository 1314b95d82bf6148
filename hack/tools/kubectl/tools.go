//go:build tools

// Package tools pins k8s.io/kubernetes so that `go build k8s.io/kubernetes/cmd/kubectl` (and kubeadm)
// resolves in this module: the kubectl of the same release as the tests' kube-apiserver, for
// the test that runs the install docs' commands (Debian's kubectl is 1.20). A module of its
// own, so that adding it did not change the kube-apiserver build's pin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
