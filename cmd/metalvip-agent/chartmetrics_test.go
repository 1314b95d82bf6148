package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as the CCM's main imports them
	_ "k8s.io/component-base/metrics/prometheus/version"

	"github.com/metalvip/metalvip/loadbalancer/agentclient"
	"github.com/metalvip/metalvip/loadbalancer/services"
)

// The chart's alerts and dashboard, whose metric names this test checks. It lives here because
// the agent's registry is built in this package (newRegistry, newObserver, newGauges); the
// CCM's is component-base's legacyregistry, filled by the packages it imports.
const (
	chartRules     = "../../charts/metalvip/templates/prometheusrule.yaml"
	chartDashboard = "../../charts/metalvip/files/dashboard.json"
)

// registeredIn reports whether reg holds a metric named name: a probe of that name is refused
// when one is registered (with other labels or help, or the same), accepted (and removed
// again) otherwise. Vectors with no series yet count: they are registered, if not gathered.
func registeredIn(reg prometheus.Registerer, name string) bool {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "probe of the chart metrics test"})
	if err := reg.Register(probe); err != nil {
		return true
	}
	reg.Unregister(probe)
	return false
}

var (
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|"[^"]*"`)
	promqlGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlName     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	labelValues    = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)[^)]*\)`)
	promqlKeywords = []string{"and", "or", "unless", "bool", "offset", "inf", "nan"}
)

// metricNames are the metric names a PromQL expression reads: its identifiers outside label
// matchers, ranges, strings and grouping clauses that call nothing and are no keyword.
func metricNames(expr string) []string {
	var names []string
	for _, m := range labelValues.FindAllStringSubmatch(expr, -1) {
		names = append(names, m[1])
	}
	expr = labelValues.ReplaceAllString(expr, "")
	expr = promqlGrouping.ReplaceAllString(promqlMatchers.ReplaceAllString(expr, " "), " ")
	for _, loc := range promqlName.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if rest := strings.TrimLeft(expr[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or an aggregation
		}
		if loc[0] > 0 && (expr[loc[0]-1] == '$' || expr[loc[0]-1] == '.' || expr[loc[0]-1] >= '0' && expr[loc[0]-1] <= '9') {
			continue // a Grafana variable, or part of a number (1e3)
		}
		if slices.Contains(promqlKeywords, strings.ToLower(name)) {
			continue
		}
		names = append(names, name)
	}
	return names
}

func TestMetricNamesReadsOnlyMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (pod, state) (metalvip_agent_vips{state!="standby"})`, []string{"metalvip_agent_vips"}},
		{`100 * a / (a + b) >= 80 and on (pool) c == 1`, []string{"a", "a", "b", "c"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))`, []string{"x_bucket"}},
		{`count(m == 0) or vector(0)`, []string{"m"}},
		{`label_values(metalvip_pool_usable, pool)`, []string{"metalvip_pool_usable"}},
		{`sum without (state) (y{state!="Established"}) > 1e3`, []string{"y"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestTheChartsAlertsAndDashboardNameOnlyMetricsThatExist: every metric the Grafana dashboard
// queries, and every metalvip_ name the PrometheusRule reads or mentions, is registered by the
// agent (its registry built here as main builds it) or by the CCM (the packages that fill its
// registry, constructed): a renamed metric fails this test instead of leaving a panel empty or
// an alert silent.
func TestTheChartsAlertsAndDashboardNameOnlyMetricsThatExist(t *testing.T) {
	agent := newRegistry()
	newObserver(agent)
	agent.MustRegister(newGauges(nil)) // Describe only: no agent needed
	agentclient.New(agentclient.Config{}, 1, agentclient.Hooks{})
	services.New(services.Config{})
	clientmetrics.EnsureRegistered() // what the CCM's first REST client does
	ccm := legacyregistry.Registerer()

	exists := func(name string) bool {
		if name == "up" { // Prometheus's own, per target
			return true
		}
		for _, n := range []string{name, strings.TrimSuffix(name, "_bucket"), strings.TrimSuffix(name, "_sum"), strings.TrimSuffix(name, "_count")} {
			if registeredIn(agent, n) || registeredIn(ccm, n) {
				return true
			}
		}
		return false
	}
	if exists("metalvip_no_such_metric") || exists("metalvip_agent_vip") {
		t.Fatal("the registry probe finds metrics that do not exist")
	}

	raw, err := os.ReadFile(chartDashboard)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", chartDashboard, err)
	}
	read := map[string][]string{} // metric -> where
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricNames(tg.Expr) {
				read[n] = append(read[n], "dashboard panel "+p.Title)
			}
		}
	}
	for _, v := range dash.Templating.List {
		q, _ := json.Marshal(v.Query)
		for _, n := range metricNames(string(q)) {
			if strings.Contains(string(q), "label_values") {
				read[n] = append(read[n], "dashboard variable "+v.Name)
			}
		}
	}
	rules, err := os.ReadFile(chartRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range regexp.MustCompile(`metalvip_[a-z0-9_]+`).FindAllString(string(rules), -1) {
		read[n] = append(read[n], "PrometheusRule")
	}
	for _, must := range []string{"metalvip_pool_addresses_allocated", "metalvip_agent_bgp_sessions", "metalvip_agent_reachable", "rest_client_requests_total", "metalvip_agent_failovers_total"} {
		if read[must] == nil {
			t.Errorf("the dashboard and rules read no %s: the name extraction is broken", must)
		}
	}
	for n, where := range read {
		if !exists(n) {
			t.Errorf("%s, read by %s, is registered by neither the agent nor the CCM", n, strings.Join(slices.Compact(where), ", "))
		}
	}
}
