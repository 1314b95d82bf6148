package desired

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

func TestEgressIsGrantedOnlyWithThePoolOwnersConsentAndEverySharersAsk(t *testing.T) {
	pool := func(name string, egress v1alpha1.EgressPolicy, an v1alpha1.Announce) *pools.Pool {
		return pools.DecodePool(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.IPPoolSpec{
			Addresses: []v1alpha1.AddressRange{"203.0.113.0/28", "2001:db8::/120"}, Egress: egress, Announce: an}})
	}
	allow := pool("lend", v1alpha1.EgressAllow, v1alpha1.Announce{})
	deny := pool("keep", "", v1alpha1.Announce{})
	bgp := pool("edge", v1alpha1.EgressAllow, v1alpha1.Announce{Mode: v1alpha1.AnnounceBGP})
	svc := func(name, ask string, selector bool) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if ask != "" {
			s.Annotations = map[string]string{"metalvip.io/egress": ask}
		}
		if selector {
			s.Spec.Selector = map[string]string{"app": name}
		}
		return s
	}
	v4, v6 := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("2001:db8::5")
	for _, tc := range []struct {
		name    string
		ip      netip.Addr
		pool    *pools.Pool
		sharers []*v1.Service
		cidrs   int
		refused string // a part of the reason; "" for granted
	}{
		{"asked and allowed", v4, allow, []*v1.Service{svc("a", "true", true)}, 2, ""},
		{"not asked: nothing to refuse", v4, deny, []*v1.Service{svc("a", "", true), svc("b", "false", true)}, 2, ""},
		{"the pool denies it", v4, deny, []*v1.Service{svc("a", "true", true)}, 2, "IPPool keep does not allow egress"},
		{"a BGP address", v4, bgp, []*v1.Service{svc("a", "true", true)}, 2, ""},
		{"a BGP address with a Service port among the reply ports", v4, bgp, []*v1.Service{withPort(svc("a", "true", true), 443), withPort(svc("b", "true", true), 50000)}, 2,
			"Service ns/b listens on port 50000 of the BGP address 203.0.113.5, inside the ports its egress connections take (49152-65534"},
		{"an L2 address with a Service port there", v4, allow, []*v1.Service{withPort(svc("a", "true", true), 50000)}, 2, ""},
		{"an IPv6 address", v6, allow, []*v1.Service{svc("a", "true", true)}, 2, ""},
		{"no cluster ranges in the cloud-config", v4, allow, []*v1.Service{svc("a", "true", true)}, 0, "egress.clusterCIDRs"},
		{"no IPv6 cluster ranges in the cloud-config", v6, allow, []*v1.Service{svc("a", "true", true)}, 1, "no egress.clusterCIDRs of 2001:db8::5's family"},
		{"a sharer that does not ask", v4, allow, []*v1.Service{svc("a", "true", true), svc("b", "", true)}, 2, "shared with ns/b, which does not ask"},
		{"every sharer asks", v4, allow, []*v1.Service{svc("a", "true", true), svc("b", "true", true)}, 2, ""},
		{"no selector", v4, allow, []*v1.Service{svc("a", "true", false)}, 2, "has no selector"},
		{"no pool", v4, nil, []*v1.Service{svc("a", "true", true)}, 2, "no valid pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8:18::/48")}[:tc.cidrs]
			got := EgressRefusal(tc.ip, tc.pool, tc.sharers, cluster)
			if tc.refused == "" && got != "" || !strings.Contains(got, tc.refused) {
				t.Errorf("refusal %q, want one with %q", got, tc.refused)
			}
		})
	}
	if ok, problem := EgressAsk(svc("a", "yes please", true)); ok || !strings.Contains(problem, `neither "true" nor "false"`) {
		t.Errorf("a malformed annotation: asks %v, problem %q", ok, problem)
	}
}

func withPort(svc *v1.Service, port int32) *v1.Service {
	svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Port: port})
	return svc
}

// TestEgressOrderMovesTheEgressNodeOnlyForTheFirst: a BGP address's announcers are ranked the
// same whatever order they come in; a node joining that does not rank first, or one leaving
// that was not first, keeps the egress node.
func TestEgressOrderMovesTheEgressNodeOnlyForTheFirst(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.7")
	nodes := []string{"node1", "node2", "node3", "node4", "node5", "node6"}
	base := EgressOrder(ip, nodes)
	rev := slices.Clone(nodes)
	slices.Reverse(rev)
	if got := EgressOrder(ip, rev); !slices.Equal(got, base) {
		t.Fatalf("order %v from reversed input, %v from sorted", got, base)
	}
	if slices.Equal(base, nodes) && slices.Equal(EgressOrder(netip.MustParseAddr("203.0.113.8"), nodes), nodes) {
		t.Errorf("the order is the input's for two addresses: %v", base)
	}
	// Every node but the first leaving keeps the first.
	for _, gone := range base[1:] {
		less := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == gone })
		if got := EgressOrder(ip, less); got[0] != base[0] {
			t.Errorf("without %s the egress node is %s, was %s", gone, got[0], base[0])
		}
	}
	// A node joining moves it only when it ranks first.
	for i := range 20 {
		joined := fmt.Sprintf("new%d", i)
		got := EgressOrder(ip, append(slices.Clone(nodes), joined))
		if got[0] != base[0] && got[0] != joined {
			t.Errorf("with %s joining the egress node is %s, was %s", joined, got[0], base[0])
		}
	}
}

func TestEgressSourcesAreTheEndpointsAddressesOfTheVIPsFamilyByNode(t *testing.T) {
	node := func(n string) *string { return &n }
	es := []*discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.18.2.7"}, NodeName: node("node2")},
			{Addresses: []string{"198.18.2.3"}, NodeName: node("node2")},
			{Addresses: []string{"198.18.3.4"}, NodeName: node("node3")},
			{Addresses: []string{"198.18.9.9"}}, // no node: nowhere to send it from
		}},
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.18.2.3"}, NodeName: node("node2")}, // in two slices: once
		}},
		{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"2001:db8::7"}, NodeName: node("node2")},
		}},
	}
	want := map[string][]string{"node2": {"198.18.2.3", "198.18.2.7"}, "node3": {"198.18.3.4"}}
	if got := EgressSources(netip.MustParseAddr("203.0.113.5"), es); !reflect.DeepEqual(got, want) {
		t.Errorf("sources %v, want %v", got, want)
	}
	if got, want6 := EgressSources(netip.MustParseAddr("2001:db8:100::5"), es), map[string][]string{"node2": {"2001:db8::7"}}; !reflect.DeepEqual(got, want6) {
		t.Errorf("IPv6 sources %v, want %v", got, want6)
	}
	merged := MergeSources(map[string][]string{"node3": {"198.18.3.9"}}, want)
	if !reflect.DeepEqual(merged["node3"], []string{"198.18.3.4", "198.18.3.9"}) || !SameSources(merged, merged) || SameSources(merged, want) {
		t.Errorf("merged %v", merged)
	}
}
