package kubeapi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// MonitoringCRDs generates prometheus-operator's monitoring.coreos.com/v1 CRDs (ServiceMonitor,
// PodMonitor, PrometheusRule...) from its Go API module, pinned in hack/tools/promoperator,
// with controller-gen: once per test binary, into a temporary folder whose path it returns.
var MonitoringCRDs = sync.OnceValues(func() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "metalvip-monitoring-crds-")
	if err != nil {
		return "", err
	}
	start := time.Now()
	cmd := exec.Command("go", "tool", "controller-gen", "crd:maxDescLen=0",
		"paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1", "output:crd:dir="+dir)
	cmd.Dir = filepath.Join(root, "hack", "tools", "promoperator")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("generate prometheus-operator's CRDs with controller-gen: %v\n%s", err, out)
	}
	fmt.Fprintf(os.Stderr, "prometheus-operator's CRDs generated from its Go API module in %s\n", time.Since(start).Round(time.Millisecond))
	return dir, nil
})

// InstallMonitoringCRDs creates prometheus-operator's CRDs (generated from its Go API module,
// never hand-written) and waits until the API server serves monitoring.coreos.com.
func (s *Server) InstallMonitoringCRDs(t testenv.TB) {
	t.Helper()
	dir, err := MonitoringCRDs()
	if err != nil {
		t.Fatalf("%v", err)
	}
	if err := s.CreateCRDs(dir, "monitoring.coreos.com"); err != nil {
		t.Fatalf("install prometheus-operator's CRDs: %v", err)
	}
}
