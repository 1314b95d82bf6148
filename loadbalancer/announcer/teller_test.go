package announcer

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/metalvip/metalvip/loadbalancer/planner"
)

// told drains what the recorder was told, one "Reason message" each.
func told(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			_, rest, _ := strings.Cut(e, " ") // the Event's type
			out = append(out, rest)
		default:
			return out
		}
	}
}

// TestTheTellerTellsEachChangeOfPlacementOnce: a sequence of placements of one address and
// the Events they give; a placement that repeats the last gives none.
func TestTheTellerTellsEachChangeOfPlacementOnce(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.9")
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}
	l2 := func(nodes ...string) planner.Entry { return planner.Entry{Mode: planner.L2, Nodes: nodes} }
	type step struct {
		e    planner.Entry
		ok   bool
		want []string // prefixes of the Events told
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the first placement says nothing", []step{{l2("node1", "node2"), true, nil}}},
		{"a move for balance", []step{{l2("node1", "node2"), true, nil}, {l2("node2", "node1"), true, []string{"Moved 203.0.113.9 moved from node1 to node2: to keep the nodes balanced"}}}},
		{"a move away from a node no longer eligible", []step{{l2("node1", "node2"), true, nil}, {l2("node2"), true, []string{"Moved 203.0.113.9 moved from node1 to node2: node1 may no longer announce it"}}}},
		{"the same placement again says nothing", []step{{l2("node1"), true, nil}, {l2("node1", "node3"), true, nil}}},
		{"no eligible node, told once", []step{{l2(), true, []string{"NoEligibleNode No node may announce 203.0.113.9"}}, {l2(), true, nil}}},
		{"eligible again then none again: told again", []step{{l2(), true, []string{"NoEligibleNode"}}, {l2("node1"), true, nil}, {l2(), true, []string{"NoEligibleNode"}}}},
		{"BGP tells no moves", []step{{planner.Entry{Mode: planner.BGP, Nodes: []string{"node1"}}, true, nil}, {planner.Entry{Mode: planner.BGP, Nodes: []string{"node2"}}, true, nil}}},
		{"unplanned, then placed: a first placement", []step{{l2("node1"), true, nil}, {planner.Entry{}, false, nil}, {l2("node2"), true, nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(16)
			tl := newTeller(rec)
			for i, st := range tc.steps {
				tl.placed(ip, st.e, st.ok, func() []*v1.Service { return []*v1.Service{svc} })
				got := told(rec)
				same := len(got) == len(st.want)
				for j := range got {
					same = same && strings.HasPrefix(got[j], st.want[j])
				}
				if !same {
					t.Fatalf("step %d (%+v): told %q, want %q", i, st.e, got, st.want)
				}
			}
		})
	}
}

// TestTheTellerSaysWhenAServicesAddressesShareANodeAndWhenTheySpread.
func TestTheTellerSaysWhenAServicesAddressesShareANodeAndWhenTheySpread(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("203.0.113.3")}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}
	services := func() []*v1.Service { return []*v1.Service{svc} }
	for _, tc := range []struct {
		name  string
		steps [][]string // primaries per step
		want  []string   // the Event told at each step ("" none), by prefix
	}{
		{"spread from the start says nothing", [][]string{{"node1", "node2", "node3"}}, []string{""}},
		{"sharing, then spread", [][]string{{"node1", "node1", "node2"}, {"node1", "node3", "node2"}},
			[]string{"VIPsShareNodes 3 addresses on 2 nodes: fewer nodes are eligible than addresses, so some share a node (203.0.113.1 and 203.0.113.2 on node1)", "VIPsSpread 3 addresses on 3 distinct nodes"}},
		{"the same sharing twice: told once", [][]string{{"node1", "node1", "node1"}, {"node1", "node1", "node1"}}, []string{"VIPsShareNodes 3 addresses on 1 nodes", ""}},
		{"another sharing: told again", [][]string{{"node1", "node1", "node2"}, {"node2", "node2", "node1"}}, []string{"VIPsShareNodes", "VIPsShareNodes 3 addresses on 2 nodes: fewer nodes are eligible than addresses, so some share a node (203.0.113.1 and 203.0.113.2 on node2)"}},
		{"an address without a primary is not a sharer", [][]string{{"", "", "node1"}}, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(16)
			tl := newTeller(rec)
			for i, primaries := range tc.steps {
				tl.spread("web/front/v4", ips, primaries, services)
				got := told(rec)
				switch {
				case tc.want[i] == "" && len(got) > 0:
					t.Fatalf("step %d: told %q, want nothing", i, got)
				case tc.want[i] != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want[i])):
					t.Fatalf("step %d: told %q, want %q", i, got, tc.want[i])
				}
			}
		})
	}
}

// TestTheTellerWarnsOnceUntilForgotten.
func TestTheTellerWarnsOnceUntilForgotten(t *testing.T) {
	tl := newTeller(record.NewFakeRecorder(1))
	n := 0
	emit := func() { n++ }
	for _, what := range []string{"a", "a", "b", "b", "a"} {
		tl.once("pool-eligible/p", what, emit)
	}
	tl.forget("pool-eligible/p")
	tl.once("pool-eligible/p", "a", emit)
	if n != 4 {
		t.Errorf("emitted %d times, want 4 (a, b, a, and a after forget)", n)
	}
}
