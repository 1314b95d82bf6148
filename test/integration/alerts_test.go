package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// rulesTestFile is promtool's unit test of the chart's alerts; rules.yaml beside it is what
// renderRules extracts.
const rulesTestFile = "testdata/alerts/rules_test.yaml"

// renderedObject is the one object of kind and name in docs; nil when there is none.
func renderedObject(docs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, d := range docs {
		if d.GetKind() == kind && d.GetName() == name {
			return d
		}
	}
	return nil
}

// renderRules renders the chart with the PrometheusRule on (and the --set values) and writes
// its rule groups, a Prometheus rule file, to dir/rules.yaml; it returns the PrometheusRule.
func renderRules(t *testing.T, dir string, set ...string) *unstructured.Unstructured {
	t.Helper()
	rule := renderedObject(renderChart(t, append([]string{"prometheusRule.enabled=true"}, set...)...), "PrometheusRule", "metalvip")
	if rule == nil {
		t.Fatal("no PrometheusRule metalvip with prometheusRule.enabled=true")
	}
	spec, err := yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return rule
}

func promtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool(t, "promtool"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// alertNames are the alerts of a PrometheusRule, group by group.
func alertNames(t *testing.T, rule *unstructured.Unstructured) []string {
	t.Helper()
	groups, _, err := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			if a, ok := r.(map[string]any)["alert"].(string); ok {
				names = append(names, a)
			}
		}
	}
	return names
}

// TestTheChartsAlertsFireWhenTheyShould runs the PrometheusRule the chart renders through
// Prometheus's own rule engine (promtool, pinned in hack/tools/promtool): the rules are valid,
// a pool at 80 % fires the warning, an exhausted pool the critical alert, a BGP session down,
// an unreachable agent, a takeover storm, refused enrollments, states and items fire theirs
// (labels and annotations compared whole), and a healthy cluster fires none of them.
func TestTheChartsAlertsFireWhenTheyShould(t *testing.T) {
	dir := t.TempDir()
	rule := renderRules(t, dir)
	test, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), test, 0o644); err != nil {
		t.Fatal(err)
	}
	names := alertNames(t, rule)
	t.Run("promtool check rules finds every alert valid", func(t *testing.T) {
		out, err := promtool(t, "check", "rules", filepath.Join(dir, "rules.yaml"))
		if err != nil || !strings.Contains(out, "SUCCESS") {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
	})
	t.Run("every alert has a case that fires it and is quiet in the healthy case", func(t *testing.T) {
		var tests struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string           `json:"alertname"`
					ExpAlerts []map[string]any `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		if err := yaml.Unmarshal(test, &tests); err != nil {
			t.Fatal(err)
		}
		fires, quiet := map[string]bool{}, map[string]bool{}
		for i, tc := range tests.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else if i == len(tests.Tests)-1 {
					quiet[a.Alertname] = true
				}
			}
		}
		for _, n := range names {
			if !fires[n] {
				t.Errorf("%s: no case in %s that fires it", n, rulesTestFile)
			}
			if !quiet[n] {
				t.Errorf("%s: not checked quiet in the healthy case (the last) of %s", n, rulesTestFile)
			}
		}
	})
	t.Run("promtool test rules passes", func(t *testing.T) {
		out, err := promtool(t, "test", "rules", filepath.Join(dir, "rules_test.yaml"))
		if err != nil || !strings.Contains(out, "SUCCESS") {
			t.Fatalf("promtool test rules: %v\n%s", err, out)
		}
	})
}

// TestTheChartsAlertValuesReachTheRules: the thresholds, labels and runbook address in values
// are the rule's; without prometheusRule.enabled or grafanaDashboard.enabled neither object is
// rendered.
func TestTheChartsAlertValuesReachTheRules(t *testing.T) {
	rule := renderRules(t, t.TempDir(), "prometheusRule.poolUsageWarningPercent=90", "prometheusRule.takeoverStormWindows=4",
		"prometheusRule.labels.release=kube-prometheus-stack", "prometheusRule.runbookURL=https://docs.example/metalvip/operations")
	if rule.GetLabels()["release"] != "kube-prometheus-stack" || rule.GetNamespace() != "kube-system" {
		t.Errorf("PrometheusRule metadata %v", rule.Object["metadata"])
	}
	byName := map[string]map[string]any{}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			byName[r.(map[string]any)["alert"].(string)] = r.(map[string]any)
		}
	}
	if e := byName["MetalvipPoolUsageHigh"]["expr"]; !strings.Contains(e.(string), ">= 90") {
		t.Errorf("MetalvipPoolUsageHigh expr %q, want the threshold 90", e)
	}
	if f := byName["MetalvipTakeoverStorm"]["for"]; f != "20m" {
		t.Errorf("MetalvipTakeoverStorm for %v, want 20m (4 windows of 5 minutes)", f)
	}
	for name, r := range byName {
		ann, _ := r["annotations"].(map[string]any)
		if url, _ := ann["runbook_url"].(string); url != "https://docs.example/metalvip/operations#"+strings.ToLower(name) {
			t.Errorf("%s runbook_url %q", name, url)
		}
		if ann["summary"] == nil || ann["description"] == nil {
			t.Errorf("%s annotations %v: want summary and description", name, ann)
		}
		if sev, _, _ := unstructured.NestedString(r, "labels", "severity"); sev != "warning" && sev != "critical" {
			t.Errorf("%s severity %q", name, sev)
		}
	}
	off := renderChart(t)
	if renderedObject(off, "PrometheusRule", "metalvip") != nil || renderedObject(off, "ConfigMap", "metalvip-dashboard") != nil {
		t.Error("a PrometheusRule or the dashboard rendered with the defaults")
	}
}

// TestTheChartShipsTheDashboardForGrafanasSidecar: the ConfigMap carries files/dashboard.json
// unchanged, with the sidecar's label, in the namespace asked for.
func TestTheChartShipsTheDashboardForGrafanasSidecar(t *testing.T) {
	cm := renderedObject(renderChart(t, "grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring",
		"grafanaDashboard.annotations.grafana_folder=Network"), "ConfigMap", "metalvip-dashboard")
	if cm == nil {
		t.Fatal("no ConfigMap metalvip-dashboard with grafanaDashboard.enabled=true")
	}
	if cm.GetNamespace() != "monitoring" || cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "Network" {
		t.Errorf("ConfigMap metadata %v", cm.Object["metadata"])
	}
	got, _, _ := unstructured.NestedString(cm.Object, "data", "metalvip.json")
	want, err := os.ReadFile(filepath.Join(chartDir, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Error("the ConfigMap's metalvip.json is not files/dashboard.json")
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []any  `json:"panels"`
	}
	if err := json.Unmarshal([]byte(got), &dash); err != nil || dash.UID != "metalvip" || len(dash.Panels) == 0 {
		t.Errorf("dashboard: %v, uid %q, %d panels", err, dash.UID, len(dash.Panels))
	}
}

// TestTheChartRefusesBadAlertValuesByName: a mistake in the alerts' or dashboard's values
// fails the render naming the value.
func TestTheChartRefusesBadAlertValuesByName(t *testing.T) {
	for _, tc := range []struct{ name, set, want string }{
		{"a misspelt key is refused", "prometheusRule.enable=true", "additional properties 'enable' not allowed"},
		{"a usage threshold of 0 % is refused", "prometheusRule.poolUsageWarningPercent=0", "/prometheusRule/poolUsageWarningPercent"},
		{"a usage threshold over 100 % is refused", "prometheusRule.poolUsageWarningPercent=101", "/prometheusRule/poolUsageWarningPercent"},
		{"a fractional usage threshold is refused", "prometheusRule.poolUsageWarningPercent=80.5", "/prometheusRule/poolUsageWarningPercent"},
		{"no storm windows are refused", "prometheusRule.takeoverStormWindows=0", "/prometheusRule/takeoverStormWindows"},
		{"a runbook address with an anchor is refused", "prometheusRule.runbookURL=https://docs.example/ops#alerts", "/prometheusRule/runbookURL"},
		{"a dashboard namespace that is no name is refused", "grafanaDashboard.namespace=Monitoring_NS", "/grafanaDashboard/namespace"},
		{"a label value that is not a string is refused", "grafanaDashboard.labels.grafana_dashboard=1", "/grafanaDashboard/labels/grafana_dashboard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, "template", "metalvip", chartDir, "--namespace", "kube-system", "--set", tc.set)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("helm template --set %s: %v, want an error naming %q:\n%s", tc.set, err, tc.want, out)
			}
		})
	}
}

// TestTheChartLintsCleanWithAlertsAndDashboard: helm lint --strict with both on and every
// value of theirs set.
func TestTheChartLintsCleanWithAlertsAndDashboard(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
prometheusRule: {enabled: true, labels: {release: prometheus}, poolUsageWarningPercent: 75, takeoverStormWindows: 6, runbookURL: "https://docs.example/ops"}
grafanaDashboard: {enabled: true, labels: {grafana_dashboard: "1"}, annotations: {grafana_folder: metalvip}, namespace: monitoring}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "lint", "--strict", chartDir, "--values", values)
	if err != nil || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}
