package announcer

import (
	"slices"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestCutOffNodesKeepTheirPeersUntilBackOrGone(t *testing.T) {
	held := map[string]*agentv1.DesiredState{
		"b": {HeartbeatPeers: []*agentv1.HeartbeatPeer{{Node: "a"}, {Node: "c"}}},
		"c": {HeartbeatPeers: []*agentv1.HeartbeatPeer{{Node: "a", Departing: true}, {Node: "b"}}},
		"d": {HeartbeatPeers: []*agentv1.HeartbeatPeer{{Node: "e"}}},
	}
	reachable := func(n string) bool { return n != "a" }
	for _, tc := range []struct {
		name string
		run  func(c cutOff) []string // returns the nodes whose states change
		want map[string][]string     // node -> the cut-off nodes it heartbeats
		ret  []string
	}{
		{"a node lost keeps the peers it had, not itself", func(c cutOff) []string { return c.lost("a", []string{"a", "c", "b"}) },
			map[string][]string{"b": {"a"}, "c": {"a"}, "a": nil}, []string{"b", "c"}},
		{"a node lost without peers is no record", func(c cutOff) []string { return c.lost("a", []string{"a"}) },
			map[string][]string{"a": nil, "b": nil}, nil},
		{"a node back has none", func(c cutOff) []string { c.lost("a", []string{"b", "c"}); return c.back("a") },
			map[string][]string{"b": nil, "c": nil}, []string{"b", "c"}},
		{"two nodes lost", func(c cutOff) []string { c.lost("a", []string{"b"}); return c.lost("d", []string{"b", "c"}) },
			map[string][]string{"b": {"a", "d"}, "c": {"d"}}, []string{"b", "c"}},
		{"after a restart, the holders naming an unreachable node keep it, departing or not", func(c cutOff) []string { c.seed(held, reachable); return nil },
			map[string][]string{"b": {"a"}, "c": {"a"}, "d": nil}, nil},
		{"a node gone is forgotten, as cut off and as a peer", func(c cutOff) []string {
			c.lost("a", []string{"b", "c"})
			c.lost("d", []string{"b"})
			return c.prune(func(n string) bool { return n != "a" && n != "b" })
		}, map[string][]string{"b": nil, "c": nil}, []string{"b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCutOff()
			if got := tc.run(c); !slices.Equal(got, tc.ret) {
				t.Errorf("states changed: %v; want %v", got, tc.ret)
			}
			for n, want := range tc.want {
				if got := c.departing(n); !slices.Equal(got, want) {
					t.Errorf("%s heartbeats %v as departing; want %v", n, got, want)
				}
			}
		})
	}
}

// An L2 VIP's owner whose agent the CCM cannot reach is dropped from its candidate lists,
// and the nodes that were its candidates with it keep heartbeating it as departing (they
// never count it alive), so that an owner alive but cut off from the CCM yields the VIP;
// when it is reachable again, it is an ordinary candidate again.
func TestAnUnreachableNodeStaysTheDepartingPeerOfItsCandidates(t *testing.T) {
	h := newHarness(t, 5)
	h.pool("p", map[string]any{"addresses": []any{"203.0.113.0/28"}})
	h.service("a", "p", false, "203.0.113.1")
	h.sync(changes{services: map[string]bool{"ns/a": true}})
	cands := h.nodesOf("203.0.113.1")
	if len(cands) != 3 {
		t.Fatalf("candidates %v; want 3", cands)
	}
	owner := cands[0]
	departing := func(node string) []string {
		var out []string
		for _, p := range h.a.loop.pushes[node].head.GetHeartbeatPeers() {
			if p.GetDeparting() {
				out = append(out, p.GetNode())
			}
		}
		return out
	}
	h.sync(changes{reach: map[string]bool{owner: false}})
	if now := h.nodesOf("203.0.113.1"); slices.Contains(now, owner) {
		t.Fatalf("the unreachable owner is still a candidate: %v", now)
	}
	for _, n := range h.a.loop.nodeList {
		want := []string(nil)
		if n.Name != owner && slices.Contains(cands, n.Name) {
			want = []string{owner}
		}
		if got := departing(n.Name); !slices.Equal(got, want) {
			t.Errorf("%s heartbeats %v as departing; want %v (the owner's candidates: %v)", n.Name, got, want, cands)
		}
	}
	// Reachable again, it may still hold its old state (a push to it can still fail): its
	// fellow candidates go on heartbeating it as departing, though the plan names it again.
	h.sync(changes{reach: map[string]bool{owner: true}})
	if now := h.nodesOf("203.0.113.1"); !slices.Contains(now, owner) {
		t.Fatalf("the owner reachable again is no candidate: %v", now)
	}
	for _, n := range cands[1:] {
		if got := departing(n); !slices.Contains(got, owner) {
			t.Errorf("%s heartbeats %v as departing once the owner is reachable again but holds no state of this leader; want %s among them", n, got, owner)
		}
	}
	h.sync(changes{applied: map[string]bool{owner: true}})
	for _, n := range h.a.loop.nodeList {
		if got := departing(n.Name); len(got) > 0 {
			t.Errorf("%s heartbeats %v as departing after the owner acknowledged a state", n.Name, got)
		}
	}
}

// Fault 1 after a CCM restart (the fault soak's seed 4): a node reachable when the new leader
// learnt what the agents hold, and cut off before its first plan, has no part in any plan yet.
// Its peers are those of the state it holds: they heartbeat it as departing, else it hears no
// one, counts them all dead and answers every VIP of its state beside their owners.
func TestFault1ANodeCutOffBeforeTheFirstPlanIsHeartbeatedByThePeersOfItsState(t *testing.T) {
	h := newHarness(t, 4)
	h.a.heldPeers = func(node string) []string {
		if node == "node2" {
			return []string{"node1", "node3"}
		}
		return nil
	}
	// No Service yet: node2 has no part in the plan, as before a new leader's first plan.
	h.sync(changes{reach: map[string]bool{"node2": false}})
	for _, n := range []string{"node1", "node3"} {
		if got := h.a.loop.cutOff.departing(n); !slices.Equal(got, []string{"node2"}) {
			t.Errorf("%s heartbeats %v as departing; want [node2]", n, got)
		}
	}
	if got := h.a.loop.cutOff.departing("node4"); len(got) > 0 {
		t.Errorf("node4, no peer of node2's state, heartbeats %v as departing", got)
	}
}

// Fault 1 at a new leader's first plan (the fault soak's seed 7): node2 cut off from the CCM
// when it starts, and node3, node2's one fellow candidate of an ETP Local VIP, restarted on no
// saved state, so that no state the new leader learns names node2 as a peer. node2 still holds
// the VIP and answers it; node3 is made its first candidate. node3 must heartbeat node2 as
// departing, or node2 hears no one and answers beside it (3.3 s, until the CCM reached node2).
func TestFault1ANodeCutOffAtTheFirstPlanIsHeartbeatedByTheNodesItWouldShareCandidatesWith(t *testing.T) {
	h, reach := newUnplanned(t, 4)
	h.notePool("p", map[string]any{"addresses": []any{"203.0.113.0/28"}})
	h.service("local", "p", true, "203.0.113.7")
	h.endpoints("local", "node2", "node3")
	reach["node2"] = false
	h.sync(changes{nodes: true, reach: reach, pools: map[string]bool{"p": true}, services: map[string]bool{"ns/local": true}})
	if got := h.nodesOf("203.0.113.7"); !slices.Equal(got, []string{"node3"}) {
		t.Fatalf("candidates %v; want [node3] (node2 cut off)", got)
	}
	if got := h.a.loop.cutOff.departing("node3"); !slices.Equal(got, []string{"node2"}) {
		t.Errorf("node3 heartbeats %v as departing; want [node2], the node it would share the VIP with", got)
	}
	var peers []string
	for _, p := range h.a.loop.pushes["node3"].head.GetHeartbeatPeers() {
		if p.GetDeparting() {
			peers = append(peers, p.GetNode())
		}
	}
	if !slices.Equal(peers, []string{"node2"}) {
		t.Errorf("node3's state names %v as departing heartbeat peers; want [node2]", peers)
	}
	for _, n := range []string{"node1", "node4"} {
		if got := h.a.loop.cutOff.departing(n); len(got) > 0 {
			t.Errorf("%s, which shares nothing with node2, heartbeats %v as departing", n, got)
		}
	}
}
