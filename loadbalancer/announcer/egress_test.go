package announcer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/desired"
)

// egressEndpoints puts the Service's endpoints at addrs (node -> pod address).
func (h *harness) egressEndpoints(svc string, addrs map[string]string) {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4}
	for n, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: &n})
	}
	if err := h.factory.Discovery().V1().EndpointSlices().Informer().GetIndexer().Update(es); err != nil {
		h.t.Fatal(err)
	}
}

// egressOf is what node's state says of egress: "VIP sources=... remote=... candidates=...".
func (h *harness) egressOf(node string) []string {
	var out []string
	for _, e := range h.a.egressOf(node) {
		var cands []string
		for _, c := range e.GetCandidates() {
			cands = append(cands, c.GetNode())
		}
		out = append(out, e.GetVip()+" sources="+strings.Join(e.GetSources(), ",")+" remote="+strings.Join(e.GetRemoteSources(), ",")+
			" candidates="+strings.Join(cands, ",")+" cluster="+strings.Join(e.GetClusterCidrs(), ","))
	}
	return out
}

// TestEgressReachesThePodsNodesAndTheCandidates: the CCM tells each node with pods of an egress
// Service its own pods, each candidate every other node's too, and no other node anything; an
// endpoint moving changes the states of the nodes it leaves and joins and of the candidates; a
// pool that does not allow it refuses it with a condition and an Event, and tells no node.
func TestEgressReachesThePodsNodesAndTheCandidates(t *testing.T) {
	h := newHarness(t, 5)
	h.a.cfg.EgressClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	h.pool("lend", map[string]any{"addresses": []any{"203.0.113.0/28"}, "egress": "Allow"})
	h.pool("keep", map[string]any{"addresses": []any{"203.0.113.16/28"}})
	svc := h.service("a", "lend", false, "203.0.113.1")
	svc.Annotations["metalvip.io/egress"] = "true"
	svc.Spec.Selector = map[string]string{"app": "a"}
	denied := h.service("b", "keep", false, "203.0.113.17")
	denied.Annotations["metalvip.io/egress"] = "true"
	denied.Spec.Selector = map[string]string{"app": "b"}
	h.sync(changes{services: map[string]bool{"ns/a": true, "ns/b": true}})
	cands := h.nodesOf("203.0.113.1")
	if len(cands) != 3 {
		t.Fatalf("candidates %v, want 3 (MaxCandidates)", cands)
	}
	var outsider string
	for _, n := range []string{"node1", "node2", "node3", "node4", "node5"} {
		if !slices.Contains(cands, n) {
			outsider = n
			break
		}
	}
	// One pod on a candidate, one on a node that is none.
	h.egressEndpoints("a", map[string]string{cands[1]: "198.18.2.7", outsider: "198.18.9.9"})
	before := map[string]pushed{}
	for n, st := range h.a.loop.pushes {
		before[n] = st
	}
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	candList := strings.Join(cands, ",")
	for _, n := range []string{"node1", "node2", "node3", "node4", "node5"} {
		var want []string
		switch {
		case n == cands[1]:
			want = []string{"203.0.113.1 sources=198.18.2.7 remote=198.18.9.9 candidates=" + candList + " cluster=198.18.0.0/15"}
		case n == outsider:
			want = []string{"203.0.113.1 sources=198.18.9.9 remote= candidates=" + candList + " cluster=198.18.0.0/15"}
		case slices.Contains(cands, n):
			want = []string{"203.0.113.1 sources= remote=198.18.2.7,198.18.9.9 candidates=" + candList + " cluster=198.18.0.0/15"}
		}
		if got := h.egressOf(n); !slices.Equal(got, want) {
			t.Errorf("%s is told %q, want %q", n, got, want)
		}
		if changed := h.a.loop.pushes[n] != before[n]; changed != (len(want) > 0) {
			t.Errorf("%s: state rebuilt %v, want %v", n, changed, len(want) > 0)
		}
	}
	c, refused, asks := h.a.egressCondition(svc)
	if !asks || refused != "" || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "2 pod addresses leave from egress node "+cands[0]) {
		t.Errorf("the Egress condition %+v (refused %q)", c, refused)
	}
	c, refused, _ = h.a.egressCondition(denied)
	if c.Status != metav1.ConditionFalse || c.Reason != "EgressRefused" || !strings.Contains(refused, "IPPool keep does not allow egress") {
		t.Errorf("the refused Service's condition %+v (refused %q)", c, refused)
	}

	// The outsider's pod goes away: its node hears no more of it; the candidates drop it.
	h.egressEndpoints("a", map[string]string{cands[1]: "198.18.2.7"})
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	if got := h.egressOf(outsider); len(got) != 0 {
		t.Errorf("%s, without pods, is told %q", outsider, got)
	}
	if got := h.egressOf(cands[0]); len(got) != 1 || !strings.Contains(got[0], "remote=198.18.2.7 ") {
		t.Errorf("%s is told %q", cands[0], got)
	}

	// The annotation goes: no node hears of egress, the condition goes.
	delete(svc.Annotations, "metalvip.io/egress")
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	for _, n := range []string{"node1", "node2", "node3", "node4", "node5"} {
		if got := h.egressOf(n); len(got) != 0 {
			t.Errorf("without the annotation %s is told %q", n, got)
		}
	}
	if _, _, asks := h.a.egressCondition(svc); asks {
		t.Error("the Egress condition stays without the annotation")
	}
}

// TestIPv6EgressRoutesToTheCandidatesIPv6Addresses: an IPv6 address's egress items carry
// each candidate's IPv6 InternalIP (its data-plane address is IPv4), and the pods' IPv6
// addresses only; a candidate without one is named in the condition.
func TestIPv6EgressRoutesToTheCandidatesIPv6Addresses(t *testing.T) {
	h := newHarness(t, 3)
	for i := range 3 {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node%d", i+1), Labels: map[string]string{"rack": fmt.Sprint(i % 2)}}}
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: fmt.Sprintf("198.51.100.%d", 11+i)}}
		if i < 2 {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: fmt.Sprintf("2001:db8:1::%d", 11+i)})
		}
		if err := h.factory.Core().V1().Nodes().Informer().GetIndexer().Update(n); err != nil {
			t.Fatal(err)
		}
	}
	h.a.loop.refreshNodes(h.a)
	h.a.cfg.EgressClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8:18::/48")}
	h.pool("lend6", map[string]any{"addresses": []any{"2001:db8:100::/120"}, "egress": "Allow"})
	svc := h.service("a", "lend6", false, "2001:db8:100::1")
	svc.Annotations["metalvip.io/egress"] = "true"
	svc.Spec.Selector = map[string]string{"app": "a"}
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	cands := h.nodesOf("2001:db8:100::1")
	if len(cands) != 3 {
		t.Fatalf("candidates %v, want 3", cands)
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-6", Labels: map[string]string{discoveryv1.LabelServiceName: "a"}},
		AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"2001:db8:18:1::7"}, NodeName: &cands[1]}}}
	if err := h.factory.Discovery().V1().EndpointSlices().Informer().GetIndexer().Update(es); err != nil {
		t.Fatal(err)
	}
	h.egressEndpoints("a", map[string]string{cands[1]: "198.18.2.7"}) // the other family's: not sent
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	items := h.a.egressOf(cands[1])
	if len(items) != 1 || !slices.Equal(items[0].GetSources(), []string{"2001:db8:18:1::7"}) {
		t.Fatalf("%s is told %v, want its IPv6 pod", cands[1], items)
	}
	want := map[string]string{"node1": "2001:db8:1::11", "node2": "2001:db8:1::12", "node3": ""}
	for i, c := range items[0].GetCandidates() {
		if gw := items[0].GetGateways()[i]; gw != want[c.GetNode()] {
			t.Errorf("gateway of %s: %q, want %q", c.GetNode(), gw, want[c.GetNode()])
		}
	}
	if c, refused, _ := h.a.egressCondition(svc); c.Status != metav1.ConditionTrue || refused != "" || !strings.Contains(c.Message, "node3, without an IPv6 InternalIP, cannot be reached as egress node") {
		t.Errorf("the Egress condition %+v (refused %q)", c, refused)
	}
}

// TestBGPEgressRanksTheAnnouncersAndGivesThemTheReplyPorts: a BGP address's egress items name
// its announcers in desired.EgressOrder, with the reply ports, to every announcer and to the
// nodes with pods; the condition names the first as the egress node.
func TestBGPEgressRanksTheAnnouncersAndGivesThemTheReplyPorts(t *testing.T) {
	h := newHarness(t, 5)
	h.a.cfg.EgressClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	h.pool("edge", map[string]any{"addresses": []any{"203.0.113.0/28"}, "egress": "Allow", "announce": map[string]any{"mode": "BGP"}})
	svc := h.service("a", "edge", false, "203.0.113.1")
	svc.Annotations["metalvip.io/egress"] = "true"
	svc.Spec.Selector = map[string]string{"app": "a"}
	h.egressEndpoints("a", map[string]string{"node1": "198.18.1.7"})
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	announcers := h.nodesOf("203.0.113.1")
	if len(announcers) < 2 {
		t.Fatalf("announcers %v, want several", announcers)
	}
	order := desired.EgressOrder(netip.MustParseAddr("203.0.113.1"), announcers)
	for _, n := range slices.Concat(announcers, []string{"node1"}) {
		items := h.a.egressOf(n)
		if len(items) != 1 {
			t.Fatalf("%s is told %v, want one item", n, items)
		}
		it := items[0]
		var got []string
		for _, c := range it.GetCandidates() {
			got = append(got, c.GetNode())
		}
		if !slices.Equal(got, order) || it.GetReplyPorts().GetFirst() != 49152 || it.GetReplyPorts().GetLast() != 65534 {
			t.Errorf("%s is told candidates %v ports %v, want %v and 49152-65534", n, got, it.GetReplyPorts(), order)
		}
	}
	if c, refused, _ := h.a.egressCondition(svc); c.Status != metav1.ConditionTrue || refused != "" || !strings.Contains(c.Message, "1 pod addresses leave from egress node "+order[0]) {
		t.Errorf("the Egress condition %+v (refused %q)", c, refused)
	}
	// The announcers exchange heartbeats with the first ones of the order (the egress node
	// fails over with them), those with every announcer.
	top := order[:min(egressWatch, len(order))]
	for _, n := range announcers {
		want := top
		if slices.Contains(top, n) {
			want = order
		}
		for _, p := range want {
			if h.a.loop.part(n).peers[p] == 0 {
				t.Errorf("%s's heartbeat peers %v lack %s", n, h.a.loop.part(n).peers, p)
			}
		}
	}
	// A port among the reply ports: refused.
	svc.Spec.Ports = []v1.ServicePort{{Port: 50000}}
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	if c, refused, _ := h.a.egressCondition(svc); c.Status != metav1.ConditionFalse || !strings.Contains(refused, "listens on port 50000") {
		t.Errorf("with port 50000 the Egress condition %+v (refused %q)", c, refused)
	}
	for _, n := range []string{"node1", "node2", "node3", "node4", "node5"} {
		if items := h.a.egressOf(n); len(items) != 0 {
			t.Errorf("refused, %s is told %v", n, items)
		}
		if peers := h.a.loop.part(n).peers; len(peers) != 0 {
			t.Errorf("refused, %s keeps heartbeat peers %v", n, peers)
		}
	}
}

// TestAPodLeavesFromOneAddress: two addresses whose Services ask for egress for the same pod:
// the one whose Service is older keeps it, the other is refused whole with the pod named, and
// no node hears of it; the older one stops asking, and the other has it.
func TestAPodLeavesFromOneAddress(t *testing.T) {
	h := newHarness(t, 3)
	h.a.cfg.EgressClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	h.pool("lend", map[string]any{"addresses": []any{"203.0.113.0/28"}, "egress": "Allow"})
	// b is the older Service, on the higher address: age decides, not the address.
	a := h.service("a", "lend", false, "203.0.113.1")
	b := h.service("b", "lend", false, "203.0.113.2")
	a.CreationTimestamp = metav1.NewTime(time.Unix(2e9, 0))
	b.CreationTimestamp = metav1.NewTime(time.Unix(1e9, 0))
	for _, svc := range []*v1.Service{a, b} {
		svc.Annotations["metalvip.io/egress"] = "true"
		svc.Spec.Selector = map[string]string{"app": "shared"}
	}
	h.egressEndpoints("a", map[string]string{"node1": "198.18.1.7"})
	h.egressEndpoints("b", map[string]string{"node1": "198.18.1.7"})
	h.sync(changes{services: map[string]bool{"ns/a": true, "ns/b": true}})
	var vips []string
	for _, it := range h.a.egressOf("node1") {
		vips = append(vips, it.GetVip())
	}
	if !slices.Equal(vips, []string{"203.0.113.2"}) {
		t.Errorf("node1 is told egress through %v, want only the older Service's 203.0.113.2", vips)
	}
	if c, refused, _ := h.a.egressCondition(a); c.Status != metav1.ConditionFalse ||
		!strings.Contains(refused, "pod address 198.18.1.7 (on node1) already leaves from 203.0.113.2 (Services ns/b, which asked first)") {
		t.Errorf("the younger Service's condition %+v (refused %q)", c, refused)
	}
	if c, refused, _ := h.a.egressCondition(b); c.Status != metav1.ConditionTrue || refused != "" {
		t.Errorf("the older Service's condition %+v (refused %q)", c, refused)
	}

	// b stops asking: a has the pod.
	delete(b.Annotations, "metalvip.io/egress")
	h.sync(changes{services: map[string]bool{"ns/b": true}})
	vips = nil
	for _, it := range h.a.egressOf("node1") {
		vips = append(vips, it.GetVip())
	}
	if !slices.Equal(vips, []string{"203.0.113.1"}) {
		t.Errorf("with b asking no more node1 is told egress through %v, want 203.0.113.1", vips)
	}
	if c, refused, _ := h.a.egressCondition(a); c.Status != metav1.ConditionTrue || refused != "" {
		t.Errorf("then a's condition %+v (refused %q)", c, refused)
	}
}

// TestEgressConditionFollowsTheServicesAddress: a Service whose address changes has its Egress
// condition name the new address only.
func TestEgressConditionFollowsTheServicesAddress(t *testing.T) {
	h := newHarness(t, 3)
	h.a.cfg.EgressClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	h.pool("lend", map[string]any{"addresses": []any{"203.0.113.0/28"}, "egress": "Allow"})
	svc := h.service("a", "lend", false, "203.0.113.1")
	svc.Annotations["metalvip.io/egress"] = "true"
	svc.Spec.Selector = map[string]string{"app": "a"}
	h.egressEndpoints("a", map[string]string{"node1": "198.18.1.7"})
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	if c, _, _ := h.a.egressCondition(svc); !strings.Contains(c.Message, "203.0.113.1: 1 pod addresses leave") {
		t.Fatalf("the Egress condition %+v", c)
	}
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.3"}}
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	c, _, _ := h.a.egressCondition(svc)
	if strings.Contains(c.Message, "203.0.113.1") || !strings.Contains(c.Message, "203.0.113.3: 1 pod addresses leave") {
		t.Errorf("after the address moved the Egress condition says %q", c.Message)
	}
}
