package announcer

import (
	"maps"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestOnlyControlPlaneNodesReserveTheirVIP(t *testing.T) {
	node := func(name string, cp bool) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if cp {
			n.Labels[LabelControlPlane] = ""
		}
		return n
	}
	nodes := map[string]*v1.Node{"cp1": node("cp1", true), "cp2": node("cp2", true), "w1": node("w1", false)}
	vip, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.20")
	for _, tc := range []struct {
		name     string
		reported map[string]netip.Addr
		want     map[netip.Addr]string
	}{
		{"control-plane nodes reserve their VIP, named once", map[string]netip.Addr{"cp2": vip, "cp1": vip},
			map[netip.Addr]string{vip: "the control-plane VIP (the kube-apiserver endpoint) that cp1, cp2 serve"}},
		{"a worker's report reserves nothing", map[string]netip.Addr{"w1": other}, map[netip.Addr]string{}},
		{"a node gone reserves nothing", map[string]netip.Addr{"cp9": other, "cp1": vip},
			map[netip.Addr]string{vip: "the control-plane VIP (the kube-apiserver endpoint) that cp1 serve"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := reservedAddrs(tc.reported, nodes); !maps.Equal(got, tc.want) {
				t.Errorf("reserved %v; want %v", got, tc.want)
			}
		})
	}
}

// Issue 30, fault 7: an address a Service holds that a control-plane node reports as its
// control-plane VIP is announced from no node (it was: from the pool's workers, beside the
// control-plane nodes serving the API endpoint).
func TestTheControlPlaneVIPIsAnnouncedForNoService(t *testing.T) {
	h := newHarness(t, 3)
	h.pool("p", map[string]any{"addresses": []any{"203.0.113.0/28"}})
	h.service("a", "p", false, "203.0.113.10")
	h.service("b", "p", false, "203.0.113.11")
	h.sync(changes{services: map[string]bool{"ns/a": true, "ns/b": true}})
	if got := h.nodesOf("203.0.113.10"); len(got) != 3 {
		t.Fatalf("before: candidates %v", got)
	}
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, "node1", metav1.GetOptions{})
	if err != nil {
		n = h.a.loop.byName["node1"].DeepCopy()
	}
	n.Labels[LabelControlPlane] = ""
	h.add(h.factory.Core().V1().Nodes().Informer(), n)
	h.sync(changes{nodes: true, controlPlane: map[string]netip.Addr{"node1": netip.MustParseAddr("203.0.113.10")}})
	h.sync(changes{pools: map[string]bool{"p": true}}) // what Reserve tells the subscribers
	if got := h.nodesOf("203.0.113.10"); len(got) != 0 {
		t.Errorf("the control-plane VIP held by a Service is announced from %v; want no node", got)
	}
	for _, node := range []string{"node1", "node2", "node3"} {
		if h.pushedTo(node, "203.0.113.10") {
			t.Errorf("%s is told to announce the control-plane VIP for a Service", node)
		}
	}
	if got := h.nodesOf("203.0.113.11"); len(got) != 3 {
		t.Errorf("another address of the pool: candidates %v; want it announced as before", got)
	}
	if p := h.a.loop.set.Pool("p"); p == nil || len(p.Reserved) != 1 {
		t.Errorf("the pool does not name the reserved address: %+v", p)
	}
}
