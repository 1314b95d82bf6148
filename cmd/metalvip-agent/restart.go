package main

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/plannedrestart"
)

// restartGrace returns the grace this SIGTERM gets: --restart-grace, unless --pod-name names
// this agent's Pod and it is not being deleted through the API (the kubelet stops it on its
// own: a node shutting down, whose VIPs should move now), or it cannot be read.
func restartGrace(ctx context.Context, f *flags) time.Duration {
	if f.restartGrace <= 0 || f.podName == "" {
		return f.restartGrace
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		klog.ErrorS(err, "SIGTERM: no restart grace, the API server cannot be asked whether the Pod is being deleted")
		return 0
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "metalvip-agent"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.ErrorS(err, "SIGTERM: no restart grace, the API server cannot be asked whether the Pod is being deleted")
		return 0
	}
	planned, why := plannedrestart.Planned(ctx, c, f.podNamespace, f.podName)
	if !planned {
		klog.InfoS("SIGTERM: not a planned restart, the VIPs move now", "why", why)
		return 0
	}
	klog.InfoS("SIGTERM: a planned restart", "why", why, "grace", f.restartGrace)
	return f.restartGrace
}
