// Package planner decides which nodes announce each VIP: for an L2 VIP a ranked list of
// candidate nodes (the first live one answers), for a BGP VIP the set of nodes that advertise
// it. It is pure: values in, plan out; no clients, clocks or goroutines.
//
// Rules:
//   - A node is eligible for a VIP when it matches the VIP's node selector, is not excluded
//     (node.kubernetes.io/exclude-from-external-load-balancers), not being deleted or drained
//     by the cluster autoscaler, its agent is reachable, and, for externalTrafficPolicy Local,
//     it runs a ready endpoint of the VIP's Services.
//   - L2 primaries (first candidates) are balanced over the nodes: for VIPs that may use the
//     same nodes, the most and least loaded node differ by at most one. Preferred nodes win
//     ties.
//   - Placement is sticky: a VIP keeps its primary while that stays eligible and balance does
//     not need it to move; a node joining or returning takes only the VIPs balance needs.
//     Balance is restored only then (and by Compute): single placements (a VIP added, its
//     endpoints moved) and other node changes may leave the plan uneven rather than move a
//     VIP whose node is healthy, and a planner started from what the nodes hold (Reset, a
//     new leader) keeps it as it is.
//   - VIPs of one group (the addresses of one Service's family, metalvip.io/vip-count) go to
//     distinct primaries where enough nodes are eligible; this comes before balance.
//   - Standby candidates follow the primary, ranked by a hash of VIP and node (rendezvous
//     hashing), so the VIPs of a failed node spread over the survivors.
//   - BGP VIPs are advertised by every eligible node.
package planner

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/metalvip/metalvip/internal/rendezvous"
)

// Mode is how a VIP is announced.
type Mode uint8

// Modes.
const (
	L2 Mode = iota + 1
	BGP
)

// Node is what the planner needs of a node.
type Node struct {
	Name   string
	Labels map[string]string
	// Unschedulable for load balancers: excluded by label, being deleted, or drained.
	Excluded bool
	// AgentReachable: the CCM can reach the node's agent. Unreachable nodes get no new
	// placements and lose their primaries.
	AgentReachable bool
}

// Selector matches node labels; nil matches every node.
type Selector interface {
	Matches(labels map[string]string) bool
}

// VIP is one address to place.
type VIP struct {
	Addr netip.Addr
	Mode Mode
	// NodeSelector limits the nodes (the pool's announce.nodeSelector); nil: all.
	NodeSelector Selector
	// Preferred nodes win ties when primaries are balanced; nil: none preferred.
	Preferred Selector
	// Local: only EndpointNodes may announce (externalTrafficPolicy: Local).
	Local         bool
	EndpointNodes []string
	// Group names the VIPs that should not share a primary (one Service's addresses of one
	// family); "" is a group of its own.
	Group string
}

// Entry is the plan for one VIP.
type Entry struct {
	Mode Mode
	// Nodes: for L2 the candidates, first is the primary; for BGP the advertising nodes,
	// sorted. Empty when no node is eligible.
	Nodes []string
}

// Primary is the first L2 candidate, or "".
func (e Entry) Primary() string {
	if e.Mode != L2 || len(e.Nodes) == 0 {
		return ""
	}
	return e.Nodes[0]
}

// Plan maps each VIP to its entry.
type Plan map[netip.Addr]Entry

// Options tune the plan.
type Options struct {
	// MaxCandidates caps the L2 candidate list (each candidate exchanges heartbeats with the
	// others); 0 means 4.
	MaxCandidates int
}

// Compute places every VIP over the nodes, keeping as much of prev as balance allows.
// Its cost is O(V log V + V·N) for V VIPs and N nodes.
func Compute(prev Plan, vips []VIP, nodes []Node, opts Options) Plan {
	return compute(prev, vips, nodes, opts, true)
}

// compute is Compute; without balance it keeps every eligible primary of prev as it is (no
// group respread, no rebalance) and places only the VIPs without one.
func compute(prev Plan, vips []VIP, nodes []Node, opts Options, balance bool) Plan {
	if opts.MaxCandidates <= 0 {
		opts.MaxCandidates = 4
	}
	sorted := slices.Clone(vips)
	slices.SortFunc(sorted, func(x, y VIP) int { return x.Addr.Compare(y.Addr) })
	// The nodes in name order once, so that each VIP's eligible nodes come out in that order
	// without a sort of their own: with 1,000 nodes, sorting them again for every one of
	// 20,000 VIPs was a third of a replan.
	byName := slices.Clone(nodes)
	slices.SortStableFunc(byName, func(x, y Node) int { return strings.Compare(x.Name, y.Name) })
	nodeHash := make([]uint64, len(byName))
	for i, n := range byName {
		nodeHash[i] = hashString(n.Name)
	}

	at := make(map[string]int, len(byName))
	for i, n := range byName {
		at[n.Name] = i
	}
	// A VIP's candidates are made when needed, into one buffer, never kept for all VIPs at
	// once: 20,000 VIPs on 1,000 nodes would hold 20 million (640 MB) for a replan.
	var buf []cand
	var idx []int
	eligible := func(i int) []cand {
		v := sorted[i]
		idx = eligibleIndices(v, byName, idx[:0])
		vh := hashAddr(v.Addr)
		buf = buf[:0]
		for _, k := range idx {
			buf = append(buf, cand{name: byName[k].Name, score: mix(vh, nodeHash[k]), preferred: preferred(v, &byName[k])})
		}
		return buf
	}

	plan := make(Plan, len(vips))
	for _, v := range sorted {
		if v.Mode == BGP {
			idx = eligibleIndices(v, byName, idx[:0])
			names := make([]string, len(idx))
			for j, k := range idx {
				names[j] = byName[k].Name
			}
			plan[v.Addr] = Entry{Mode: BGP, Nodes: names}
		}
	}

	// L2 primaries: keep, then fill, then rebalance. A VIP keeps its primary while that is
	// eligible, unless its group is spread unevenly (a node with two more of the group's
	// primaries than another eligible node gives some up).
	load := map[string]int{}
	grp := groups{}
	primary := make([]string, len(sorted))
	for i, v := range sorted {
		if v.Mode != L2 {
			continue
		}
		if p := prev[v.Addr].Primary(); p != "" {
			if k, ok := at[p]; ok && isEligible(v, &byName[k]) {
				primary[i] = p
				grp.add(v.Group, p, 1)
			}
		}
	}
	for i, v := range sorted {
		if p := primary[i]; p != "" {
			// Without a group, no siblings: nothing to compare.
			if sib := grp.of(v.Group); balance && sib != nil && sib[p] > fewestSiblings(eligible(i), sib)+1 {
				primary[i] = ""
				grp.add(v.Group, p, -1)
				continue
			}
			load[p]++
		}
	}
	for i, v := range sorted {
		if v.Mode != L2 || primary[i] != "" {
			continue
		}
		cs := eligible(i)
		if len(cs) == 0 {
			continue
		}
		primary[i] = leastLoaded(cs, load, grp.of(v.Group)).name
		load[primary[i]]++
		grp.add(v.Group, primary[i], 1)
	}
	if balance {
		rebalance(sorted, eligible, primary, load, grp, nodes)
	}

	for i, v := range sorted {
		if v.Mode != L2 {
			continue
		}
		e := Entry{Mode: L2}
		if primary[i] != "" {
			e.Nodes = append(e.Nodes, primary[i])
			e.Nodes = append(e.Nodes, standbys(eligible(i), primary[i], opts.MaxCandidates-1)...)
		}
		plan[v.Addr] = e
	}
	return plan
}

func eligibleNodes(v VIP, nodes []Node) []string {
	idx := eligibleIndices(v, nodes, nil)
	out := make([]string, 0, len(idx))
	for _, k := range idx {
		out = append(out, nodes[k].Name)
	}
	if !slices.IsSorted(out) {
		slices.Sort(out)
	}
	return out
}

// eligibleIndices appends to out the indices of the nodes that may announce v, in the order
// of nodes.
func eligibleIndices(v VIP, nodes []Node, out []int) []int {
	var local map[string]bool
	if v.Local {
		local = make(map[string]bool, len(v.EndpointNodes))
		for _, n := range v.EndpointNodes {
			local[n] = true
		}
	}
	for k := range nodes {
		n := &nodes[k]
		if n.Excluded || !n.AgentReachable {
			continue
		}
		if v.NodeSelector != nil && !v.NodeSelector.Matches(n.Labels) {
			continue
		}
		if v.Local && !local[n.Name] {
			continue
		}
		out = append(out, k)
	}
	return out
}

// isEligible says whether n may announce v (as eligibleIndices decides for all nodes).
func isEligible(v VIP, n *Node) bool {
	return !n.Excluded && n.AgentReachable && (v.NodeSelector == nil || v.NodeSelector.Matches(n.Labels)) &&
		(!v.Local || slices.Contains(v.EndpointNodes, n.Name))
}

func preferred(v VIP, n *Node) bool {
	return v.Preferred != nil && n != nil && v.Preferred.Matches(n.Labels)
}

// cand is a node eligible for a VIP, with its rendezvous score for that VIP.
type cand struct {
	name      string
	score     uint64
	preferred bool
}

// siblings counts, for one group, the primaries on each node; nil for a VIP without a group.
type siblings map[string]int

// leastLoaded picks the node to give a VIP: fewest siblings (VIPs of its group), then lowest
// load, then preferred, then highest score (so that ties do not all go to the same node).
func leastLoaded(cs []cand, load map[string]int, sib siblings) cand {
	best := cs[0]
	for _, c := range cs[1:] {
		sc, sb := sib[c.name], sib[best.name]
		lc, lb := load[c.name], load[best.name]
		switch {
		case sc != sb:
			if sc < sb {
				best = c
			}
		case lc != lb:
			if lc < lb {
				best = c
			}
		case c.preferred != best.preferred:
			if c.preferred {
				best = c
			}
		case c.score > best.score:
			best = c
		}
	}
	return best
}

// fewestSiblings is the least number of siblings on any of cs.
func fewestSiblings(cs []cand, sib siblings) int {
	least := -1
	for _, c := range cs {
		if n := sib[c.name]; least < 0 || n < least {
			least = n
		}
	}
	return max(least, 0)
}

// groups tracks siblings per group.
type groups map[string]siblings

// of returns a group's siblings; nil for "" or a group with no primary yet.
func (g groups) of(group string) siblings {
	if group == "" {
		return nil
	}
	return g[group]
}

func (g groups) add(group, node string, d int) {
	if group == "" || node == "" {
		return
	}
	sib := g[group]
	if sib == nil {
		sib = siblings{}
		g[group] = sib
	}
	sib[node] += d
	if sib[node] <= 0 {
		delete(sib, node)
	}
	if len(sib) == 0 {
		delete(g, group)
	}
}

// standbys returns up to k eligible nodes other than primary, highest score first.
func standbys(cs []cand, primary string, k int) []string {
	top := make([]cand, 0, k+1)
	for _, c := range cs {
		if c.name == primary {
			continue
		}
		// Most candidates score below the k-th kept: no search for them (an equal score
		// still goes through, and in before the kept one, as the search puts it).
		if k > 0 && len(top) == k && c.score < top[k-1].score {
			continue
		}
		i, _ := slices.BinarySearchFunc(top, c, func(a, b cand) int { return cmp.Compare(b.score, a.score) })
		if i >= k {
			continue
		}
		top = slices.Insert(top, i, c)
		if len(top) > k {
			top = top[:k]
		}
	}
	out := make([]string, len(top))
	for i, c := range top {
		out[i] = c.name
	}
	return out
}

// rebalance moves primaries until no VIP sits on a node carrying two or more than another
// node eligible for it. Each move takes a VIP from the most loaded node that can give one, to
// the least loaded node that may take it: donors are never drained below the balance point,
// so a node joining K balanced nodes takes about N/(K+1) VIPs and nothing else moves. Every
// move lowers the sum of squared loads, so the loop ends; it is also bounded.
//
// A donor carrying at most one more than the least loaded node that any VIP may go to cannot
// give: the donors are scanned most loaded first and the scan stops there. Without that bound
// a balanced plan (the usual one) costs a leastLoaded over every VIP's candidates to find
// nothing: 20,000 VIPs on 1,000 nodes, 20 million candidates, on every node change.
func rebalance(vips []VIP, eligible func(i int) []cand, primary []string, load map[string]int, grp groups, nodes []Node) {
	onNode := map[string][]int{}
	for i, v := range vips {
		if v.Mode == L2 && primary[i] != "" {
			onNode[primary[i]] = append(onNode[primary[i]], i)
		}
	}
	// The nodes any VIP may be given to: eligible lists are made of these only.
	var open []string
	for _, n := range nodes {
		if !n.Excluded && n.AgentReachable {
			open = append(open, n.Name)
		}
	}
	for range 2*len(vips) + 1 {
		least := -1
		for _, n := range open {
			if l := load[n]; least < 0 || l < least {
				least = l
			}
		}
		donors := make([]string, 0, len(onNode))
		for n, is := range onNode {
			if len(is) > 0 {
				donors = append(donors, n)
			}
		}
		slices.SortFunc(donors, func(a, b string) int {
			if c := cmp.Compare(load[b], load[a]); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		moved := false
		for _, p := range donors {
			if load[p] <= least+1 {
				break // no node is two below p, nor below any donor after it
			}
			best, bestQ := -1, ""
			for _, i := range onNode[p] {
				sib := grp.of(vips[i].Group)
				q := leastLoaded(eligible(i), load, sib).name
				// A move never puts a VIP with more of its siblings than it leaves.
				if load[q]+1 < load[p] && (sib == nil || sib[q] < sib[p]) && (best < 0 || load[q] < load[bestQ]) {
					best, bestQ = i, q
				}
			}
			if best < 0 {
				continue
			}
			grp.add(vips[best].Group, p, -1)
			grp.add(vips[best].Group, bestQ, 1)
			primary[best] = bestQ
			load[p]--
			load[bestQ]++
			onNode[p] = slices.DeleteFunc(onNode[p], func(i int) bool { return i == best })
			onNode[bestQ] = append(onNode[bestQ], best)
			moved = true
			break
		}
		if !moved {
			return
		}
	}
}

// Score is the rendezvous hash of a VIP and a node: the node with the highest score for a VIP
// is its first standby.
func Score(vip netip.Addr, node string) uint64 { return rendezvous.Score(vip, node) }

var (
	hashAddr   = rendezvous.Addr
	hashString = rendezvous.Node
	mix        = rendezvous.Mix
)

// Diff lists the VIPs whose entry differs between two plans.
func Diff(a, b Plan) []netip.Addr {
	var out []netip.Addr
	for vip, e := range b {
		if o, ok := a[vip]; !ok || o.Mode != e.Mode || !slices.Equal(o.Nodes, e.Nodes) {
			out = append(out, vip)
		}
	}
	for vip := range a {
		if _, ok := b[vip]; !ok {
			out = append(out, vip)
		}
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return out
}

// ForNode returns the entries a node takes part in.
func (p Plan) ForNode(node string) map[netip.Addr]Entry {
	out := map[netip.Addr]Entry{}
	for vip, e := range p {
		if slices.Contains(e.Nodes, node) {
			out[vip] = e
		}
	}
	return out
}

func (e Entry) String() string { return strings.Join(e.Nodes, ",") }
