package integration

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// monitoringEndpoint is what the tests read of a ServiceMonitor's or PodMonitor's endpoint
// (prometheus-operator's Endpoint and PodMetricsEndpoint share these fields).
type monitoringEndpoint struct {
	Port            string         `json:"port"`
	Scheme          string         `json:"scheme"`
	BearerTokenFile string         `json:"bearerTokenFile"`
	TLSConfig       map[string]any `json:"tlsConfig"`
	Authorization   *struct {
		Type        string `json:"type"`
		Credentials struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		} `json:"credentials"`
	} `json:"authorization"`
	Relabelings []struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
	} `json:"relabelings"`
}

func findDoc(docs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, d := range docs {
		if d.GetKind() == kind && d.GetName() == name {
			return d
		}
	}
	return nil
}

// endpointOf is the one endpoint of a monitor's spec.<field>.
func endpointOf(t *testing.T, docs []*unstructured.Unstructured, kind, name, field string) monitoringEndpoint {
	t.Helper()
	d := findDoc(docs, kind, name)
	if d == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	eps, _, _ := unstructured.NestedSlice(d.Object, "spec", field)
	if len(eps) != 1 {
		t.Fatalf("%s %s has %d %s, want 1", kind, name, len(eps), field)
	}
	var ep monitoringEndpoint
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(eps[0].(map[string]any), &ep); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return ep
}

// TestTheMonitorsScrapeWithTheMetricsReadersToken: with the monitors on, both scrape over
// HTTPS with the token of metalvip-metrics-reader from a service-account-token Secret (the
// current authorization field, no bearerTokenFile: Prometheus never sends its own token, and
// arbitraryFSAccessThroughSMs.deny does not refuse them); the PodMonitor labels each series
// with its node; Prometheus' own ServiceAccount, when named, is still granted /metrics. Off,
// no Secret holds a token.
func TestTheMonitorsScrapeWithTheMetricsReadersToken(t *testing.T) {
	off := renderChart(t)
	if d := findDoc(off, "Secret", "metalvip-metrics-reader-token"); d != nil {
		t.Error("the metrics reader's token Secret is rendered with no monitor enabled")
	}
	for _, want := range []struct{ kind, name string }{
		{"ServiceAccount", "metalvip-metrics-reader"},
		{"ClusterRole", "metalvip:metrics-reader"},
		{"ClusterRoleBinding", "metalvip:metrics-reader"},
		{"ClusterRoleBinding", "metalvip:agent:auth-delegator"},
	} {
		if findDoc(off, want.kind, want.name) == nil {
			t.Errorf("no %s %s by default", want.kind, want.name)
		}
	}
	on := renderChart(t, "ccm.serviceMonitor.enabled=true", "agent.podMonitor.enabled=true",
		"ccm.serviceMonitor.prometheusServiceAccount.name=prometheus-k8s", "ccm.serviceMonitor.prometheusServiceAccount.namespace=monitoring")
	secret := findDoc(on, "Secret", "metalvip-metrics-reader-token")
	if secret == nil {
		t.Fatal("no Secret for the metrics reader's token with the monitors on")
	}
	if typ, _, _ := unstructured.NestedString(secret.Object, "type"); typ != "kubernetes.io/service-account-token" ||
		secret.GetAnnotations()["kubernetes.io/service-account.name"] != "metalvip-metrics-reader" {
		t.Errorf("the token Secret is %s for %q, want a kubernetes.io/service-account-token of metalvip-metrics-reader", typ, secret.GetAnnotations())
	}
	for _, m := range []struct{ kind, name, field string }{
		{"ServiceMonitor", "metalvip-cloud-controller-manager", "endpoints"},
		{"PodMonitor", "metalvip-agent", "podMetricsEndpoints"},
	} {
		ep := endpointOf(t, on, m.kind, m.name, m.field)
		if ep.Scheme != "https" || ep.BearerTokenFile != "" || ep.Authorization == nil || ep.Authorization.Type != "Bearer" ||
			ep.Authorization.Credentials.Name != secret.GetName() || ep.Authorization.Credentials.Key != "token" || ep.TLSConfig == nil {
			t.Errorf("%s: scheme %q bearerTokenFile %q authorization %+v tlsConfig %v; want https with the Bearer token of Secret %s (key token) and a tlsConfig",
				m.kind, ep.Scheme, ep.BearerTokenFile, ep.Authorization, ep.TLSConfig, secret.GetName())
		}
	}
	pm := endpointOf(t, on, "PodMonitor", "metalvip-agent", "podMetricsEndpoints")
	if len(pm.Relabelings) != 1 || pm.Relabelings[0].TargetLabel != "node" || strings.Join(pm.Relabelings[0].SourceLabels, ",") != "__meta_kubernetes_pod_node_name" {
		t.Errorf("PodMonitor relabelings %+v, want the pod's node name as label node", pm.Relabelings)
	}
	b := findDoc(on, "ClusterRoleBinding", "metalvip:metrics-reader")
	subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
	var names []string
	for _, s := range subjects {
		m := s.(map[string]any)
		names = append(names, m["namespace"].(string)+"/"+m["name"].(string))
	}
	if strings.Join(names, " ") != "kube-system/metalvip-metrics-reader monitoring/prometheus-k8s" {
		t.Errorf("metalvip:metrics-reader is bound to %v, want the reader and the named Prometheus", names)
	}
}
