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
//   - Standby candidates follow the primary, ranked by a hash of VIP and node (rendezvous
//     hashing), so the VIPs of a failed node spread over the survivors.
//   - BGP VIPs are advertised by every eligible node.
package planner

import (
	"cmp"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"
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
	if opts.MaxCandidates <= 0 {
		opts.MaxCandidates = 4
	}
	byName := make(map[string]*Node, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	sorted := slices.Clone(vips)
	slices.SortFunc(sorted, func(x, y VIP) int { return x.Addr.Compare(y.Addr) })

	plan := make(Plan, len(vips))
	nodeHash := make(map[string]uint64, len(nodes))
	for _, n := range nodes {
		nodeHash[n.Name] = hashString(n.Name)
	}
	eligible := make([][]cand, len(sorted))
	for i, v := range sorted {
		names := eligibleNodes(v, nodes)
		if v.Mode == BGP {
			plan[v.Addr] = Entry{Mode: BGP, Nodes: names}
			continue
		}
		vh := hashAddr(v.Addr)
		cs := make([]cand, len(names))
		for j, n := range names {
			cs[j] = cand{name: n, score: mix(vh, nodeHash[n]), preferred: preferred(v, byName[n])}
		}
		eligible[i] = cs
	}

	// L2 primaries: keep, then fill, then rebalance.
	load := map[string]int{}
	primary := make([]string, len(sorted))
	for i, v := range sorted {
		if v.Mode != L2 {
			continue
		}
		if p := prev[v.Addr].Primary(); p != "" && slices.ContainsFunc(eligible[i], func(c cand) bool { return c.name == p }) {
			primary[i] = p
			load[p]++
		}
	}
	for i, v := range sorted {
		if v.Mode != L2 || primary[i] != "" || len(eligible[i]) == 0 {
			continue
		}
		primary[i] = leastLoaded(eligible[i], load).name
		load[primary[i]]++
	}
	rebalance(sorted, eligible, primary, load)

	for i, v := range sorted {
		if v.Mode != L2 {
			continue
		}
		e := Entry{Mode: L2}
		if primary[i] != "" {
			e.Nodes = append(e.Nodes, primary[i])
			e.Nodes = append(e.Nodes, standbys(eligible[i], primary[i], opts.MaxCandidates-1)...)
		}
		plan[v.Addr] = e
	}
	return plan
}

func eligibleNodes(v VIP, nodes []Node) []string {
	var local map[string]bool
	if v.Local {
		local = make(map[string]bool, len(v.EndpointNodes))
		for _, n := range v.EndpointNodes {
			local[n] = true
		}
	}
	var out []string
	for _, n := range nodes {
		if n.Excluded || !n.AgentReachable {
			continue
		}
		if v.NodeSelector != nil && !v.NodeSelector.Matches(n.Labels) {
			continue
		}
		if v.Local && !local[n.Name] {
			continue
		}
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
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

// leastLoaded picks the node to give a VIP: lowest load, then preferred, then highest score
// (so that ties do not all go to the same node).
func leastLoaded(cs []cand, load map[string]int) cand {
	best := cs[0]
	for _, c := range cs[1:] {
		lc, lb := load[c.name], load[best.name]
		switch {
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

// standbys returns up to k eligible nodes other than primary, highest score first.
func standbys(cs []cand, primary string, k int) []string {
	top := make([]cand, 0, k+1)
	for _, c := range cs {
		if c.name == primary {
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
func rebalance(vips []VIP, eligible [][]cand, primary []string, load map[string]int) {
	onNode := map[string][]int{}
	for i, v := range vips {
		if v.Mode == L2 && primary[i] != "" {
			onNode[primary[i]] = append(onNode[primary[i]], i)
		}
	}
	for range 2*len(vips) + 1 {
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
			best, bestQ := -1, ""
			for _, i := range onNode[p] {
				q := leastLoaded(eligible[i], load).name
				if load[q]+1 < load[p] && (best < 0 || load[q] < load[bestQ]) {
					best, bestQ = i, q
				}
			}
			if best < 0 {
				continue
			}
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
// is its first standby. The agents use the same function for per-client spreading.
func Score(vip netip.Addr, node string) uint64 { return mix(hashAddr(vip), hashString(node)) }

func hashAddr(a netip.Addr) uint64 {
	h := fnv.New64a()
	b := a.As16()
	h.Write(b[:])
	return h.Sum64()
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix combines two hashes (the SplitMix64 finaliser), so that every pair gets an independent
// score cheaply.
func mix(a, b uint64) uint64 {
	z := a ^ (b + 0x9e3779b97f4a7c15 + (a << 6) + (a >> 2))
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

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
