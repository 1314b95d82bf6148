//go:build tools

// Package tools pins prometheus-operator's API module, whose Go types controller-gen turns into
// the monitoring.coreos.com CRDs (ServiceMonitor, PodMonitor, PrometheusRule...) that the chart
// tests apply to a real API server: nothing of prometheus-operator's repository is copied.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)
