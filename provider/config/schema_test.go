package config

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// chartOwned are the settings the chart writes itself (from agent.port and tls) or that are
// not settings at all; every other field of Config must be reachable through the chart's
// cloudConfig values.
var chartOwned = []string{
	"apiVersion", "kind",
	"agent.port", "agent.caFile", "agent.certFile", "agent.keyFile",
	"agent.insecure", // the chart always sets TLS, with which the CCM refuses insecure
	"agent.enroll.enabled", "agent.enroll.namespace", "agent.enroll.serviceAccount",
	"failover.keySecret", // no longer used; read with a warning
}

// TestTheChartReachesEverySetting: the chart's values.schema.json accepts, under cloudConfig,
// every field of the cloud-config the chart does not write itself, and nothing the CCM does
// not read (a setting documented in docs/cloud-config.md but refused by the chart, or accepted
// by the chart and refused by the CCM, fails here).
func TestTheChartReachesEverySetting(t *testing.T) {
	b, err := os.ReadFile("../../charts/metalvip/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			CloudConfig schemaNode `json:"cloudConfig"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	inSchema := schema.Properties.CloudConfig.paths("")
	inConfig := configPaths(reflect.TypeFor[Config](), "")
	for _, p := range inConfig {
		if !slices.Contains(inSchema, p) && !slices.Contains(chartOwned, p) {
			t.Errorf("cloud-config %s cannot be set through the chart's values (add cloudConfig.%s to values.schema.json, or list it as the chart's own)", p, p)
		}
	}
	for _, p := range inSchema {
		if !slices.Contains(inConfig, p) {
			t.Errorf("the chart's values accept cloudConfig.%s, which the CCM does not read", p)
		}
		if slices.Contains(chartOwned, p) {
			t.Errorf("the chart's values accept cloudConfig.%s, which the chart writes itself", p)
		}
	}
}

type schemaNode struct {
	Type       string                `json:"type"`
	Properties map[string]schemaNode `json:"properties"`
	Items      *schemaNode           `json:"items"`
}

// paths lists the leaves under n, dotted ("drain.delay"); an array's item fields are under
// the array's name.
func (n schemaNode) paths(prefix string) []string {
	if n.Items != nil {
		return n.Items.paths(prefix)
	}
	if len(n.Properties) == 0 {
		return []string{strings.TrimSuffix(prefix, ".")}
	}
	var out []string
	for k, c := range n.Properties {
		out = append(out, c.paths(prefix+k+".")...)
	}
	return out
}

// configPaths lists the yaml leaves of t, dotted; Duration is a leaf.
func configPaths(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[Duration]() {
		return []string{strings.TrimSuffix(prefix, ".")}
	}
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		out = append(out, configPaths(f.Type, prefix+name+".")...)
	}
	return out
}
