package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestIPPoolValidation sends pools straight to the API server: the CRD's schema and CEL rules
// alone must accept the good ones and refuse the bad ones with a message that says what is wrong.
func TestIPPoolValidation(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(v1alpha1.IPPoolResource)

	for i, tc := range []struct {
		name string
		spec string
		want string // "" to accept, else a substring of the refusal
	}{
		{"an IPv4 CIDR is accepted", `addresses: [203.0.113.0/24]`, ""},
		{"IPv4 and IPv6 CIDRs and ranges in one pool are accepted",
			`addresses: [203.0.113.0/28, "203.0.113.100-203.0.113.120", "2001:db8:100::/120", "2001:db8:100::1:0-2001:db8:100::1:ff"]`, ""},
		{"a one-address range is accepted", `addresses: ["203.0.113.7-203.0.113.7"]`, ""},
		{"a range across a /24 boundary is accepted", `addresses: ["203.0.112.250-203.0.113.5"]`, ""},
		{"a BGP pool with BGP options is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {communities: ["64496:100"], localPref: 200}}}`, ""},
		{"a full pool is accepted", `
addresses: [203.0.113.0/24]
autoAssign: false
avoidBuggyIPs: true
priority: 10
serviceAllocation:
  namespaces: [web, shop]
  namespaceSelector: {matchLabels: {team: a}}
  serviceSelector: {matchExpressions: [{key: tier, operator: In, values: [edge]}]}
announce:
  mode: L2
  nodeSelector: {matchLabels: {edge: "true"}}
  l2: {interfaces: [eth0, bond0.100]}
`, ""},

		{"empty addresses are refused", `addresses: []`, "spec.addresses"},
		{"missing addresses are refused", `autoAssign: true`, "spec.addresses: Required value"},
		{"a malformed CIDR is refused", `addresses: [203.0.113.0/33]`, "must be a CIDR such as"},
		{"a word is refused", `addresses: [everything]`, "must be a CIDR such as"},
		{"a range with a bad end is refused", `addresses: ["203.0.113.1-203.0.113.300"]`, "must be a CIDR such as"},
		{"a range with spaces is refused", `addresses: ["203.0.113.1 - 203.0.113.3"]`, "without spaces"},
		{"a CIDR with host bits says what to write", `addresses: [203.0.113.7/24]`, "must not have bits set after its prefix length"},
		{"a reversed IPv4 range is refused", `addresses: ["203.0.113.20-203.0.113.10"]`, "the range is reversed: write the lower address first"},
		{"a reversed IPv4 range across octets is refused", `addresses: ["203.0.113.1-203.0.112.255"]`, "is reversed"},
		{"a reversed IPv6 range is refused", `addresses: ["2001:db8:100::1:0-2001:db8:100::ff"]`, "is reversed"},
		{"a range of two families is refused", `addresses: ["203.0.113.1-2001:db8::1"]`, "one family"},
		{"a duplicate address entry is refused", `addresses: [203.0.113.0/24, 203.0.113.0/24]`, "Duplicate value"},
		{"an unknown mode is refused", `{addresses: [203.0.113.0/24], announce: {mode: OSPF}}`, "Unsupported value"},
		{"BGP options on an L2 pool are refused",
			`{addresses: [203.0.113.0/24], announce: {mode: L2, bgp: {localPref: 100}}}`, "bgp options apply only to mode BGP"},
		{"L2 options on a BGP pool are refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, l2: {interfaces: [eth0]}}}`, "l2 options apply only to mode L2"},
		{"L2 options on a pool with the default mode are accepted",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: [eth0]}}}`, ""},
		{"a malformed community is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {communities: ["no-export"]}}}`, "communities"},
		{"a negative priority is refused", `{addresses: [203.0.113.0/24], priority: -1}`, "spec.priority"},
		{"an invalid namespace name is refused",
			`{addresses: [203.0.113.0/24], serviceAllocation: {namespaces: [Bad_NS]}}`, "serviceAllocation.namespaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatalf("test spec: %v", err)
			}
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(),
				"kind":       "IPPool",
				"metadata":   map[string]any{"name": fmt.Sprintf("validation-%d", i)},
				"spec":       spec,
			}}
			ctx := context.Background()
			_, err := pools.Create(ctx, obj, metav1.CreateOptions{})
			if err == nil {
				t.Cleanup(func() { _ = pools.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused a valid pool: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted an invalid pool; want a refusal containing %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("refusal %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestIPPoolDefaults(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": "defaults"},
		"spec":     map[string]any{"addresses": []any{"203.0.113.0/24"}},
	}}
	got, err := dyn.Resource(v1alpha1.IPPoolResource).Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(v1alpha1.IPPoolResource).Delete(context.Background(), "defaults", metav1.DeleteOptions{})
	})
	auto, _, _ := unstructured.NestedBool(got.Object, "spec", "autoAssign")
	mode, _, _ := unstructured.NestedString(got.Object, "spec", "announce", "mode")
	if !auto || mode != "L2" {
		t.Errorf("defaults: autoAssign %v mode %q; want true and L2", auto, mode)
	}
}

func TestDocumentedPoolExampleIsAccepted(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../../docs/examples/ippool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatal(err)
		}
		obj.SetName("example-" + obj.GetName())
		if _, err := dyn.Resource(v1alpha1.IPPoolResource).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Errorf("docs/examples/ippool.yaml: %s refused: %v", obj.GetName(), err)
			continue
		}
		_ = dyn.Resource(v1alpha1.IPPoolResource).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{})
	}
}

func TestBGPPeerValidation(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name, spec, want string
	}{
		{"a plain peer is accepted", `{address: 198.51.100.1, peerASN: 64496, myASN: 64497}`, ""},
		{"a full peer is accepted", `{address: "2001:db8:1::1", port: 1179, peerASN: 64496, myASN: 64497, holdTimeSeconds: 9, keepaliveSeconds: 3,
			nodeSelector: {matchLabels: {rack: a}}, bfd: {enabled: true, minRxMilliseconds: 100, minTxMilliseconds: 100, multiplier: 3},
			passwordSecretRef: {namespace: kube-system, name: bgp, key: password}, gracefulRestart: true}`, ""},
		{"a bad address is refused", `{address: 198.51.100.300, peerASN: 64496, myASN: 64497}`, "must be an IP address"},
		{"a missing ASN is refused", `{address: 198.51.100.1, myASN: 64497}`, "peerASN: Required value"},
		{"an ASN out of range is refused", `{address: 198.51.100.1, peerASN: 4294967296, myASN: 64497}`, "peerASN"},
		{"a hold time of 2 is refused", `{address: 198.51.100.1, peerASN: 1, myASN: 2, holdTimeSeconds: 2}`, "must be 0 or at least 3"},
		{"a keepalive over a third of the hold time is refused", `{address: 198.51.100.1, peerASN: 1, myASN: 2, holdTimeSeconds: 9, keepaliveSeconds: 4}`, "at most a third"},
		{"BFD with multihop is refused", `{address: 198.51.100.1, peerASN: 1, myASN: 2, ebgpMultihop: 3, bfd: {enabled: true}}`, "single-hop"},
		{"a BFD interval under 10ms is refused", `{address: 198.51.100.1, peerASN: 1, myASN: 2, bfd: {enabled: true, minRxMilliseconds: 1}}`, "minRxMilliseconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatal(err)
			}
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": "BGPPeer",
				"metadata": map[string]any{"name": fmt.Sprintf("peer-%d", i)}, "spec": spec,
			}}
			_, err := dyn.Resource(v1alpha1.BGPPeerResource).Create(context.Background(), obj, metav1.CreateOptions{})
			if err == nil {
				t.Cleanup(func() {
					_ = dyn.Resource(v1alpha1.BGPPeerResource).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{})
				})
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused a valid peer: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted an invalid peer; want %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("refusal %q does not contain %q", err, tc.want)
			}
		})
	}
}
