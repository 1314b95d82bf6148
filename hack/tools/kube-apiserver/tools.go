//go:build tools

// Package tools pins k8s.io/kubernetes so that `go build k8s.io/kubernetes/cmd/kube-apiserver`
// resolves in this module.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
