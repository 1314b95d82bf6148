package loadbalancer

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/metalvip/metalvip/loadbalancer/planner"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func l2(vip string, candidates ...string) *agentv1.Announcement {
	an := &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{}}
	for _, c := range candidates {
		an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c})
	}
	return an
}

func TestSeedPlanTakesTheNewestTermAndThePrimarysCopy(t *testing.T) {
	bgp := &agentv1.Announcement{Vip: "203.0.113.9", Mode: agentv1.Mode_MODE_BGP}
	held := map[string]*agentv1.DesiredState{
		// node-a missed the last push of term 7 for .1: its copy is older.
		"node-a": {Term: 6, Generation: 40, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-a", "node-b"), l2("203.0.113.2", "node-b", "node-a"), bgp}},
		"node-b": {Term: 7, Generation: 3, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-b", "node-c"), l2("203.0.113.2", "node-b", "node-a"), bgp}},
		// Same term, node-c's own copy of .3 names it primary; node-b's stale one does not.
		"node-c": {Term: 7, Generation: 9, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-b", "node-c"), l2("203.0.113.3", "node-c", "node-b")}},
	}
	held["node-b"].Announcements = append(held["node-b"].Announcements, l2("203.0.113.3", "node-a", "node-b"))
	plan := seedPlan(held)
	want := map[string][]string{
		"203.0.113.1": {"node-b", "node-c"},
		"203.0.113.2": {"node-b", "node-a"},
		"203.0.113.3": {"node-c", "node-b"},
		"203.0.113.9": {"node-a", "node-b"},
	}
	if len(plan) != len(want) {
		t.Fatalf("plan %v, want %v", plan, want)
	}
	for vip, nodes := range want {
		e := plan[netip.MustParseAddr(vip)]
		if !slices.Equal(e.Nodes, nodes) {
			t.Errorf("%s: %v, want %v", vip, e.Nodes, nodes)
		}
	}
	if plan[netip.MustParseAddr("203.0.113.9")].Mode != planner.BGP {
		t.Errorf("203.0.113.9 should be BGP")
	}
}
