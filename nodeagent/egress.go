package nodeagent

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// checkedEgress is an egress item of the state, decoded (checkEgress).
type checkedEgress struct {
	*agentv1.Egress
	vip     netip.Addr
	cands   []string
	addrs   []netip.Addr // where to route to each candidate (the VIP's family; invalid: nowhere)
	sources []netip.Addr // this node's pods
	remote  []netip.Addr // other nodes' pods
	cluster []netip.Prefix
	ports   PortRange // a BGP address's reply ports; zero for L2
}

// checkEgress decodes the state's egress items. An item the agent cannot use is the CCM's
// fault, not the Service's: it is left out and named in the problems.
func checkEgress(st *agentv1.DesiredState) (out []checkedEgress, problems []string) {
	seen := map[netip.Addr]bool{}
	claimed := map[netip.Addr]netip.Addr{} // pod -> the VIP of the item that has it
	for i, eg := range st.GetEgress() {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("egress[%d] (%s): %s; its pods leave as before", i, eg.GetVip(), fmt.Sprintf(format, args...)))
		}
		vip, err := netip.ParseAddr(eg.GetVip())
		if err != nil || vip.Zone() != "" || !vip.IsGlobalUnicast() || vip.Is4In6() {
			bad("the VIP is not a unicast IP address")
			continue
		}
		if seen[vip] {
			bad("given twice")
			continue
		}
		seen[vip] = true
		// addrs decodes addresses of the VIP's family ("" too, as none, when empty is true).
		addrs := func(ss []string, empty bool) ([]netip.Addr, error) {
			out := make([]netip.Addr, 0, len(ss))
			for _, s := range ss {
				if s == "" && empty {
					out = append(out, netip.Addr{})
					continue
				}
				a, err := netip.ParseAddr(s)
				if err != nil || a.Is4() != vip.Is4() || a.Zone() != "" || a.Is4In6() {
					return nil, fmt.Errorf("%q is not an address of the VIP's family", s)
				}
				out = append(out, a)
			}
			return out, nil
		}
		c := checkedEgress{Egress: eg, vip: vip}
		if c.sources, err = addrs(eg.GetSources(), false); err != nil {
			bad("sources: %v", err)
			continue
		}
		if c.remote, err = addrs(eg.GetRemoteSources(), false); err != nil {
			bad("remote_sources: %v", err)
			continue
		}
		gateways, err := addrs(eg.GetGateways(), true)
		if err != nil {
			bad("gateways: %v", err)
			continue
		}
		if len(gateways) > 0 && len(gateways) != len(eg.GetCandidates()) {
			bad("%d gateways for %d candidates", len(gateways), len(eg.GetCandidates()))
			continue
		}
		ok := true
		for j, cd := range eg.GetCandidates() {
			a, err := netip.ParseAddr(cd.GetAddress())
			if err != nil || cd.GetNode() == "" {
				bad("candidate %q at %q: a node name and an address are needed", cd.GetNode(), cd.GetAddress())
				ok = false
				break
			}
			// Where to route: the gateway of the VIP's family, or the candidate's own address
			// when of that family; none (the connections are refused) otherwise.
			via := netip.Addr{}
			switch {
			case len(gateways) > 0:
				via = gateways[j]
			case a.Is4() == vip.Is4():
				via = a
			}
			c.cands, c.addrs = append(c.cands, cd.GetNode()), append(c.addrs, via)
		}
		if !ok {
			continue
		}
		if len(c.cands) == 0 {
			bad("no candidates")
			continue
		}
		if rp := eg.GetReplyPorts(); rp != nil {
			// (An ip rule's port range ends at 65534 at most.)
			if rp.GetFirst() < 1024 || rp.GetFirst() > rp.GetLast() || rp.GetLast() > 65534 {
				bad("reply_ports %d-%d: a range of unprivileged ports up to 65534 is needed", rp.GetFirst(), rp.GetLast())
				continue
			}
			c.ports = PortRange{First: uint16(rp.GetFirst()), Last: uint16(rp.GetLast())}
		}
		for _, s := range eg.GetClusterCidrs() {
			p, err := netip.ParsePrefix(s)
			if err != nil || p != p.Masked() {
				bad("cluster_cidrs: %q is not a CIDR", s)
				ok = false
				break
			}
			c.cluster = append(c.cluster, p)
		}
		if !ok {
			continue
		}
		if !slices.ContainsFunc(c.cluster, func(p netip.Prefix) bool { return p.Addr().Is4() == vip.Is4() }) {
			bad("no cluster_cidrs of the VIP's family: every destination would leave from the VIP")
			continue
		}
		// A pod leaves from one address (the CCM settles it): an item that names a pod an
		// earlier one has is left out.
		if i := slices.IndexFunc(slices.Concat(c.sources, c.remote), func(a netip.Addr) bool { _, ok := claimed[a]; return ok }); i >= 0 {
			src := slices.Concat(c.sources, c.remote)[i]
			bad("pod address %s leaves from %s already", src, claimed[src])
			continue
		}
		for _, a := range slices.Concat(c.sources, c.remote) {
			claimed[a] = vip
		}
		out = append(out, c)
	}
	return out, problems
}

// egressNodeLocked returns the egress node of an egress VIP as this node sees it: the first
// candidate that is this node, or that its heartbeats show alive, or that it exchanges none
// with (the CCM vouches for those). Should every candidate be dead, the first: its pods'
// connections then fail rather than leave from their node's address. This node source-NATs
// as soon as the candidates ranked above it are dead, even while its L2 answer still waits for
// a hand-over (replies reach it once it answers; nothing leaves from another address
// meanwhile). Just started and hearing none of its peers yet, this node counts them alive
// (as heardFacts does for L2): a restart does not take the role from a live node. The caller
// holds mu.
func (a *Agent) egressNodeLocked(eg checkedEgress) (string, netip.Addr) {
	unheard := !a.heardAny && time.Now().Before(a.started.Add(a.opts.HearPeerTimeout))
	for i, c := range eg.cands {
		if c == a.opts.Node || a.live == nil || !a.watched[c] || unheard || a.facts.Alive(c) {
			return c, eg.addrs[i]
		}
	}
	return eg.cands[0], eg.addrs[0]
}

// setEgressLocked makes the node's egress configuration that of the state and the heartbeats,
// and notes what it does for each VIP. The caller holds mu.
func (a *Agent) setEgressLocked() {
	if a.opts.Egress == nil {
		return
	}
	var cfg EgressConfig
	cluster := map[netip.Prefix]bool{}
	statuses := make([]*agentv1.EgressStatus, 0, len(a.checked.egress))
	for _, eg := range a.checked.egress {
		st := &agentv1.EgressStatus{Vip: eg.vip.String(), Sources: uint32(len(eg.sources))}
		statuses = append(statuses, st)
		for _, p := range eg.cluster {
			cluster[p] = true
		}
		node, via := a.egressNodeLocked(eg)
		st.Node = node
		if node == a.opts.Node {
			st.Active = true
			cfg.SNAT = append(cfg.SNAT, EgressSNAT{VIP: eg.vip, Sources: slices.Concat(eg.sources, eg.remote), Ports: eg.ports})
			continue
		}
		if !via.IsValid() {
			st.Problem = fmt.Sprintf("the egress node %s has no address of the VIP's family known to the CCM (an InternalIP): this node's pods' connections out are refused rather than sent from their own address", node)
		}
		if len(eg.sources) > 0 {
			cfg.Route = append(cfg.Route, EgressRoute{VIP: eg.vip, Via: via, Sources: eg.sources})
		}
		if !eg.ports.empty() && slices.Contains(eg.cands, a.opts.Node) && via.IsValid() {
			// An announcer of a BGP address: the replies the router hashes here go on to the
			// egress node.
			cfg.Steer = append(cfg.Steer, EgressSteer{VIP: eg.vip, Via: via, Ports: eg.ports})
		}
	}
	for p := range cluster {
		cfg.Cluster = append(cfg.Cluster, p)
	}
	slices.SortFunc(cfg.Cluster, func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) })
	err := a.opts.Egress.Set(cfg)
	a.egressProblem = ""
	if err != nil {
		a.egressProblem = "egress: " + err.Error()
		klog.ErrorS(err, "Egress rules")
	}
	before := map[string]string{}
	for _, st := range a.egress {
		before[st.GetVip()] = st.GetNode()
	}
	for _, now := range statuses {
		if was, ok := before[now.GetVip()]; ok && was != now.GetNode() {
			klog.InfoS("Egress node changed", "vip", now.GetVip(), "from", was, "to", now.GetNode(), "active", now.GetActive())
		}
	}
	a.egress = statuses
}

// egressStatusLocked is GetState's egress: the statuses with the flows counted now. The
// caller holds mu.
func (a *Agent) egressStatusLocked() []*agentv1.EgressStatus {
	if len(a.egress) == 0 {
		return nil
	}
	flows := a.opts.Egress.Flows()
	out := make([]*agentv1.EgressStatus, 0, len(a.egress))
	for _, st := range a.egress {
		c := &agentv1.EgressStatus{Vip: st.GetVip(), Node: st.GetNode(), Active: st.GetActive(), Sources: st.GetSources(), Problem: st.GetProblem()}
		if vip, err := netip.ParseAddr(st.GetVip()); err == nil {
			c.Flows = flows[vip]
		}
		out = append(out, c)
	}
	return out
}
