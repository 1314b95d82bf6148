package planner

import (
	"maps"
	"net/netip"
	"slices"
)

// Planner keeps a plan up to date one change at a time: a VIP added, changed or removed is
// placed alone (O(N log N) for N nodes), without replanning the others; a change to the nodes
// replans everything (Compute), keeping what balance allows. Not safe for concurrent use.
type Planner struct {
	opts   Options
	nodes  []Node
	byName map[string]*Node
	vips   map[netip.Addr]VIP
	plan   Plan
	load   map[string]int
	groups groups
}

// New returns an empty planner.
func New(opts Options) *Planner {
	if opts.MaxCandidates <= 0 {
		opts.MaxCandidates = 4
	}
	return &Planner{opts: opts, byName: map[string]*Node{}, vips: map[netip.Addr]VIP{}, plan: Plan{}, load: map[string]int{}, groups: groups{}}
}

// Options returns the planner's options (defaults filled in).
func (p *Planner) Options() Options { return p.opts }

// Entry returns a VIP's entry.
func (p *Planner) Entry(a netip.Addr) (Entry, bool) {
	e, ok := p.plan[a]
	return e, ok
}

// Plan returns the whole plan; the caller must not change it.
func (p *Planner) Plan() Plan { return p.plan }

// SetNodes replaces the nodes and replans every VIP; it returns the VIPs whose entry changed.
// It rebalances only when a node may now take VIPs it could not take before (it joined,
// returned, was relabelled or is no longer excluded): that node takes what balance needs. Any
// other change keeps every primary that stays eligible, however uneven the plan, and re-places
// only the VIPs whose primary may no longer announce them. Rebalancing on any change would move
// healthy VIPs (and reset their connections) at moments unrelated to them: a plan left uneven
// by single placements was rebalanced by a new CCM leader's first node change after a restart.
func (p *Planner) SetNodes(nodes []Node) []netip.Addr {
	if !p.opens(nodes) {
		return p.close(nodes)
	}
	p.setNodes(nodes)
	vips := make([]VIP, 0, len(p.vips))
	for _, v := range p.vips {
		vips = append(vips, v)
	}
	next := compute(p.plan, vips, p.nodes, p.opts, true)
	changed := Diff(p.plan, next)
	p.plan = next
	p.load, p.groups = map[string]int{}, groups{}
	for a, e := range next {
		if pr := e.Primary(); pr != "" {
			p.load[pr]++
			p.groups.add(p.vips[a].Group, pr, 1)
		}
	}
	return changed
}

// close applies a change of the nodes that lets no node take VIPs it could not take before
// (nodes gone, unreachable or excluded; the others unchanged for the plan): only the VIPs whose
// entry names such a node are placed again, in address order, as a replan without balance
// would place them. A node's death costs its own VIPs' placement, O(N log N) each, instead of
// a replan of every VIP (O(V·N): seconds at 20,000 VIPs on 1,000 nodes).
func (p *Planner) close(nodes []Node) []netip.Addr {
	open := func(n *Node) bool { return !n.Excluded && n.AgentReachable }
	still := make(map[string]bool, len(nodes))
	for i := range nodes {
		if open(&nodes[i]) {
			still[nodes[i].Name] = true
		}
	}
	closed := map[string]bool{}
	for name, n := range p.byName {
		if open(n) && !still[name] {
			closed[name] = true
		}
	}
	p.setNodes(nodes)
	if len(closed) == 0 {
		return nil
	}
	var affected []netip.Addr
	for a, e := range p.plan {
		if slices.ContainsFunc(e.Nodes, func(n string) bool { return closed[n] }) {
			affected = append(affected, a)
		}
	}
	slices.SortFunc(affected, netip.Addr.Compare)
	var changed []netip.Addr
	for _, a := range affected {
		if p.SetVIP(p.vips[a]) {
			changed = append(changed, a)
		}
	}
	return changed
}

// opens reports whether some node of next may take VIPs it could not take among the planner's
// nodes: new, back (reachable, no longer excluded), or with other labels (a selector may match
// it now).
func (p *Planner) opens(next []Node) bool {
	for i := range next {
		n := &next[i]
		if n.Excluded || !n.AgentReachable {
			continue
		}
		o := p.byName[n.Name]
		if o == nil || o.Excluded || !o.AgentReachable || !maps.Equal(o.Labels, n.Labels) {
			return true
		}
	}
	return false
}

// Reset replaces nodes and VIPs at once, for a planner that starts from what the nodes hold
// already (prev): every VIP keeps its primary while that is eligible, even where the full
// rules would rebalance, so starting afresh moves nothing; the others are placed as SetVIP
// would. It returns the VIPs whose entry differs from prev.
func (p *Planner) Reset(prev Plan, vips []VIP, nodes []Node) []netip.Addr {
	p.setNodes(nodes)
	p.vips = make(map[netip.Addr]VIP, len(vips))
	p.plan = make(Plan, len(vips))
	p.load, p.groups = map[string]int{}, groups{}
	sorted := slices.Clone(vips)
	slices.SortFunc(sorted, func(x, y VIP) int { return x.Addr.Compare(y.Addr) })
	var rest []VIP
	for _, v := range sorted {
		p.vips[v.Addr] = v
		old := prev[v.Addr]
		if v.Mode != L2 || old.Mode != L2 || old.Primary() == "" || !slices.Contains(eligibleNodes(v, p.nodes), old.Primary()) {
			rest = append(rest, v)
			continue
		}
		p.plan[v.Addr] = p.place(v, old)
		p.load[old.Primary()]++
		p.groups.add(v.Group, old.Primary(), 1)
	}
	for _, v := range rest {
		p.SetVIP(v)
	}
	return Diff(prev, p.plan)
}

func (p *Planner) setNodes(nodes []Node) {
	p.nodes = slices.Clone(nodes)
	p.byName = make(map[string]*Node, len(p.nodes))
	for i := range p.nodes {
		p.byName[p.nodes[i].Name] = &p.nodes[i]
	}
}

// SetVIP adds or changes one VIP and places it; it reports whether its entry changed.
func (p *Planner) SetVIP(v VIP) bool {
	prev, known := p.vips[v.Addr]
	p.vips[v.Addr] = v
	old, had := p.plan[v.Addr]
	next := p.place(v, old)
	if had && old.Mode == next.Mode && slices.Equal(old.Nodes, next.Nodes) && prev.Group == v.Group {
		return false
	}
	if pr := old.Primary(); pr != "" {
		p.load[pr]--
		if known {
			p.groups.add(prev.Group, pr, -1)
		}
	}
	if pr := next.Primary(); pr != "" {
		p.load[pr]++
		p.groups.add(v.Group, pr, 1)
	}
	p.plan[v.Addr] = next
	return !had || old.Mode != next.Mode || !slices.Equal(old.Nodes, next.Nodes)
}

// DeleteVIP removes a VIP; it reports whether it was there.
func (p *Planner) DeleteVIP(a netip.Addr) bool {
	old, had := p.plan[a]
	if !had {
		return false
	}
	if pr := old.Primary(); pr != "" {
		p.load[pr]--
		p.groups.add(p.vips[a].Group, pr, -1)
	}
	delete(p.plan, a)
	delete(p.vips, a)
	return true
}

func (p *Planner) place(v VIP, old Entry) Entry {
	names := eligibleNodes(v, p.nodes)
	if v.Mode == BGP {
		return Entry{Mode: BGP, Nodes: names}
	}
	e := Entry{Mode: L2}
	if len(names) == 0 {
		return e
	}
	vh := hashAddr(v.Addr)
	cs := make([]cand, len(names))
	for i, n := range names {
		cs[i] = cand{name: n, score: mix(vh, hashString(n)), preferred: preferred(v, p.byName[n])}
	}
	primary := old.Primary()
	if primary == "" || !slices.Contains(names, primary) {
		// The VIP's own old primary does not count against its node when choosing anew.
		load, sib := p.load, p.groups.of(v.Group)
		if pr := old.Primary(); pr != "" {
			load = maps1(p.load, pr)
			if sib != nil {
				sib = maps1(sib, pr)
			}
		}
		primary = leastLoaded(cs, load, sib).name
	}
	e.Nodes = append([]string{primary}, standbys(cs, primary, p.opts.MaxCandidates-1)...)
	return e
}

// maps1 returns a copy of load with one less for node.
func maps1(load map[string]int, node string) map[string]int {
	out := make(map[string]int, len(load))
	for k, v := range load {
		out[k] = v
	}
	out[node]--
	return out
}
