package announcer

import (
	"maps"
	"net/netip"
	"slices"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// refusals is what each node's agent said it refuses, as it last said it: announcements by
// address, BGP peers by address, and a whole state. It owns that and nothing else; only the
// loop calls it.
type refusals struct {
	vips  map[string]map[netip.Addr]*agentv1.Refusal // node -> VIP -> refusal
	peers map[string]map[string]*agentv1.Refusal     // node -> peer address -> refusal
	whole map[string]string                          // node -> why its whole state was refused
}

func newRefusals() *refusals {
	return &refusals{vips: map[string]map[netip.Addr]*agentv1.Refusal{}, peers: map[string]map[string]*agentv1.Refusal{}, whole: map[string]string{}}
}

// mayChange says whether reports may change what the agents refuse. Every Apply answered
// reports its refusals, most often none after none: that is no change, and must not rebuild
// every node's state (after a node's death at 1,000 nodes the pushed agents' answers did so,
// 40% of the CCM's CPU, make bench-scale).
func (r *refusals) mayChange(reports map[string]refusal) bool {
	for node, rf := range reports {
		if len(rf.items) > 0 || rf.whole != "" || len(r.vips[node]) > 0 || len(r.peers[node]) > 0 || r.whole[node] != "" {
			return true
		}
	}
	return false
}

// record takes what node's agent refuses now in place of what it refused, and returns the
// addresses it refused before or refuses now, sorted (their Services' conditions change). An
// item whose key does not parse is left out.
func (r *refusals) record(node string, rf refusal) []netip.Addr {
	touched := slices.Collect(maps.Keys(r.vips[node]))
	vips := map[netip.Addr]*agentv1.Refusal{}
	peers := map[string]*agentv1.Refusal{}
	for _, it := range rf.items {
		switch it.GetKind() {
		case agentv1.Refusal_KIND_ANNOUNCEMENT:
			if ip, err := netip.ParseAddr(it.GetKey()); err == nil {
				vips[ip] = it
				if !slices.Contains(touched, ip) {
					touched = append(touched, ip)
				}
			}
		case agentv1.Refusal_KIND_BGP_PEER:
			peers[it.GetKey()] = it
		}
	}
	r.vips[node], r.peers[node] = vips, peers
	if rf.whole != "" {
		r.whole[node] = rf.whole
	} else {
		delete(r.whole, node)
	}
	slices.SortFunc(touched, netip.Addr.Compare)
	return touched
}

// refusedBy returns the nodes whose agents refuse ip, sorted.
func (r *refusals) refusedBy(ip netip.Addr) []string {
	var out []string
	for node, m := range r.vips {
		if m[ip] != nil {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return out
}
