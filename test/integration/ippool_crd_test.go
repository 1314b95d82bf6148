package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"pgregory.net/rapid"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// crdCase is an object spec sent straight to the API server, and what must come back.
type crdCase struct {
	name string
	spec string // YAML
	want string // "" to accept, else a substring of the refusal
}

// crdObject is an object of kind (IPPool or BGPPeer) named name with spec, and the resource
// it belongs to.
func crdObject(kind, name string, spec map[string]any) (schema.GroupVersionResource, *unstructured.Unstructured) {
	res := v1alpha1.IPPoolResource
	if kind == "BGPPeer" {
		res = v1alpha1.BGPPeerResource
	}
	return res, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// checkCRDCases creates each case's object of kind (named prefix-index), a subtest each: the
// API server must accept or refuse it as the case says, and what it accepts must pass
// accepted.
func checkCRDCases(t *testing.T, dyn dynamic.Interface, kind, prefix string, cases []crdCase, accepted func(t *testing.T, got *unstructured.Unstructured)) {
	t.Helper()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := createSpec(t, dyn, kind, fmt.Sprintf("%s-%d", prefix, i), tc.spec)
			checkRefusal(t, tc, err)
			if err == nil {
				accepted(t, got)
			}
		})
	}
}

// createSpec creates an object of kind with the YAML spec, and deletes it when the test ends.
// It returns the object the API server stored, or its refusal.
func createSpec(t *testing.T, dyn dynamic.Interface, kind, name, spec string) (*unstructured.Unstructured, error) {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(spec), &m); err != nil {
		t.Fatalf("test spec: %v", err)
	}
	res, obj := crdObject(kind, name, m)
	got, err := dyn.Resource(res).Create(context.Background(), obj, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() { _ = dyn.Resource(res).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	return got, err
}

// checkRefusal compares a create's outcome with the case.
func checkRefusal(t *testing.T, tc crdCase, err error) {
	t.Helper()
	switch {
	case tc.want == "" && err != nil:
		t.Errorf("refused a valid object: %v", err)
	case tc.want != "" && err == nil:
		t.Errorf("accepted an invalid object; want a refusal containing %q", tc.want)
	case tc.want != "" && !strings.Contains(err.Error(), tc.want):
		t.Errorf("refusal %q does not contain %q", err, tc.want)
	}
}

// TestIPPoolCRDValidation sends pools straight to the API server: the CRD's schema and CEL rules
// alone must accept the good ones and refuse the bad ones with a message that says what is
// wrong. What it accepts, the allocator and the agents accept too: every accepted pool is
// converted here as they convert it.
func TestIPPoolCRDValidation(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
	cases := []crdCase{
		{"an IPv4 CIDR is accepted", `addresses: [203.0.113.0/24]`, ""},
		{"IPv4 and IPv6 CIDRs and ranges in one pool are accepted",
			`addresses: [203.0.113.0/28, "203.0.113.100-203.0.113.120", "2001:db8:100::/120", "2001:db8:100::1:0-2001:db8:100::1:ff"]`, ""},
		{"a one-address range is accepted", `addresses: ["203.0.113.7-203.0.113.7"]`, ""},
		{"a range across a /24 boundary is accepted", `addresses: ["203.0.112.250-203.0.113.5"]`, ""},
		{"the whole IPv4 and IPv6 spaces with avoidBuggyIPs are accepted", `{addresses: [0.0.0.0/0, "::/0"], avoidBuggyIPs: true}`, ""},
		{"a BGP pool with BGP options is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {communities: ["64496:100", "0:0", "65535:65535"], localPref: 200}}}`, ""},
		{"weighting by endpoints is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {weightByEndpoints: true}}}`, ""},
		{"aggregates no wider than the pool's CIDRs are accepted",
			`{addresses: [203.0.113.0/27, "2001:db8:100::/64"], announce: {mode: BGP, bgp: {aggregationLength: 28, aggregationLengthV6: 64}}}`, ""},
		{"the host lengths are accepted with ranges",
			`{addresses: [203.0.113.10-203.0.113.20], announce: {mode: BGP, bgp: {aggregationLength: 32, aggregationLengthV6: 128}}}`, ""},
		{"an aggregate wider than a CIDR of the pool is refused",
			`{addresses: [203.0.113.0/27], announce: {mode: BGP, bgp: {aggregationLength: 24}}}`, "with aggregationLength give the pool's IPv4 addresses as CIDRs no longer than it"},
		{"an aggregate over a range is refused",
			`{addresses: [203.0.113.0-203.0.113.31], announce: {mode: BGP, bgp: {aggregationLength: 28}}}`, "not ranges"},
		{"an IPv6 aggregate wider than the pool is refused",
			`{addresses: ["2001:db8:100::/64"], announce: {mode: BGP, bgp: {aggregationLengthV6: 48}}}`, "with aggregationLengthV6 give the pool's IPv6 addresses as CIDRs no longer than it"},
		{"aggregates with weights by endpoints are refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {aggregationLength: 28, weightByEndpoints: true}}}`, "turn weightByEndpoints or the aggregation off"},
		{"large communities are accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {largeCommunities: ["4200000000:1:2", "0:0:4294967295"]}}}`, ""},
		{"a large community part over 32 bits is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {largeCommunities: ["4294967296:1:2"]}}}`, "each part of a large community is a number from 0 to 4294967295"},
		{"a large community with two parts is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {largeCommunities: ["64496:1"]}}}`, "should match"},
		{"Service communities are accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {serviceCommunities: ["64496:200", "0:65535"]}}}`, ""},
		{"a Service community over 65535 is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {serviceCommunities: ["64496:65536"]}}}`, "each half of a community is a number from 0 to 65535"},
		{"Service communities with an aggregate are refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {aggregationLength: 28, serviceCommunities: ["64496:200"]}}}`, "remove serviceCommunities or the aggregation"},
		{"draining by weight is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {drain: Weight}}}`, ""},
		{"draining by GRACEFUL_SHUTDOWN is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {drain: GracefulShutdown}}}`, ""},
		{"a drain mode that is neither GracefulShutdown nor Weight is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {drain: Withdraw}}}`, "drain"},
		{"a pool that lends externalIPs is accepted",
			`{addresses: [203.0.113.0/24], externalIPs: Allow, autoAssign: false}`, ""},
		{"an externalIPs policy that is neither Allow nor Deny is refused",
			`{addresses: [203.0.113.0/24], externalIPs: Always}`, "externalIPs"},
		{"the largest localPref is accepted",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {localPref: 4294967295}}}`, ""},
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
  preferredNodeSelector: {matchExpressions: [{key: node-role.kubernetes.io/edge, operator: Exists}]}
  l2: {interfaces: [eth0, bond0.100]}
`, ""},

		{"empty addresses are refused", `addresses: []`, "spec.addresses"},
		{"missing addresses are refused", `autoAssign: true`, "spec.addresses: Required value"},
		{"a malformed CIDR is refused", `addresses: [203.0.113.0/33]`, "must be a CIDR such as"},
		{"a word is refused", `addresses: [everything]`, "must be a CIDR such as"},
		{"a range with a bad end is refused", `addresses: ["203.0.113.1-203.0.113.300"]`, "must be a CIDR such as"},
		{"a range with spaces is refused", `addresses: ["203.0.113.1 - 203.0.113.3"]`, "without spaces"},
		{"an IPv4-mapped IPv6 CIDR is refused", `addresses: ["::ffff:203.0.113.0/120"]`, "must be a CIDR such as"},
		{"a zoned address in a range is refused", `addresses: ["fe80::1%eth0-fe80::2%eth0"]`, "must be a CIDR such as"},
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
		{"a community whose ASN half is over 65535 is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {communities: ["65536:1"]}}}`, "each half of a community is a number from 0 to 65535: write ASN:value such as 64496:100"},
		{"a community whose value half is over 65535 is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {communities: ["64496:100", "1:99999"]}}}`, "each half of a community is a number from 0 to 65535"},
		{"a localPref over 32 bits is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {localPref: 4294967296}}}`, "spec.announce.bgp.localPref: Invalid value: 4294967296: spec.announce.bgp.localPref in body should be less than or equal to 4294967295"},
		{"a negative localPref is refused",
			`{addresses: [203.0.113.0/24], announce: {mode: BGP, bgp: {localPref: -1}}}`, "should be greater than or equal to 0"},
		{"a negative priority is refused", `{addresses: [203.0.113.0/24], priority: -1}`, "spec.priority"},
		{"interface names of 15 ASCII characters are accepted",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: [eth0, bond0.100, enp0s31f6-abcde, "a@b"]}}}`, ""},
		{"an interface name of 16 characters is refused",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: [enp0s31f6-abcdef]}}}`, "Too long: may not be more than 15 bytes"},
		{"an interface name of 15 characters but more bytes is refused",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: [ééééééé]}}}`,
			"spec.announce.l2.interfaces: Invalid value: an interface name is 1 to 15 ASCII characters without '/', ':' or spaces, and not . or .., such as eth0 or bond0.100"},
		{"an interface alias is refused",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: ["eth0:1"]}}}`, "an interface name is 1 to 15 ASCII characters without '/', ':' or spaces"},
		{"the interface name .. is refused",
			`{addresses: [203.0.113.0/24], announce: {l2: {interfaces: [".."]}}}`, "and not . or .."},
		{"an invalid namespace name is refused",
			`{addresses: [203.0.113.0/24], serviceAllocation: {namespaces: [Bad_NS]}}`, "serviceAllocation.namespaces"},
	}
	// Every selector of a pool gets the same rules.
	for _, at := range []struct{ field, wrap string }{
		{"spec.announce.nodeSelector", `{addresses: [203.0.113.0/24], announce: {nodeSelector: %s}}`},
		{"spec.announce.preferredNodeSelector", `{addresses: [203.0.113.0/24], announce: {preferredNodeSelector: %s}}`},
		{"spec.serviceAllocation.namespaceSelector", `{addresses: [203.0.113.0/24], serviceAllocation: {namespaceSelector: %s}}`},
		{"spec.serviceAllocation.serviceSelector", `{addresses: [203.0.113.0/24], serviceAllocation: {serviceSelector: %s}}`},
	} {
		for _, sc := range selectorCases {
			want := sc.want
			if want != "" {
				want = at.field + sc.want
			}
			cases = append(cases, crdCase{at.field + ": " + sc.name, fmt.Sprintf(at.wrap, sc.spec), want})
		}
	}
	checkCRDCases(t, dyn, "IPPool", "validation", cases, acceptedPoolParses)
}

// selectorCases are label selectors the API server must accept or refuse wherever a
// selector is; want is the refusal after the selector's field path.
var selectorCases = []crdCase{
	{"an empty selector is accepted", `{}`, ""},
	{"a selector of every form is accepted",
		`{matchLabels: {topology.kubernetes.io/zone: a, rack: "", x: A-b_c.9}, matchExpressions: [{key: example.com/tier, operator: NotIn, values: [edge, ""]}, {key: gpu, operator: DoesNotExist}, {key: t, operator: In, values: [a]}, {key: z, operator: Exists}]}`, ""},
	{"In without values is refused", `{matchExpressions: [{key: tier, operator: In}]}`,
		".matchExpressions[0]: Invalid value: operators In and NotIn need at least one value: add values, or use Exists or DoesNotExist"},
	{"NotIn with an empty list of values is refused", `{matchExpressions: [{key: tier, operator: NotIn, values: []}]}`,
		".matchExpressions[0]: Invalid value: operators In and NotIn need at least one value"},
	{"Exists with values is refused", `{matchExpressions: [{key: tier, operator: Exists, values: [edge]}]}`,
		".matchExpressions[0]: Invalid value: operators Exists and DoesNotExist take no values: remove values, or use In or NotIn"},
	{"DoesNotExist with values is refused", `{matchExpressions: [{key: t, operator: In, values: [a]}, {key: tier, operator: DoesNotExist, values: [edge]}]}`,
		".matchExpressions[1]: Invalid value: operators Exists and DoesNotExist take no values"},
	{"an unknown operator is refused", `{matchExpressions: [{key: tier, operator: Equals, values: [edge]}]}`,
		`.matchExpressions[0].operator: Unsupported value: "Equals": supported values: "In", "NotIn", "Exists", "DoesNotExist"`},
	badKey("a key with a space is refused", "my tier"),
	badKey("a key starting with a dash is refused", "-tier"),
	badKey("a key with an upper-case prefix is refused", "Example.com/tier"),
	badKey("a key with an empty prefix is refused", "/tier"),
	badKey("a key with two slashes is refused", "a.b/c/d"),
	badKey("a key with a name of 64 characters is refused", strings.Repeat("n", 64)),
	{"a key with a prefix of 254 characters is refused", `{matchExpressions: [{key: ` + longPrefix(254) + `/tier, operator: Exists}]}`,
		`.matchExpressions[0].key: Invalid value: "` + longPrefix(254) + `/tier": the prefix of a label key (before the slash) is at most 253 characters`},
	{"a key with a prefix of 253 characters is accepted", `{matchExpressions: [{key: ` + longPrefix(253) + `/tier, operator: Exists}]}`, ""},
	{"an empty key is refused", `{matchExpressions: [{key: "", operator: Exists}]}`, `.matchExpressions[0].key: Invalid value: "": `},
	{"a bad value is refused", `{matchExpressions: [{key: tier, operator: In, values: [edge, "edge!"]}]}`,
		`.matchExpressions[0].values[1]: Invalid value: "edge!": must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, such as rack-a`},
	{"a value of 64 characters is refused", `{matchExpressions: [{key: tier, operator: In, values: [` + strings.Repeat("v", 64) + `]}]}`,
		".matchExpressions[0].values[0]: Too long: may not be more than 63 bytes"},
	{"a bad matchLabels key is refused", `{matchLabels: {"my tier": edge}}`,
		".matchLabels: Invalid value: every key must be a label key: a name of at most 63 letters"},
	{"a matchLabels key with a name of 64 characters is refused", `{matchLabels: {` + strings.Repeat("n", 64) + `: edge}}`,
		".matchLabels: Invalid value: every key must be a label key"},
	{"a matchLabels key with a prefix of 254 characters is refused", `{matchLabels: {` + longPrefix(254) + `/tier: edge}}`,
		".matchLabels: Invalid value: the prefix of a label key (before the slash) is at most 253 characters"},
	{"a bad matchLabels value is refused", `{matchLabels: {tier: -edge}}`,
		`.matchLabels[tier]: Invalid value: "-edge": must be a label value: empty, or at most 63 letters`},
}

func badKey(name, key string) crdCase {
	return crdCase{name, `{matchExpressions: [{key: "` + key + `", operator: Exists}]}`,
		`.matchExpressions[0].key: Invalid value: "` + key + `": must be a label key: a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, optionally after a DNS prefix and a slash, such as topology.kubernetes.io/zone`}
}

// longPrefix is a DNS prefix of n characters.
func longPrefix(n int) string {
	var parts []string
	for left := n; left > 0; {
		l := min(left, 63)
		if left-l == 1 { // a label cannot be followed by a lone dot
			l--
		}
		parts = append(parts, strings.Repeat("p", l))
		left -= l + 1
	}
	return strings.Join(parts, ".")
}

// acceptedPoolParses converts an accepted pool as the allocator and the agents do: every
// range parses, every selector converts, every community parses, localPref fits 32 bits.
func acceptedPoolParses(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	p := &v1alpha1.IPPool{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		t.Fatalf("decode the accepted pool: %v", err)
	}
	for _, e := range poolParseErrors(p) {
		t.Errorf("the API server accepted %s, which the CCM or the agents refuse: %v", u.GetName(), e)
	}
}

// poolParseErrors lists what the CCM (its one decoder, which parses ranges as the allocator
// does) and the agents would refuse in a pool.
func poolParseErrors(p *v1alpha1.IPPool) []error {
	var errs []error
	for _, pr := range pools.DecodePool(p).Problems {
		errs = append(errs, fmt.Errorf("the CCM refuses %s", pr))
	}
	if b := p.Spec.Announce.BGP; b != nil {
		for _, c := range b.Communities {
			if _, err := bgp.ParseCommunity(c); err != nil {
				errs = append(errs, fmt.Errorf("the agent refuses %w", err))
			}
		}
	}
	return errs
}

func TestIPPoolCRDDefaults(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
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

func TestDocumentedPoolExampleIsAcceptedByTheCRD(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
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

// TestTheCRDRefusesTheSelectorsTheParserRefuses checks the selector cases against
// metav1.LabelSelectorAsSelector itself: the CRD refuses exactly what it refuses, no more.
func TestTheCRDRefusesTheSelectorsTheParserRefuses(t *testing.T) {
	for _, tc := range selectorCases {
		t.Run(tc.name, func(t *testing.T) {
			sel := &v1alpha1.LabelSelector{}
			if err := yaml.Unmarshal([]byte(tc.spec), sel); err != nil {
				t.Fatal(err)
			}
			_, err := sel.AsSelector()
			if (err != nil) != (tc.want != "") {
				t.Errorf("the parser says %v; the CRD refuses it: %v", err, tc.want != "")
			}
		})
	}
}

// checkCRDParity submits objects of kind with specs from gen to the API server (each created
// and deleted at once): every spec it accepts must pass accepted, and it may refuse one only
// as invalid. It logs how many it took of how many.
func checkCRDParity(t *testing.T, dyn dynamic.Interface, kind string, gen func(rt *rapid.T) map[string]any, accepted func(rt *rapid.T, spec map[string]any, got *unstructured.Unstructured)) {
	t.Helper()
	var tried, took int
	rapid.Check(t, func(rt *rapid.T) {
		spec := gen(rt)
		tried++
		got, err := createAndDelete(context.Background(), dyn, kind, fmt.Sprintf("parity-%d", tried), spec)
		if err != nil {
			if !apierrors.IsInvalid(err) {
				rt.Fatalf("create: %v", err)
			}
			return
		}
		took++
		accepted(rt, spec, got)
	})
	t.Logf("%ss tried: %d; accepted by the API server and by the CCM's and the agents' own checks: %d; refused by the API server: %d", kind, tried, took, tried-took)
}

// createAndDelete creates an object of kind with spec and deletes it at once: what the API
// server stored, or its refusal.
func createAndDelete(ctx context.Context, dyn dynamic.Interface, kind, name string, spec map[string]any) (*unstructured.Unstructured, error) {
	res, obj := crdObject(kind, name, spec)
	got, err := dyn.Resource(res).Create(ctx, obj, metav1.CreateOptions{})
	if err == nil {
		if err := dyn.Resource(res).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return nil, fmt.Errorf("delete %s: %w", name, err)
		}
	}
	return got, err
}

// Generators of near-valid values: mostly right, with the mistakes a user makes mixed in,
// so that whole objects are accepted often enough to check them.
var (
	genLabelKey = mostly(
		rapid.StringMatching(`([a-z0-9]([-a-z0-9]{0,3}[a-z0-9])?[.]){0,2}[a-z]{1,4}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,5}[A-Za-z0-9])?|[A-Za-z0-9]([-A-Za-z0-9_.]{0,5}[A-Za-z0-9])?`),
		rapid.OneOf(
			rapid.SampledFrom([]string{"", "my tier", "-x", "x-", "/x", "Example.com/x", "a/b/c", "a./x", strings.Repeat("n", 64), longPrefix(254) + "/n", "é", longPrefix(253) + "/n"}),
			rapid.StringMatching(`[a-zA-Z0-9._/ -]{0,12}`)))
	genLabelValue = mostly(
		rapid.StringMatching(`([A-Za-z0-9]([-A-Za-z0-9_.]{0,5}[A-Za-z0-9])?)?`),
		rapid.OneOf(
			rapid.SampledFrom([]string{"-x", "x.", "x!", "a b", strings.Repeat("v", 64), strings.Repeat("v", 63)}),
			rapid.StringMatching(`[a-zA-Z0-9._ -]{0,8}`)))
	genInterface = mostly(rapid.StringMatching(`[a-z]{1,4}[0-9]{0,3}([.][0-9]{1,4})?`),
		rapid.SampledFrom([]string{"", ".", "..", "eth0:1", "a/b", "a b", "ééééééé", "enp0s31f6-abcdef", "é"}))
	genOperator = mostly(rapid.SampledFrom([]string{"In", "NotIn", "Exists", "DoesNotExist"}), rapid.SampledFrom([]string{"Equals", "in", ""}))
)

// mostly draws from good nine times in ten, else from bad.
func mostly[V any](good, bad *rapid.Generator[V]) *rapid.Generator[V] {
	return rapid.Custom(func(t *rapid.T) V {
		if rapid.IntRange(0, 9).Draw(t, "mistake") == 0 {
			return bad.Draw(t, "bad")
		}
		return good.Draw(t, "good")
	})
}

func genSelector(t *rapid.T, label string) map[string]any {
	sel := map[string]any{}
	if n := rapid.IntRange(0, 2).Draw(t, label+" labels"); n > 0 {
		m := map[string]any{}
		for range n {
			m[genLabelKey.Draw(t, label+" label key")] = genLabelValue.Draw(t, label+" label value")
		}
		sel["matchLabels"] = m
	}
	if n := rapid.IntRange(0, 2).Draw(t, label+" expressions"); n > 0 {
		var exprs []any
		for range n {
			op := genOperator.Draw(t, label+" operator")
			e := map[string]any{"key": genLabelKey.Draw(t, label+" key"), "operator": op}
			k := rapid.IntRange(1, 2).Draw(t, label+" values")
			if op == "Exists" || op == "DoesNotExist" {
				k = -1
			}
			if rapid.IntRange(0, 9).Draw(t, label+" values mistake") == 0 {
				k = rapid.IntRange(-1, 2).Draw(t, label+" any values")
			}
			if k >= 0 {
				vals := []any{}
				for range k {
					vals = append(vals, genLabelValue.Draw(t, label+" value"))
				}
				e["values"] = vals
			}
			exprs = append(exprs, e)
		}
		sel["matchExpressions"] = exprs
	}
	return sel
}

func genAddr(t *rapid.T, label string) netip.Addr {
	if rapid.Bool().Draw(t, label+" v6") {
		var b [16]byte
		for i := range b {
			b[i] = rapid.Byte().Draw(t, label+" byte")
		}
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{rapid.Byte().Draw(t, label), rapid.Byte().Draw(t, label), rapid.Byte().Draw(t, label), rapid.Byte().Draw(t, label)})
}

func genAddressRange(t *rapid.T) string {
	mistake := func(label string) bool { return rapid.IntRange(0, 9).Draw(t, label) == 0 }
	switch rapid.IntRange(0, 4).Draw(t, "address form") {
	case 0, 1:
		a := genAddr(t, "cidr")
		bits := rapid.IntRange(0, a.BitLen()).Draw(t, "bits")
		if mistake("bits") {
			bits = rapid.IntRange(0, a.BitLen()+1).Draw(t, "any bits")
		}
		if !mistake("host bits") && bits <= a.BitLen() {
			a = netip.PrefixFrom(a, bits).Masked().Addr()
		}
		return fmt.Sprintf("%s/%d", a, bits)
	case 2, 3:
		a, b := genAddr(t, "first"), genAddr(t, "last")
		if !mistake("families") && a.Is4() != b.Is4() {
			b = a
		}
		if !mistake("order") && b.Less(a) {
			a, b = b, a
		}
		dash := "-"
		if mistake("dash") {
			dash = rapid.SampledFrom([]string{" - ", "--", " -"}).Draw(t, "bad dash")
		}
		return a.String() + dash + b.String()
	default:
		return rapid.SampledFrom([]string{"everything", "203.0.113.010/32", "fe80::1%eth0/64", "::ffff:203.0.113.0/120", "203.0.113.1-", "-203.0.113.1", "203.0.113.0/24 ", "0.0.0.0/0", "::/0"}).Draw(t, "junk")
	}
}

// TestPoolsTheCRDAcceptsAreAcceptedByTheCCMAndTheAgents generates pools, near-valid and not, and
// submits them to the real API server: every pool it accepts must parse as the allocator and
// the agents parse it.
func TestPoolsTheCRDAcceptsAreAcceptedByTheCCMAndTheAgents(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
	checkCRDParity(t, dyn, "IPPool", func(rt *rapid.T) map[string]any {
		spec := map[string]any{}
		var addrs []any
		for range rapid.IntRange(1, 2).Draw(rt, "addresses") {
			addrs = append(addrs, genAddressRange(rt))
		}
		spec["addresses"] = addrs
		spec["avoidBuggyIPs"] = rapid.Bool().Draw(rt, "avoidBuggyIPs")
		announce := map[string]any{}
		if rapid.Bool().Draw(rt, "bgp") {
			b := map[string]any{}
			var comms []any
			for range rapid.IntRange(0, 3).Draw(rt, "communities") {
				half := mostly(rapid.OneOf(rapid.SampledFrom([]int{0, 1, 64496, 65535}), rapid.IntRange(0, 65535)), rapid.SampledFrom([]int{65536, 99999}))
				c := fmt.Sprintf("%d:%d", half.Draw(rt, "asn"), half.Draw(rt, "value"))
				if rapid.IntRange(0, 9).Draw(rt, "junk community") == 0 {
					c = rapid.SampledFrom([]string{"no-export", "1:2:3", " 1:2", "-1:2", "1:", "123456:1"}).Draw(rt, "junk")
				}
				comms = append(comms, c)
			}
			if len(comms) > 0 {
				b["communities"] = comms
			}
			if rapid.Bool().Draw(rt, "has localPref") {
				b["localPref"] = mostly(rapid.OneOf(rapid.SampledFrom([]int64{0, 100, math.MaxUint32}), rapid.Int64Range(0, math.MaxUint32)),
					rapid.OneOf(rapid.SampledFrom([]int64{-1, math.MaxUint32 + 1, math.MaxInt64}), rapid.Int64())).Draw(rt, "localPref")
			}
			announce["mode"], announce["bgp"] = "BGP", b
		} else if rapid.Bool().Draw(rt, "l2") {
			var ifaces []any
			for range rapid.IntRange(1, 2).Draw(rt, "interfaces") {
				ifaces = append(ifaces, genInterface.Draw(rt, "interface"))
			}
			announce["l2"] = map[string]any{"interfaces": ifaces, "spreading": mostly(rapid.SampledFrom([]string{"Single", "PerClient"}), rapid.SampledFrom([]string{"", "perclient"})).Draw(rt, "spreading")}
		}
		if rapid.Bool().Draw(rt, "nodeSelector") {
			announce["nodeSelector"] = genSelector(rt, "nodeSelector")
		}
		if rapid.Bool().Draw(rt, "preferredNodeSelector") {
			announce["preferredNodeSelector"] = genSelector(rt, "preferredNodeSelector")
		}
		spec["announce"] = announce
		if rapid.Bool().Draw(rt, "serviceAllocation") {
			spec["serviceAllocation"] = map[string]any{"namespaceSelector": genSelector(rt, "namespaceSelector"), "serviceSelector": genSelector(rt, "serviceSelector")}
		}
		return spec
	}, func(rt *rapid.T, spec map[string]any, got *unstructured.Unstructured) {
		p := &v1alpha1.IPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, p); err != nil {
			rt.Fatal(err)
		}
		if errs := poolParseErrors(p); len(errs) > 0 {
			rt.Fatalf("the API server accepted %v, which the CCM or the agents refuse: %v", spec, errors.Join(errs...))
		}
	})
}
