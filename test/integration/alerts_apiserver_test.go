package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestTheAPIServerAcceptsTheAlertsAndDashboard applies the PrometheusRule and the dashboard's
// ConfigMap server-side to the real API server, the rule validated by prometheus-operator's
// CRD (generated from its Go API module), and reads them back.
func TestTheAPIServerAcceptsTheAlertsAndDashboard(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallMonitoringCRDs(t)
	docs := renderChart(t, "prometheusRule.enabled=true", "prometheusRule.labels.release=prometheus", "grafanaDashboard.enabled=true")
	rule, cm := renderedObject(docs, "PrometheusRule", "metalvip"), renderedObject(docs, "ConfigMap", "metalvip-dashboard")
	if rule == nil || cm == nil {
		t.Fatal("the PrometheusRule or the dashboard's ConfigMap not rendered")
	}
	applyDocs(t, srv, []*unstructured.Unstructured{rule, cm})
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	rules := dyn.Resource(schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}).Namespace("kube-system")
	t.Cleanup(func() {
		_ = rules.Delete(ctx, "metalvip", metav1.DeleteOptions{})
		_ = srv.Client.CoreV1().ConfigMaps("kube-system").Delete(ctx, "metalvip-dashboard", metav1.DeleteOptions{})
	})
	held, err := rules.Get(ctx, "metalvip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := alertNames(t, held), alertNames(t, rule); strings.Join(got, ",") != strings.Join(want, ",") || held.GetLabels()["release"] != "prometheus" {
		t.Errorf("the API server holds alerts %v labels %v; want %v", got, held.GetLabels(), want)
	}
	c, err := srv.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "metalvip-dashboard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(c.Data["metalvip.json"])) || c.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the API server holds the dashboard ConfigMap with labels %v and %d bytes of data", c.Labels, len(c.Data["metalvip.json"]))
	}
}
