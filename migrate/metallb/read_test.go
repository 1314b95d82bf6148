package metallb

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReadingMetalLBObjects(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       string
		general  string // a general note that must be there
		skipped  string // a skip line that must be there
		objects  int
		errorHas string
	}{
		{
			name:    "a field this converter does not know is reported, not dropped unseen",
			in:      pool("gold", `{addresses: [203.0.113.0/24], newKnob: 1, serviceAllocation: {priority: 1, future: x}}`),
			general: "CHECK: IPAddressPool gold in metallb-system has fields this converter does not know (a newer MetalLB?), not converted: spec.newKnob, spec.serviceAllocation.future",
			objects: 1,
		},
		{
			name:    "an object of another namespace is skipped: MetalLB reads only its own",
			in:      strings.Replace(pool("gold", `{addresses: [203.0.113.0/24]}`), "metallb-system", "elsewhere", 1),
			skipped: "IPAddressPool elsewhere/gold: not in namespace metallb-system",
		},
		{
			name:    "MetalLB's status objects and other kinds are skipped and counted",
			in:      doc("ServiceL2Status", "v1beta1", "s", `{}`) + "{apiVersion: apps/v1, kind: Deployment, metadata: {name: controller}}\n---\n",
			skipped: "1 Deployment objects: not MetalLB's configuration",
		},
		{
			name:    "a List's items are read",
			in:      `{apiVersion: v1, kind: List, items: [{apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: gold, namespace: metallb-system}, spec: {addresses: [203.0.113.0/24]}}]}`,
			objects: 1,
		},
		{
			name:    "an advertisement naming a pool that does not exist is reported",
			in:      pool("gold", `{addresses: [203.0.113.0/24]}`) + doc("L2Advertisement", "v1beta1", "l2", `{ipAddressPools: [silver]}`),
			general: `CHECK: L2Advertisement metallb-system/l2 names IPAddressPool "silver", which does not exist`,
			objects: 1,
		},
		{
			name:     "MetalLB's legacy ConfigMap is refused with the way to convert it, not skipped",
			in:       "{apiVersion: v1, kind: ConfigMap, metadata: {name: config, namespace: metallb-system}, data: {config: \"address-pools:\\n- name: default\\n  protocol: layer2\\n  addresses: [203.0.113.0/24]\\n\"}}\n---\n",
			errorHas: "ConfigMap metallb-system/config is MetalLB's configuration before v0.13 (data.config), which this converter does not read: convert it to MetalLB's custom resources first with MetalLB's own configmaptocrs",
		},
		{
			// Found in the corpus (test/migration/testdata/corpus/37-*): it was skipped as
			// not MetalLB's, and nothing converted, with exit 0.
			name:     "a legacy ConfigMap holding only communities or BFD profiles is refused too",
			in:       "{apiVersion: v1, kind: ConfigMap, metadata: {name: config, namespace: metallb-system}, data: {config: \"bgp-communities:\n  no-export: 65535:65281\n\"}}\n---\n",
			errorHas: "MetalLB's configuration before v0.13 (data.config)",
		},
		{
			name:    "another ConfigMap is skipped and counted",
			in:      "{apiVersion: v1, kind: ConfigMap, metadata: {name: other, namespace: metallb-system}, data: {x: y}}\n---\n",
			skipped: "1 ConfigMap objects: not MetalLB's configuration",
		},
		{
			name: "a MetalLB started with --lb-class served that class alone: said",
			in: "{apiVersion: apps/v1, kind: Deployment, metadata: {name: controller, namespace: metallb-system}, spec: {template: {spec: {containers: [{name: controller, args: [--port=7472, --lb-class=metallb.io/lb]}]}}}}\n---\n" +
				pool("gold", `{addresses: [203.0.113.0/24]}`),
			general: `CHECK: MetalLB served only Services of loadBalancerClass "metallb.io/lb" (its --lb-class): give metalvip's CCM the same class (cloud-config services.loadBalancerClass: metallb.io/lb), or those Services get no address from metalvip`,
			skipped: "1 Deployment objects: not MetalLB's configuration",
			objects: 1,
		},
		{
			name:    "L2 pools MetalLB answered on every interface are named once, flagged",
			in:      pool("gold", `{addresses: [203.0.113.0/28]}`) + pool("silver", `{addresses: [203.0.113.16/28]}`) + doc("L2Advertisement", "v1beta1", "l2", `{}`),
			general: "CHECK: MetalLB answered ARP and NDP for gold, silver on every interface of a node; metalvip answers only on each agent's --interfaces, by default the interface of the node's default route. If clients reach the nodes through another interface, list it in the pool's spec.announce.l2.interfaces or in the agents' --interfaces",
			objects: 2,
		},
		{
			name:     "an object that is not MetalLB's shape is an error naming it",
			in:       pool("gold", `{addresses: "203.0.113.0/24"}`),
			errorHas: "IPAddressPool metallb-system/gold does not decode as MetalLB's IPAddressPool",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "in.yaml")
			if err := os.WriteFile(path, []byte(tc.in), 0o600); err != nil {
				t.Fatal(err)
			}
			in := Config{Namespace: "metallb-system"}
			skipped, err := in.ReadFiles([]string{dir}, nil)
			if tc.errorHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errorHas) {
					t.Fatalf("err = %v, want one containing %q", err, tc.errorHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.skipped != "" && !slices.ContainsFunc(skipped, func(s string) bool { return strings.HasPrefix(s, tc.skipped) }) {
				t.Errorf("skipped %q, want a line starting %q", skipped, tc.skipped)
			}
			c := Convert(in, "metalvip-bgp-secrets")
			if len(c.Objects) != tc.objects {
				t.Errorf("%d objects, want %d", len(c.Objects), tc.objects)
			}
			if tc.general != "" && !slices.Contains(c.General, tc.general) {
				t.Errorf("general notes %q, want %q", c.General, tc.general)
			}
		})
	}
}
