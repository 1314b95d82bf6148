package config

import (
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestParseAcceptsAFullFile(t *testing.T) {
	c, err := Parse([]byte(`
apiVersion: metalvip.io/v1alpha1
kind: CloudConfig
agent:
  port: 7000
  caFile: /etc/metalvip/ca.crt
  certFile: /etc/metalvip/tls.crt
  keyFile: /etc/metalvip/tls.key
  timeout: 250ms
topology:
  zoneLabel: example.com/rack
  subnets:
  - cidr: 198.51.100.0/26
    zone: rack-a
    region: site-1
  - cidr: 2001:db8::/64
    zone: rack-b
instanceTypeLabel: example.com/hw
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if c.Agent.Port != 7000 || c.Agent.Timeout.Duration != 250*time.Millisecond {
		t.Errorf("agent = %+v, want port 7000 and timeout 250ms", c.Agent)
	}
	if got := c.Topology.Subnets[1].Prefix(); got != netip.MustParsePrefix("2001:db8::/64") {
		t.Errorf("subnets[1].Prefix() = %s", got)
	}
	if c.InstanceTypeLabel != "example.com/hw" || c.Topology.ZoneLabel != "example.com/rack" {
		t.Errorf("labels not read: %+v", c)
	}
}

func TestEmptyFileGivesDefaults(t *testing.T) {
	for _, in := range []string{"", "\n# only a comment\n", "{}"} {
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if c.Agent.Port != DefaultAgentPort || c.Agent.Timeout.Duration != DefaultAgentTimeout {
			t.Errorf("Parse(%q).Agent = %+v, want defaults", in, c.Agent)
		}
	}
	if c, err := Read(nil); err != nil || c.Agent.Port != DefaultAgentPort {
		t.Errorf("Read(nil) = %+v, %v; want defaults", c, err)
	}
}

func TestParseRefusesBadInputNamingLineAndField(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string // substrings of the error
	}{
		{"a misspelt field is named with its line and the closest real name",
			"topology:\n  zoneLable: example.com/rack\n",
			[]string{"line 2", "topology.zoneLable", `unknown field "zoneLable"`, `did you mean "zoneLabel"`}},
		{"an unknown top-level field lists the real ones",
			"pools:\n- 203.0.113.0/24\n",
			[]string{"line 1", `unknown field "pools"`, "agent", "topology"}},
		{"a field inside a list item is checked too",
			"topology:\n  subnets:\n  - cidr: 198.51.100.0/26\n    zon: a\n",
			[]string{"line 4", "topology.subnets[0].zon", `did you mean "zone"`}},
		{"a port out of range says what to write",
			"agent:\n  port: 70000\n",
			[]string{"line 2", "agent.port", "1 to 65535"}},
		{"a port of the wrong type names the line",
			"agent:\n  port: seven\n",
			[]string{"line 2", "seven"}},
		{"a duration without a unit is refused",
			"agent:\n  timeout: 5\n",
			[]string{"line 2", "not a duration", `"5s"`}},
		{"a malformed CIDR shows an example",
			"topology:\n  subnets:\n  - cidr: 198.51.100.0/33\n    zone: a\n",
			[]string{"line 3", "topology.subnets[0].cidr", "not a CIDR"}},
		{"a CIDR with host bits set gives the masked form",
			"topology:\n  subnets:\n  - cidr: 198.51.100.7/24\n    zone: a\n",
			[]string{"line 3", `write "198.51.100.0/24"`}},
		{"a rule with neither zone nor region is refused",
			"topology:\n  subnets:\n  - cidr: 198.51.100.0/24\n",
			[]string{"line 3", "topology.subnets[0]", "zone, a region"}},
		{"a duplicate subnet is refused",
			"topology:\n  subnets:\n  - {cidr: 198.51.100.0/24, zone: a}\n  - {cidr: 198.51.100.0/24, zone: b}\n",
			[]string{"line 4", "topology.subnets[1].cidr", "already mapped"}},
		{"an invalid zone is refused",
			"topology:\n  subnets:\n  - cidr: 198.51.100.0/24\n    zone: rack a\n",
			[]string{"line 4", "topology.subnets[0].zone", "label value"}},
		{"an invalid label key is refused",
			"instanceTypeLabel: \"not a key\"\n",
			[]string{"line 1", "instanceTypeLabel"}},
		{"half the TLS files is refused",
			"agent:\n  caFile: /ca.crt\n",
			[]string{"line 2", "agent", "give all three"}},
		{"insecure with TLS files is refused",
			"agent:\n  insecure: true\n  caFile: /ca.crt\n",
			[]string{"line 2", "agent.insecure"}},
		{"a foreign kind is refused",
			"kind: MetalLBConfig\n",
			[]string{"line 1", "kind", `"CloudConfig"`}},
		{"a list where a mapping belongs is refused",
			"agent:\n- port: 1\n",
			[]string{"line 2", "agent", "expected a mapping"}},
		{"two documents are refused",
			"agent: {}\n---\nagent: {}\n",
			[]string{"more than one YAML document"}},
		{"a duplicate key is refused",
			"agent:\n  port: 1\n  port: 2\n",
			[]string{"line 3", "already defined"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.in)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("agent:\n  port: 7000\ntopology:\n  subnets:\n  - {cidr: 198.51.100.0/24, zone: a}\n"))
	f.Add([]byte("topology:\n  zoneLable: x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err == nil && (c.Agent.Port < 1 || c.Agent.Port > 65535) {
			t.Errorf("accepted port %d", c.Agent.Port)
		}
	})
}

func TestDocumentedExampleParses(t *testing.T) {
	data, err := os.ReadFile("../../docs/examples/cloud-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(data); err != nil {
		t.Errorf("docs/examples/cloud-config.yaml: %v", err)
	}
	// Complete: it sets every field but those it cannot set beside enroll, and the unused one.
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	set := leaves(m, "")
	for _, p := range configPaths(reflect.TypeFor[Config](), "") {
		if !slices.Contains(set, p) && !slices.Contains([]string{"agent.caFile", "agent.certFile", "agent.keyFile", "agent.insecure", "failover.keySecret"}, p) {
			t.Errorf("docs/examples/cloud-config.yaml, called complete, does not set %s", p)
		}
	}
}

// leaves lists the dotted paths of a decoded YAML document's values; a list's are those of its
// items.
func leaves(v any, prefix string) []string {
	switch x := v.(type) {
	case map[string]any:
		var out []string
		for k, c := range x {
			out = append(out, leaves(c, prefix+k+".")...)
		}
		return out
	case []any:
		var out []string
		for _, c := range x {
			out = append(out, leaves(c, prefix)...)
		}
		return out
	}
	return []string{strings.TrimSuffix(prefix, ".")}
}
