package desired

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/planner"
)

func TestDrainingNodes(t *testing.T) {
	d := Drain{Label: "metalvip.io/drain", OnCordon: true, Delay: time.Second}
	node := func(cordoned bool, labels map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: v1.NodeSpec{Unschedulable: cordoned}}
	}
	for _, tc := range []struct {
		name string
		d    Drain
		n    *v1.Node
		want bool
	}{
		{"a cordoned node is being drained", d, node(true, nil), true},
		{"a node with the label is being drained, whatever its value", d, node(false, map[string]string{"metalvip.io/drain": ""}), true},
		{"a schedulable node without the label is not", d, node(false, map[string]string{"other": "x"}), false},
		{"a cordoned node is not when onCordon is off", Drain{Label: "metalvip.io/drain"}, node(true, nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.Draining(tc.n); got != tc.want {
				t.Errorf("Draining = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLingerKeepsWhatADrainedNodeAnnouncedUntilItsDelay(t *testing.T) {
	bgp := planner.VIP{Mode: planner.BGP}
	l2 := planner.VIP{Mode: planner.L2}
	local := planner.VIP{Mode: planner.BGP, Local: true, EndpointNodes: []string{"b"}}
	inDelay := func(n string) bool { return n == "a" }
	for _, tc := range []struct {
		name       string
		e          []string
		v          planner.VIP
		was        []string
		perClient  bool
		virtualMAC bool
		want       []string
	}{
		{"a BGP node in its delay keeps advertising, last", []string{"b", "c"}, bgp, []string{"a", "b", "c"}, false, false, []string{"b", "c", "a"}},
		{"the former L2 primary stays a candidate behind the new one", []string{"b", "c"}, l2, []string{"a", "b", "c"}, false, false, []string{"b", "c", "a"}},
		{"a lingering L2 node stays through later rounds", []string{"b", "c"}, l2, []string{"b", "c", "a"}, false, false, []string{"b", "c", "a"}},
		{"a former L2 standby does not linger", []string{"b", "c"}, l2, []string{"b", "a", "c"}, false, false, []string{"b", "c"}},
		{"a node whose delay is over does not linger", []string{"a2"}, bgp, []string{"x", "a2"}, false, false, []string{"a2"}},
		{"per-client VIPs do not linger", []string{"b"}, l2, []string{"a", "b"}, true, false, []string{"b"}},
		{"virtual-MAC VIPs do not linger (one MAC on two ports)", []string{"b"}, l2, []string{"a", "b"}, false, true, []string{"b"}},
		{"a Local node without an endpoint left does not linger", []string{"b"}, local, []string{"a", "b"}, false, false, []string{"b"}},
		{"the only node lingers with nobody else to take over", nil, l2, []string{"a"}, false, false, []string{"a"}},
		{"a node that announced nothing gets nothing", []string{"b"}, bgp, nil, false, false, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := planner.Entry{Mode: tc.v.Mode, Nodes: slices.Clone(tc.e)}
			got := Linger(e, tc.v, tc.was, inDelay, tc.perClient, tc.virtualMAC)
			if !slices.Equal(got.Nodes, tc.want) {
				t.Errorf("nodes %v, want %v", got.Nodes, tc.want)
			}
			if !slices.Equal(e.Nodes, tc.e) {
				t.Errorf("the planner's entry was changed: %v", e.Nodes)
			}
		})
	}
}
