package planner

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

type labelIs struct{ key, value string }

func (l labelIs) Matches(m map[string]string) bool { return m[l.key] == l.value }

func nodesN(n int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = Node{Name: fmt.Sprintf("node-%02d", i), AgentReachable: true, Labels: map[string]string{}}
	}
	return out
}

func vipsN(n int, mode Mode) []VIP {
	out := make([]VIP, n)
	for i := range out {
		out[i] = VIP{Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Mode: mode}
		if i >= 256 {
			out[i].Addr = netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i % 256)})
		}
	}
	return out
}

func loads(p Plan) map[string]int {
	m := map[string]int{}
	for _, e := range p {
		if pr := e.Primary(); pr != "" {
			m[pr]++
		}
	}
	return m
}

func TestSixVIPsOverThreeNodesTwoEach(t *testing.T) {
	p := Compute(nil, vipsN(6, L2), nodesN(3), Options{})
	for n, c := range loads(p) {
		if c != 2 {
			t.Errorf("%s has %d primaries, want 2 (plan %v)", n, c, p)
		}
	}
	for vip, e := range p {
		if len(e.Nodes) != 3 || e.Nodes[0] == e.Nodes[1] {
			t.Errorf("%s: candidates %v; want the three nodes, primary first", vip, e.Nodes)
		}
	}
}

func TestEligibility(t *testing.T) {
	nodes := nodesN(5)
	nodes[0].Excluded = true
	nodes[1].AgentReachable = false
	nodes[2].Labels["edge"] = "yes"
	nodes[3].Labels["edge"] = "yes"
	vips := []VIP{
		{Addr: netip.MustParseAddr("203.0.113.1"), Mode: L2, NodeSelector: labelIs{"edge", "yes"}},
		{Addr: netip.MustParseAddr("203.0.113.2"), Mode: BGP},
		{Addr: netip.MustParseAddr("203.0.113.3"), Mode: BGP, Local: true, EndpointNodes: []string{"node-00", "node-04"}},
		{Addr: netip.MustParseAddr("203.0.113.4"), Mode: L2, Local: true, EndpointNodes: []string{"node-03"}},
		{Addr: netip.MustParseAddr("203.0.113.5"), Mode: L2, Local: true},
	}
	p := Compute(nil, vips, nodes, Options{})
	want := map[string][]string{
		"203.0.113.1": {"node-02", "node-03"}, // selector: order checked below
		"203.0.113.2": {"node-02", "node-03", "node-04"},
		"203.0.113.3": {"node-04"}, // node-00 is excluded
		"203.0.113.4": {"node-03"},
		"203.0.113.5": nil, // Local without endpoints: nobody
	}
	for vip, w := range want {
		got := slices.Sorted(slices.Values(p[netip.MustParseAddr(vip)].Nodes))
		if !slices.Equal(got, w) {
			t.Errorf("%s: nodes %v, want %v", vip, got, w)
		}
	}
}

func TestPreferredNodesWinTies(t *testing.T) {
	nodes := nodesN(4)
	nodes[3].Labels["fast"] = "yes"
	vips := vipsN(1, L2)
	vips[0].Preferred = labelIs{"fast", "yes"}
	if got := Compute(nil, vips, nodes, Options{})[vips[0].Addr].Primary(); got != "node-03" {
		t.Errorf("primary %s, want the preferred node-03", got)
	}
}

// genScenario draws nodes (some with a label) and VIPs (some limited to that label, some Local).
func genScenario(t *rapid.T) ([]VIP, []Node) {
	nodes := nodesN(rapid.IntRange(1, 8).Draw(t, "nodes"))
	for i := range nodes {
		if rapid.IntRange(0, 2).Draw(t, "labelled") == 0 {
			nodes[i].Labels["zone"] = "a"
		}
		nodes[i].Excluded = rapid.IntRange(0, 9).Draw(t, "excluded") == 0
		nodes[i].AgentReachable = rapid.IntRange(0, 9).Draw(t, "unreachable") != 0
	}
	vips := vipsN(rapid.IntRange(0, 40).Draw(t, "vips"), L2)
	for i := range vips {
		if rapid.IntRange(0, 4).Draw(t, "bgp") == 0 {
			vips[i].Mode = BGP
		}
		if rapid.IntRange(0, 3).Draw(t, "selector") == 0 {
			vips[i].NodeSelector = labelIs{"zone", "a"}
		}
		if rapid.IntRange(0, 5).Draw(t, "local") == 0 {
			vips[i].Local = true
			for _, n := range nodes {
				if rapid.Bool().Draw(t, "endpoint") {
					vips[i].EndpointNodes = append(vips[i].EndpointNodes, n.Name)
				}
			}
		}
	}
	return vips, nodes
}

// checkPlan checks every rule: placement and balance.
func checkPlan(t *rapid.T, p Plan, vips []VIP, nodes []Node) {
	checkPlaced(t, p, vips, nodes)
	load := loads(p)
	for _, v := range vips {
		e := p[v.Addr]
		if v.Mode != L2 {
			continue
		}
		// Balance: no eligible node carries two fewer primaries than this VIP's primary.
		if p := e.Primary(); p != "" {
			for _, q := range eligibleNodes(v, nodes) {
				if load[q]+1 < load[p] {
					t.Fatalf("%s on %s (load %d) while eligible %s has load %d", v.Addr, p, load[p], q, load[q])
				}
			}
		}
	}
}

// checkPlaced checks the rules that hold in every path, balanced or not: every VIP planned in
// its mode, on eligible nodes only, each once; BGP on every eligible node; L2 with a primary
// whenever a node is eligible.
func checkPlaced(t *rapid.T, p Plan, vips []VIP, nodes []Node) {
	for _, v := range vips {
		e, ok := p[v.Addr]
		if !ok || e.Mode != v.Mode {
			t.Fatalf("%s missing or wrong mode: %+v", v.Addr, e)
		}
		elig := eligibleNodes(v, nodes)
		seen := map[string]bool{}
		for _, n := range e.Nodes {
			if !slices.Contains(elig, n) {
				t.Fatalf("%s: %s is not eligible (eligible %v)", v.Addr, n, elig)
			}
			if seen[n] {
				t.Fatalf("%s: %s twice in %v", v.Addr, n, e.Nodes)
			}
			seen[n] = true
		}
		switch v.Mode {
		case BGP:
			if !slices.Equal(e.Nodes, elig) {
				t.Fatalf("BGP %s advertised by %v, want every eligible node %v", v.Addr, e.Nodes, elig)
			}
		case L2:
			if len(elig) > 0 && (len(e.Nodes) == 0 || len(e.Nodes) > 4) {
				t.Fatalf("L2 %s: candidates %v with %d eligible", v.Addr, e.Nodes, len(elig))
			}
		}
	}
}

// checkKept checks that every L2 VIP whose primary in before is still eligible keeps it.
func checkKept(t *rapid.T, before, after Plan, vips []VIP, nodes []Node) {
	for _, v := range vips {
		old := before[v.Addr].Primary()
		if v.Mode == L2 && old != "" && slices.Contains(eligibleNodes(v, nodes), old) && after[v.Addr].Primary() != old {
			t.Fatalf("%s moved from %s, still eligible, to %s", v.Addr, old, after[v.Addr].Primary())
		}
	}
}

func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		p := Compute(nil, vips, nodes, Options{})
		checkPlan(t, p, vips, nodes)
		// Planning again from the plan changes nothing.
		if again := Compute(p, vips, nodes, Options{}); len(Diff(p, again)) != 0 {
			t.Fatalf("replanning moved %v", Diff(p, again))
		}
		// Any change to nodes, or to nodes and VIPs at once: the new plan is valid too.
		vips2, nodes2 := genScenario(t)
		checkPlan(t, Compute(p, vips, nodes2, Options{}), vips, nodes2)
		checkPlan(t, Compute(p, vips2, nodes2, Options{}), vips2, nodes2)
	})
}

// TestAddingANodeMovesFewVIPs: over K nodes all eligible, a balanced plan of N VIPs moves at
// most ceil(N/(K+1)) primaries when a node joins.
func TestAddingANodeMovesFewVIPs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 10).Draw(t, "k")
		n := rapid.IntRange(0, 300).Draw(t, "n")
		vips := vipsN(n, L2)
		before := Compute(nil, vips, nodesN(k), Options{})
		after := Compute(before, vips, nodesN(k+1), Options{})
		moved := 0
		for _, v := range vips {
			if before[v.Addr].Primary() != after[v.Addr].Primary() {
				moved++
			}
		}
		if bound := (n + k) / (k + 1); moved > bound {
			t.Fatalf("%d of %d VIPs moved when node %d of %d joined; bound %d", moved, n, k+1, k+1, bound)
		}
		l := loads(after)
		lo, hi := n, 0
		for i := range k + 1 {
			c := l[fmt.Sprintf("node-%02d", i)]
			lo, hi = min(lo, c), max(hi, c)
		}
		if n > 0 && hi-lo > 1 {
			t.Fatalf("after the join loads range %d..%d", lo, hi)
		}
	})
}

// A node that dies loses its primaries to the others; when it returns it takes back only what
// balance needs.
func TestReturningNodeTakesOnlyWhatBalanceNeeds(t *testing.T) {
	vips := vipsN(30, L2)
	nodes := nodesN(3)
	p1 := Compute(nil, vips, nodes, Options{})
	nodes[1].AgentReachable = false
	p2 := Compute(p1, vips, nodes, Options{})
	if loads(p2)["node-01"] != 0 {
		t.Fatalf("unreachable node kept primaries: %v", loads(p2))
	}
	// Only node-01's VIPs moved.
	for _, v := range vips {
		if p1[v.Addr].Primary() != "node-01" && p1[v.Addr].Primary() != p2[v.Addr].Primary() {
			t.Errorf("%s moved from %s though its node stayed", v.Addr, p1[v.Addr].Primary())
		}
	}
	nodes[1].AgentReachable = true
	p3 := Compute(p2, vips, nodes, Options{})
	if loads(p3)["node-01"] != 10 {
		t.Errorf("returning node got %d primaries, want 10", loads(p3)["node-01"])
	}
	// Every primary that moved went to the returning node: nothing else was shuffled.
	moved := 0
	for _, v := range vips {
		if before, after := p2[v.Addr].Primary(), p3[v.Addr].Primary(); before != after {
			moved++
			if after != "node-01" {
				t.Errorf("%s moved from %s to %s, not to the returning node", v.Addr, before, after)
			}
		}
	}
	if moved != 10 {
		t.Errorf("%d primaries moved when node-01 returned, want the 10 balance needs", moved)
	}
}

func BenchmarkCompute10000VIPs100Nodes(b *testing.B) {
	vips := vipsN(10000, L2)
	nodes := nodesN(100)
	prev := Compute(nil, vips, nodes, Options{})
	for b.Loop() {
		Compute(prev, vips, nodes, Options{})
	}
}

// TestIncrementalMatchesRules drives a Planner with random single changes and checks the plan
// against the same rules as Compute, with balance allowed to drift only by what single
// placements cause (a node change rebalances).
func TestIncrementalMatchesRules(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		p := New(Options{})
		p.SetNodes(nodes)
		current := map[netip.Addr]VIP{}
		for _, v := range vips {
			p.SetVIP(v)
			current[v.Addr] = v
		}
		// A change of the nodes that lets a node take VIPs it could not before rebalances: the
		// full rules hold. Any other keeps every eligible primary.
		_, nodes2 := genScenario(t)
		opens, before := p.opens(nodes2), maps.Clone(p.Plan())
		p.SetNodes(nodes2)
		list := make([]VIP, 0, len(current))
		for _, v := range current {
			list = append(list, v)
		}
		if opens {
			checkPlan(t, p.Plan(), list, nodes2)
		} else {
			checkPlaced(t, p.Plan(), list, nodes2)
			checkKept(t, before, p.Plan(), list, nodes2)
		}
		// Single changes keep every placed node eligible and never touch other VIPs.
		for i, v := range list {
			before := maps.Clone(p.Plan())
			if i%3 == 0 {
				p.DeleteVIP(v.Addr)
			} else {
				v.Local = !v.Local
				p.SetVIP(v)
			}
			for _, d := range Diff(before, p.Plan()) {
				if d != v.Addr {
					t.Fatalf("changing %s changed %s too", v.Addr, d)
				}
			}
			if e, ok := p.Entry(v.Addr); ok {
				elig := eligibleNodes(v, nodes2)
				for _, n := range e.Nodes {
					if !slices.Contains(elig, n) {
						t.Fatalf("%s placed on ineligible %s", v.Addr, n)
					}
				}
			}
		}
	})
}

func BenchmarkSetVIPWith10000Placed(b *testing.B) {
	vips := vipsN(10000, L2)
	p := New(Options{})
	p.SetNodes(nodesN(100))
	for _, v := range vips {
		p.SetVIP(v)
	}
	i := 0
	for b.Loop() {
		v := vips[i%len(vips)]
		v.Local = i%2 == 0
		v.EndpointNodes = []string{"node-01", "node-02"}
		p.SetVIP(v)
		i++
	}
}

// A planner started afresh from what the nodes hold (a new leader) reproduces the plan the
// old one built one change at a time: nothing moves.
func TestResetFromHeldPlanMovesNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		old := New(Options{})
		old.SetNodes(nodes)
		order := rapid.Permutation(vips).Draw(t, "creation order")
		for _, v := range order {
			old.SetVIP(v)
		}
		fresh := New(Options{})
		if changed := fresh.Reset(maps.Clone(old.Plan()), vips, nodes); len(changed) != 0 {
			t.Fatalf("a fresh planner moved %v", changed)
		}
		if d := Diff(old.Plan(), fresh.Plan()); len(d) != 0 {
			t.Fatalf("plans differ at %v", d)
		}
		// And it goes on from there as the old one would.
		if len(vips) > 0 {
			v := vips[0]
			v.Local = !v.Local
			old.SetVIP(v)
			fresh.SetVIP(v)
			if d := Diff(old.Plan(), fresh.Plan()); len(d) != 0 {
				t.Fatalf("after a change the plans differ at %v", d)
			}
		}
	})
}

// Reset against other nodes keeps each primary that is still eligible and places only on
// eligible nodes.
func TestResetKeepsEligiblePrimaries(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		prev := Compute(nil, vips, nodes, Options{})
		_, nodes2 := genScenario(t)
		p := New(Options{})
		p.Reset(prev, vips, nodes2)
		for _, v := range vips {
			e, ok := p.Entry(v.Addr)
			if !ok {
				t.Fatalf("%s not planned", v.Addr)
			}
			elig := eligibleNodes(v, nodes2)
			for _, n := range e.Nodes {
				if !slices.Contains(elig, n) {
					t.Fatalf("%s placed on ineligible %s", v.Addr, n)
				}
			}
			if old := prev[v.Addr].Primary(); v.Mode == L2 && old != "" && slices.Contains(elig, old) && e.Primary() != old {
				t.Fatalf("%s moved from eligible %s to %s", v.Addr, old, e.Primary())
			}
			if v.Mode == L2 && len(elig) > 0 && e.Primary() == "" {
				t.Fatalf("%s has eligible nodes %v but no primary", v.Addr, elig)
			}
		}
	})
}

// groupSpread returns, for each group, max minus min of its primaries over the nodes eligible
// for it (the group's VIPs share their eligibility).
func groupSpread(p Plan, vips []VIP, nodes []Node) map[string]int {
	out := map[string]int{}
	members := map[string][]VIP{}
	for _, v := range vips {
		if v.Group != "" && v.Mode == L2 {
			members[v.Group] = append(members[v.Group], v)
		}
	}
	for g, vs := range members {
		count := map[string]int{}
		for _, v := range vs {
			count[p[v.Addr].Primary()]++
		}
		elig := eligibleNodes(vs[0], nodes)
		if len(elig) == 0 {
			continue
		}
		lo, hi := len(vs), 0
		for _, n := range elig {
			lo, hi = min(lo, count[n]), max(hi, count[n])
		}
		out[g] = hi - lo
	}
	return out
}

func TestGroupsGoToDistinctNodes(t *testing.T) {
	vips := vipsN(9, L2)
	for i := range vips {
		vips[i].Group = fmt.Sprintf("svc-%d", i/3) // three Services of three VIPs
	}
	for _, nodes := range []int{3, 5} {
		p := Compute(nil, vips, nodesN(nodes), Options{})
		for g := range 3 {
			seen := map[string]bool{}
			for _, v := range vips[3*g : 3*g+3] {
				pr := p[v.Addr].Primary()
				if seen[pr] {
					t.Errorf("%d nodes: group svc-%d has two primaries on %s: %v", nodes, g, pr, p)
				}
				seen[pr] = true
			}
		}
	}
	// Two nodes for three VIPs: two on one node, one on the other, never three on one.
	p := Compute(nil, vips[:3], nodesN(2), Options{})
	if s := groupSpread(p, vips[:3], nodesN(2)); s["svc-0"] > 1 {
		t.Errorf("three VIPs over two nodes spread %d: %v", s["svc-0"], p)
	}
}

func TestGroupsSpreadInEveryPath(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		// Group consecutive VIPs with the same eligibility, as one Service's addresses are.
		for i := 0; i < len(vips); {
			n := rapid.IntRange(1, 4).Draw(t, "group size")
			for j := i; j < min(i+n, len(vips)); j++ {
				vips[j].Group = fmt.Sprintf("g%d", i)
				vips[j].Mode, vips[j].NodeSelector, vips[j].Local, vips[j].EndpointNodes = vips[i].Mode, vips[i].NodeSelector, vips[i].Local, vips[i].EndpointNodes
			}
			i += n
		}
		check := func(what string, p Plan, nodes []Node) {
			for g, s := range groupSpread(p, vips, nodes) {
				if s > 1 {
					t.Fatalf("%s: group %s spread %d over its nodes: %v", what, g, s, p)
				}
			}
		}
		full := Compute(nil, vips, nodes, Options{})
		check("Compute", full, nodes)
		inc := New(Options{})
		inc.SetNodes(nodes)
		for _, v := range rapid.Permutation(vips).Draw(t, "order") {
			inc.SetVIP(v)
		}
		check("SetVIP one by one", inc.Plan(), nodes)
		_, nodes2 := genScenario(t)
		opens := inc.opens(nodes2)
		inc.SetNodes(nodes2)
		check("SetNodes", inc.Plan(), nodes2)
		if !opens {
			return // no rebalance: what Compute would move may stay
		}
		again := Compute(inc.Plan(), vips, nodes2, Options{})
		if d := Diff(inc.Plan(), again); len(d) != 0 {
			var g string
			for _, v := range vips {
				if v.Addr == d[0] {
					g = v.Group
					t.Logf("moved %+v", v)
				}
			}
			for _, v := range vips {
				if v.Group == g {
					t.Logf("%s: %v -> %v elig %v", v.Addr, inc.Plan()[v.Addr].Nodes, again[v.Addr].Nodes, eligibleNodes(v, nodes2))
				}
			}
			t.Logf("loads %v -> %v", loads(inc.Plan()), loads(again))
			t.Fatalf("a second plan over the same nodes moves %v", d)
		}
	})
}

// An uneven plan made by single placements (a Cluster VIP placed first, then a Local VIP whose
// only endpoint was on the same node, then an endpoint elsewhere) is kept by a new leader and
// by every node change that lets no node take more: moving a healthy VIP resets its clients'
// connections. Found on real kubelets: a new CCM leader moved a VIP "to keep the nodes
// balanced" on its first node change after taking over. A node joining rebalances.
func TestUnevenPlanMovesOnlyWhenANodeJoins(t *testing.T) {
	nodes := nodesN(3)
	cluster := VIP{Addr: netip.MustParseAddr("203.0.113.1"), Mode: L2}
	local := VIP{Addr: netip.MustParseAddr("203.0.113.2"), Mode: L2, Local: true}
	old := New(Options{})
	old.SetNodes(nodes)
	old.SetVIP(cluster)
	owner := old.Plan()[cluster.Addr].Primary()
	other := "node-00"
	if owner == other {
		other = "node-01"
	}
	local.EndpointNodes = []string{owner}
	old.SetVIP(local)
	local.EndpointNodes = []string{owner, other}
	old.SetVIP(local)
	if p := old.Plan(); p[cluster.Addr].Primary() != owner || p[local.Addr].Primary() != owner {
		t.Fatalf("setup: want both VIPs on %s, plan %v", owner, p)
	}
	held := maps.Clone(old.Plan())

	leader := New(Options{})
	if moved := leader.Reset(held, []VIP{cluster, local}, nodes); len(moved) != 0 {
		t.Fatalf("a new leader's first plan moved %v", moved)
	}
	same := slices.Clone(nodes)
	if moved := leader.SetNodes(same); len(moved) != 0 {
		t.Errorf("the same nodes again moved %v: %v", moved, leader.Plan())
	}
	closed := slices.Clone(nodes)
	for i := range closed {
		if closed[i].Name != owner && closed[i].Name != other {
			closed[i].AgentReachable = false
		}
	}
	leader.SetNodes(closed)
	if p := leader.Plan(); p[cluster.Addr].Primary() != owner || p[local.Addr].Primary() != owner {
		t.Errorf("after node changes that open no node: plan %v, want both on %s", p, owner)
	}

	joined := append(slices.Clone(closed), Node{Name: "node-09", AgentReachable: true, Labels: map[string]string{}})
	leader.SetNodes(joined)
	if p := leader.Plan(); p[cluster.Addr].Primary() == owner && p[local.Addr].Primary() == owner {
		t.Errorf("a node joined and nothing moved off %s, which carries both: %v", owner, p)
	}
}

// A change of the nodes that only closes some (unreachable, excluded, gone) re-places only the
// VIPs that named them, and the plan is exactly what a replan of every VIP without balance
// gives.
func TestClosingNodesMatchesAFullReplan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vips, nodes := genScenario(t)
		p := New(Options{})
		p.SetNodes(nodes)
		for _, v := range rapid.Permutation(vips).Draw(t, "order") {
			p.SetVIP(v)
		}
		var next []Node
		for _, n := range nodes {
			switch rapid.IntRange(0, 5).Draw(t, "fate") {
			case 0:
				continue // gone
			case 1:
				n.AgentReachable = false
			case 2:
				n.Excluded = true
			}
			next = append(next, n)
		}
		if p.opens(next) {
			t.Fatalf("closing nodes counted as opening one")
		}
		before := maps.Clone(p.Plan())
		want := compute(before, vips, next, Options{MaxCandidates: 4}, false)
		changed := p.SetNodes(next)
		if d := Diff(want, p.Plan()); len(d) != 0 {
			for _, a := range d {
				t.Logf("%s: before %v, replan %v, incremental %v", a, before[a].Nodes, want[a].Nodes, p.Plan()[a].Nodes)
			}
			t.Fatalf("closing nodes placed %v otherwise than a replan", d)
		}
		if d := Diff(before, p.Plan()); !slices.Equal(d, changed) {
			t.Fatalf("SetNodes said %v changed, the plans differ at %v", changed, d)
		}
		// And the bookkeeping is a replan's: a new VIP goes where a fresh planner puts it.
		fresh := New(Options{})
		fresh.Reset(maps.Clone(p.Plan()), vips, next)
		extra := VIP{Addr: netip.MustParseAddr("198.51.100.250"), Mode: L2}
		p.SetVIP(extra)
		fresh.SetVIP(extra)
		if a, b := p.Plan()[extra.Addr], fresh.Plan()[extra.Addr]; !slices.Equal(a.Nodes, b.Nodes) {
			t.Fatalf("a VIP added after the change: %v, a fresh planner over the same plan: %v", a.Nodes, b.Nodes)
		}
	})
}
