package announcer

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestALocalServiceJoinsANodeOnceItsKubeProxyServesIt: the nodes with an endpoint are narrowed
// to those whose kube-proxy says it serves the Service's health check node port, and those
// already announcing it; to all when none serves; a node whose agent does not check stays.
func TestALocalServiceJoinsANodeOnceItsKubeProxyServesIt(t *testing.T) {
	d := newDataPlanes()
	const port = 31000
	changed := d.setPorts("ns/web", port, []string{"a", "b", "c", "d"})
	slices.Sort(changed)
	if !slices.Equal(changed, []string{"a", "b", "c", "d"}) {
		t.Fatalf("ports given to %v, want every node with an endpoint", changed)
	}
	if got := d.portsOf("b"); !slices.Equal(got, []uint32{port}) {
		t.Fatalf("b watches %v", got)
	}
	d.take("a", &agentv1.DataPlane{Ready: true, ServingPorts: []uint32{port}})
	d.take("b", &agentv1.DataPlane{Ready: true, WaitingPorts: []uint32{port}}) // pod ready, kube-proxy not synced
	d.take("c", &agentv1.DataPlane{Ready: true})                               // not told the port yet
	// d's agent does not check: nil.
	counts := map[string]int{"a": 1, "b": 2, "c": 1, "d": 3}
	nodes, kept := d.serving([]string{"a", "b", "c", "d"}, counts, port, nil)
	if !slices.Equal(nodes, []string{"a", "d"}) || !maps.Equal(kept, map[string]int{"a": 1, "d": 3}) {
		t.Errorf("serving %v %v, want a and d", nodes, kept)
	}
	// b already announces it: it stays although its port fails now.
	if nodes, _ := d.serving([]string{"a", "b", "c"}, counts, port, []string{"b"}); !slices.Equal(nodes, []string{"a", "b"}) {
		t.Errorf("serving %v, want a and b (b announces it already)", nodes)
	}
	// None serves yet: every node with an endpoint, as without the check.
	if nodes, _ := d.serving([]string{"b", "c"}, counts, port, nil); !slices.Equal(nodes, []string{"b", "c"}) {
		t.Errorf("serving %v, want b and c (none serves yet)", nodes)
	}
	// b's kube-proxy serves now: its Service is derived again.
	health, ports := d.take("b", &agentv1.DataPlane{Ready: true, ServingPorts: []uint32{port}})
	if health || !slices.Equal(ports, []uint32{port}) || !slices.Equal(d.servicesOn("b", ports), []string{"ns/web"}) {
		t.Errorf("b serving: health change %v, ports %v, services %v", health, ports, d.servicesOn("b", ports))
	}
	// kube-proxy on a unhealthy, then healthy.
	if health, _ := d.take("a", &agentv1.DataPlane{Ready: false, Detail: "503", ServingPorts: []uint32{port}}); !health || !d.down("a") {
		t.Error("a's kube-proxy unhealthy: not told")
	}
	if health, _ := d.take("a", &agentv1.DataPlane{Ready: true, ServingPorts: []uint32{port}}); !health || d.down("a") {
		t.Error("a's kube-proxy healthy again: not told")
	}
	// An agent seen first unhealthy is a change; one that does not check never is down.
	if health, _ := d.take("e", &agentv1.DataPlane{}); !health || !d.down("e") {
		t.Error("e first said unhealthy: not told")
	}
	if health, _ := d.take("f", nil); health || d.down("f") {
		t.Error("f does not check: told or down")
	}
	// The endpoint leaves c and d: they no longer watch the port; the Service gone: none does.
	changed = d.setPorts("ns/web", port, []string{"a", "b"})
	slices.Sort(changed)
	if !slices.Equal(changed, []string{"c", "d"}) || d.portsOf("c") != nil {
		t.Errorf("changed %v, c watches %v", changed, d.portsOf("c"))
	}
	changed = d.setPorts("ns/web", 0, nil)
	slices.Sort(changed)
	if !slices.Equal(changed, []string{"a", "b"}) || len(d.ports) != 0 || len(d.nodes) != 0 {
		t.Errorf("changed %v, left %v %v", changed, d.ports, d.nodes)
	}
}

// TestAnL2StandbyWhoseKubeProxyDoesNotServeYetStandsByLast: the first candidate answers and
// stays; the standbys whose kube-proxy serves every Local Service behind the address come
// before those that do not, each in the plan's order.
func TestAnL2StandbyWhoseKubeProxyDoesNotServeYetStandsByLast(t *testing.T) {
	d := newDataPlanes()
	ip := netip.MustParseAddr("203.0.113.7")
	nodes := []string{"a", "b", "c", "d"}
	if got := d.rank(nodes, ip); !slices.Equal(got, nodes) {
		t.Errorf("no Local Service: %v", got)
	}
	d.setVIP(ip, []uint32{31000, 31001})                                               // two Local Services share it
	d.take("a", &agentv1.DataPlane{Ready: true})                                       // answers: stays first
	d.take("b", &agentv1.DataPlane{Ready: true, ServingPorts: []uint32{31000}})        // one of two
	d.take("c", &agentv1.DataPlane{Ready: true, ServingPorts: []uint32{31000, 31001}}) // both
	// d does not check.
	if got := d.rank(nodes, ip); !slices.Equal(got, []string{"a", "c", "d", "b"}) {
		t.Errorf("ranked %v, want a c d b", got)
	}
	if !slices.Equal(nodes, []string{"a", "b", "c", "d"}) {
		t.Errorf("the plan's list changed in place: %v", nodes)
	}
	d.setVIP(ip, nil)
	if got := d.rank(nodes, ip); !slices.Equal(got, nodes) {
		t.Errorf("forgotten: %v", got)
	}
}
