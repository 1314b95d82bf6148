package announcer

import (
	"maps"
	"slices"

	"github.com/metalvip/metalvip/loadbalancer/planner"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// cutOff answers one fact: which nodes keep exchanging heartbeats with a node whose agent this
// CCM cannot reach (agentv1.HeartbeatPeer.departing). The planner drops such a node from every
// candidate list, but the node may be alive, still holding its last state and answering its
// VIPs: only its peers can tell it to stop, and they do by heartbeating it without ever
// counting it alive (the ordered hand-over then keeps it from answering anything it shared
// with them). Its peers are the nodes it exchanged heartbeats with when it was cut off (its
// last state names them), or, after a CCM restart, the reachable nodes whose held states name
// it as a heartbeat peer and those it would share candidate lists with were it reachable
// (wouldBePeers). A node reachable again, or gone, has none.
type cutOff struct {
	peers map[string]map[string]bool // cut-off node -> the nodes that heartbeat it
}

func newCutOff() cutOff { return cutOff{peers: map[string]map[string]bool{}} }

// lost records that node's agent is unreachable; heartbeating are the nodes it exchanged
// heartbeats with (its candidate peers in the last plan). It returns the nodes whose states
// change.
func (c cutOff) lost(node string, heartbeating []string) []string {
	set := c.peers[node]
	if set == nil {
		set = map[string]bool{}
	}
	for _, n := range heartbeating {
		if n != node {
			set[n] = true
		}
	}
	if len(set) == 0 {
		delete(c.peers, node)
		return nil
	}
	c.peers[node] = set
	return slices.Sorted(maps.Keys(set))
}

// back records that node's agent is reachable again (or the node is gone): its peers stop
// heartbeating it as departing (the plan decides again whether they are its candidates). It
// returns the nodes whose states change.
func (c cutOff) back(node string) []string {
	set := c.peers[node]
	delete(c.peers, node)
	return slices.Sorted(maps.Keys(set))
}

// seed rebuilds the record at a CCM's start from what the reachable agents hold: a node
// unreachable now that a held state names as a heartbeat peer (departing or not) keeps that
// holder as its peer.
func (c cutOff) seed(held map[string]*agentv1.DesiredState, reachable func(node string) bool) {
	for holder, st := range held {
		for _, p := range st.GetHeartbeatPeers() {
			if n := p.GetNode(); n != holder && !reachable(n) {
				c.lost(n, []string{holder})
			}
		}
	}
}

// wouldBePeers returns, for each node whose agent is unreachable among nodes, the nodes it
// would share L2 candidate lists with were it reachable: those of the plan from seed with every
// node reachable. A node cut off before a new leader's first plan has no part in any plan of
// this leader to take its peers from, and the reachable nodes' states may not name it either
// (a node restarted on no saved state names no peer): without peers heartbeating it as
// departing, it hears none of them, counts them dead and answers what it holds beside their
// new owners (the soak's seed 7: an ETP Local VIP whose one other candidate had restarted on
// a read-only disk, 3.3 s).
func wouldBePeers(opts planner.Options, seed planner.Plan, vips []planner.VIP, nodes []planner.Node) map[string][]string {
	var cut []string
	all := slices.Clone(nodes)
	for i := range all {
		if !all[i].AgentReachable {
			cut = append(cut, all[i].Name)
			all[i].AgentReachable = true
		}
	}
	if len(cut) == 0 {
		return nil
	}
	p := planner.New(opts)
	p.Reset(seed, vips, all)
	out := map[string][]string{}
	for _, e := range p.Plan() {
		if e.Mode != planner.L2 {
			continue
		}
		for _, n := range cut {
			if !slices.Contains(e.Nodes, n) {
				continue
			}
			for _, m := range e.Nodes {
				if m != n && !slices.Contains(out[n], m) {
					out[n] = append(out[n], m)
				}
			}
		}
	}
	return out
}

// departing returns the cut-off nodes that node heartbeats, sorted.
func (c cutOff) departing(node string) []string {
	var out []string
	for n, set := range c.peers {
		if set[node] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// prune forgets nodes that are gone, as cut off and as peers; it returns the nodes whose
// states change.
func (c cutOff) prune(exists func(node string) bool) []string {
	changed := map[string]bool{}
	for n, set := range c.peers {
		if !exists(n) {
			for _, p := range c.back(n) {
				changed[p] = true
			}
			continue
		}
		for p := range set {
			if !exists(p) {
				delete(set, p)
			}
		}
		if len(set) == 0 {
			delete(c.peers, n)
		}
	}
	return slices.Sorted(maps.Keys(changed))
}
