//go:build tools

// Package tools pins k8s.io/kubernetes so that every Kubernetes component the tests run builds
// in this module, of one release: kube-apiserver (integration tests), kubelet, kube-proxy,
// kube-scheduler and kube-controller-manager (the cluster harness, test/kubecluster), kubectl
// and kubeadm (the install docs' test). hack/kube.sh builds them in one `go build`.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
