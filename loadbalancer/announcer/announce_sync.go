package announcer

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// round is what one sync found to redo.
type round struct {
	spec  map[netip.Addr]bool // re-derive the planner input
	entry map[netip.Addr]bool // rebuild the announcement
	nodes map[string]bool     // rebuild the node's state
	parts map[string]bool     // the node's announcements changed (its state surely did)
	conds map[string]bool     // rewrite the Service's condition
	grps  map[string]bool     // re-tell the group's spread
	// egress: an address's egress asks changed (egressClaimRound settles them again).
	egress bool
}

// sync plans what changed and pushes the nodes whose part changed.
func (a *Announcer) sync(ctx context.Context, ch changes) {
	s := &a.loop
	r := round{spec: map[netip.Addr]bool{}, entry: map[netip.Addr]bool{}, nodes: map[string]bool{}, parts: map[string]bool{}, conds: map[string]bool{}, grps: map[string]bool{}}
	if ch.newerTerm > a.agents.Term() {
		a.raiseTerm(ctx, ch.newerTerm)
	}
	if s.set == nil || len(ch.pools) > 0 || ch.peers {
		s.set = a.cfg.Objects.Set()
	}

	// Services: what addresses each shows now.
	if s.first {
		svcs, _ := a.services.List(labels.Everything())
		for _, svc := range svcs {
			ch.services[desired.Key(svc)] = true
		}
	}
	for key := range ch.services {
		a.serviceRound(key, &r)
	}
	// The externalIPs a Service may have depend on the pools and on the LoadBalancer
	// addresses of every other Service: decide them again (they are few).
	if len(ch.services) > 0 || len(ch.pools) > 0 {
		for key := range s.extWant {
			a.serviceRound(key, &r)
		}
	}
	// Pools: the addresses whose pool, or whose pool's spec, changed.
	if len(ch.pools) > 0 {
		for _, ip := range s.pools.replan(s.set, s.shown.services, ch.pools) {
			r.spec[ip] = true
		}
	}
	// Nodes and reachability. A change of reachability alone replans, but rebuilds only the
	// states of the nodes whose part the replan changes (entryRound marks them): no Node
	// object changed, so no other node's head did. Rebuilding and comparing all of them cost
	// the most of the CCM's CPU over a node's death (make bench-scale).
	reach := a.reachRound(ch, &r)
	if ch.nodes {
		s.refreshNodes(a)
		a.agents.SetNodes(ctx, s.addrs)
		a.drainRound(&r)
		for _, n := range s.nodeList {
			r.nodes[n.Name] = true
		}
	}
	dataPlane := a.dataPlaneRound(ch, &r)
	a.reserveRound(ch)
	for ip := range r.spec {
		a.specRound(ip, &r)
	}
	a.egressClaimRound(&r)
	a.planRound(ch.nodes || reach || dataPlane, &r)
	for ip := range r.entry {
		a.entryRound(ip, &r)
	}
	if ch.peers || ch.keys || a.refusals.mayChange(ch.refused) {
		for _, n := range s.nodeList {
			r.nodes[n.Name] = true
		}
	}
	for node, rf := range ch.refused {
		a.refusedRound(node, rf, &r)
	}

	for _, m := range s.cutOff.prune(func(n string) bool { return s.byName[n] != nil }) {
		r.nodes[m] = true
	}

	a.pushRound(&r)

	a.statusRound(ch, reach, &r)
}

func (a *Announcer) service(key string) *v1.Service {
	ns, name, _ := strings.Cut(key, "/")
	svc, err := a.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return svc
}

// serviceRound notes which addresses a Service shows now, and marks those it shows or showed.
func (a *Announcer) serviceRound(key string, r *round) {
	s := &a.loop
	var now []netip.Addr
	svc := a.service(key)
	if svc != nil && a.cfg.Serves.Ours(svc) {
		now = desired.StatusIPs(svc)
	}
	if len(now) == 0 || !desired.Local(svc) {
		// No Local address of ours: no node watches its health check node port.
		for _, n := range s.dataPlane.setPorts(key, 0, nil) {
			r.nodes[n] = true
		}
	}
	if svc != nil && a.cfg.Serves.WantsExternalIPs(svc) {
		s.extWant[key] = true
		ext, refused := a.cfg.Serves.ExternalIPs(svc, s.set, func(ip netip.Addr) string { return a.lbHolder(ip, key) })
		for _, ip := range ext {
			if !slices.Contains(now, ip) {
				now = append(now, ip)
			}
		}
		s.extIPs[key] = ext
		a.externalIPsStatus(svc, ext, refused)
	} else {
		if s.extWant[key] && svc != nil {
			a.externalIPsStatus(svc, nil, nil)
		}
		delete(s.extWant, key)
		delete(s.extIPs, key)
		if svc == nil {
			delete(s.extSaid, key)
		}
	}
	for _, ip := range s.shown.set(key, now) {
		r.spec[ip] = true
	}
	r.conds[key] = true
}

// specRound derives the planner input of one address and gives it to the planner.
func (a *Announcer) specRound(ip netip.Addr, r *round) {
	s := &a.loop
	keys := s.shown.services[ip]
	old, had := s.vips[ip]
	if had && old.Group != "" {
		r.grps[old.Group] = true
	}
	if len(keys) == 0 {
		a.egressRound(ip, nil, nil, r)
		s.dataPlane.setVIP(ip, nil)
		delete(s.vips, ip)
		delete(s.communities, ip)
		s.pools.plan(ip, nil)
		delete(s.weights, ip)
		if had {
			a.removeFromGroup(old.Group, ip)
			if !s.first {
				s.planner.DeleteVIP(ip)
			}
			r.entry[ip] = true
		}
		return
	}
	pool := s.pools.resolve(s.set, ip)
	bgp := pool != nil && pool.Announce.Mode == planner.BGP
	var sharers []desired.Sharer
	var ports []uint32
	var communities []string
	var svcs []*v1.Service
	for _, k := range keys {
		svc := a.service(k)
		if svc == nil {
			continue
		}
		svcs = append(svcs, svc)
		granted, refused := desired.ServiceCommunities(svc, pool)
		communities = append(communities, granted...)
		a.communitiesRefused(svc, refused)
		sh := desired.Sharer{Service: svc}
		if desired.Local(svc) {
			sel := labels.SelectorFromSet(labels.Set{"kubernetes.io/service-name": svc.Name})
			es, _ := a.endpoints.EndpointSlices(svc.Namespace).List(sel)
			sh.EndpointNodes, sh.EndpointCounts = desired.ReadyEndpointNodes(es), desired.ReadyEndpointCounts(es)
			// Each node with an endpoint watches the health check node port (dataPlanes):
			// it joins the BGP announcers once its kube-proxy serves the endpoint there, and
			// stands by for an L2 address after those that serve (entryRound).
			port := uint32(max(svc.Spec.HealthCheckNodePort, 0))
			for _, n := range s.dataPlane.setPorts(k, port, sh.EndpointNodes) {
				r.nodes[n] = true
			}
			if port != 0 {
				ports = append(ports, port)
			}
			if bgp {
				sh.EndpointNodes, sh.EndpointCounts = s.dataPlane.serving(sh.EndpointNodes, sh.EndpointCounts, port, slices.Concat(s.annNodes[ip], s.seed[ip].Nodes))
			}
		}
		sharers = append(sharers, sh)
	}
	s.dataPlane.setVIP(ip, ports)
	a.egressRound(ip, pool, svcs, r)
	slices.Sort(communities)
	if communities = slices.Compact(communities); len(communities) > 0 {
		s.communities[ip] = communities
	} else {
		delete(s.communities, ip)
	}
	v := desired.VIP(ip, sharers, pool)
	if w := desired.Weights(v, sharers, pool); w != nil {
		s.weights[ip] = w
	} else {
		delete(s.weights, ip)
	}
	s.pools.plan(ip, pool)
	s.vips[ip] = v
	if v.Group != old.Group || !had {
		if had {
			a.removeFromGroup(old.Group, ip)
		}
		if v.Group != "" {
			s.groups[v.Group] = append(s.groups[v.Group], ip)
		}
	}
	if v.Group != "" {
		r.grps[v.Group] = true
	}
	if s.first {
		return // the first plan places everything at once
	}
	if !had || !desired.SameVIP(old, v) {
		s.planner.SetVIP(v)
	}
	// The announcement carries the pool's options and the Services' names: rebuild it even
	// when the entry stays (entryRound sends nothing when nothing differs).
	r.entry[ip] = true
}

func (a *Announcer) removeFromGroup(g string, ip netip.Addr) {
	if g == "" {
		return
	}
	s := &a.loop
	s.groups[g] = slices.DeleteFunc(s.groups[g], func(x netip.Addr) bool { return x == ip })
	if len(s.groups[g]) == 0 {
		delete(s.groups, g)
	}
}

// entryRound rebuilds one address's announcement from its plan entry, and the parts of the
// nodes it leaves or joins.
func (a *Announcer) entryRound(ip netip.Addr, r *round) {
	s := &a.loop
	for _, k := range s.shown.services[ip] {
		r.conds[k] = true
	}
	old := s.anns[ip]
	e, ok := s.planner.Entry(ip)
	if ok {
		pool := s.pools.of(ip)
		e = desired.Linger(e, s.vips[ip], s.annNodes[ip], a.lingering,
			pool != nil && pool.Announce.PerClient, pool != nil && pool.VirtualMAC(ip) != "")
		if e.Mode == planner.L2 {
			e.Nodes = s.dataPlane.rank(e.Nodes, ip)
		}
	}
	var next *agentv1.Announcement
	if v, known := s.vips[ip]; ok && known {
		next = desired.Announcement(e, v, s.pools.of(ip), s.shown.services[ip], s.addrOf, s.weights[ip], s.communities[ip])
	}
	// A BGP address with egress makes heartbeat peers of its announcers (egressPeers).
	peered := next.GetBgp() != nil && s.egress[ip].sources != nil
	if old != nil && next != nil && proto.Equal(old, next) && slices.Equal(s.annNodes[ip], e.Nodes) && s.annPeered[ip] == peered {
		return // (a BGP announcement does not name its nodes: compare them apart)
	}
	a.moveEvents(ip, e, ok)
	for n := range s.egress[ip].sources {
		r.nodes[n] = true // whose egress node may change
	}
	for _, n := range s.annNodes[ip] {
		s.part(n).remove(ip)
		r.nodes[n], r.parts[n] = true, true
	}
	if next == nil {
		delete(s.anns, ip)
		delete(s.annNodes, ip)
		delete(s.annPeered, ip)
		return
	}
	s.anns[ip] = next
	s.annNodes[ip] = slices.Clone(e.Nodes)
	if peered {
		s.annPeered[ip] = true
	} else {
		delete(s.annPeered, ip)
	}
	for _, n := range e.Nodes {
		var extra []string
		if peered {
			extra = egressPeers(ip, e.Nodes, n)
		}
		s.part(n).set(ip, next, extra)
		r.nodes[n], r.parts[n] = true, true
	}
}

// egressWatch is how many of a BGP egress address's announcers, first in its egress order,
// every announcer exchanges heartbeats with: the egress node is the first live one of them.
const egressWatch = 3

// egressPeers are the heartbeat peers a BGP address with egress gives its announcer node: the
// first egressWatch announcers in the egress order watch every announcer (one of them takes
// the egress role when those before it die), and every other announcer watches them (it passes
// the replies on to the first live one). The egress node fails over with the heartbeats, not
// with the CCM's next plan; the peers grow with the announcers, not with their square.
func egressPeers(ip netip.Addr, announcers []string, node string) []string {
	order := desired.EgressOrder(ip, announcers)
	top := order[:min(egressWatch, len(order))]
	if slices.Contains(top, node) {
		return order
	}
	return slices.Clone(top)
}

// planRound makes the first plan (keeping what the agents held at start), or replans over
// the nodes when they or their reachability changed.
func (a *Announcer) planRound(nodesChanged bool, r *round) {
	s := &a.loop
	if s.first {
		list := make([]planner.VIP, 0, len(s.vips))
		for _, v := range s.vips {
			list = append(list, v)
		}
		nodes := s.plannerNodes(a.cfg.Drain)
		for n, peers := range wouldBePeers(s.planner.Options(), s.seed, list, nodes) {
			for _, m := range s.cutOff.lost(n, peers) {
				r.nodes[m] = true
			}
		}
		s.planner.Reset(s.seed, list, nodes)
		s.seed, s.first = nil, false
		for ip := range s.vips {
			r.entry[ip] = true
		}
	} else if nodesChanged {
		for _, ip := range s.planner.SetNodes(s.plannerNodes(a.cfg.Drain)) {
			r.entry[ip] = true
		}
	}
}

// statusRound writes what the round changed: Services' conditions and records, groups'
// Events, pools' and peers' conditions, and the Events of takeovers.
func (a *Announcer) statusRound(ch changes, reach bool, r *round) {
	s := &a.loop
	for key := range ch.records {
		r.conds[key] = true
	}
	if ch.allRecords {
		svcs, _ := a.services.List(labels.Everything())
		for _, svc := range svcs {
			r.conds[desired.Key(svc)] = true
		}
	}
	for key := range r.conds {
		a.writeCondition(key)
		a.egressStatus(key)
	}
	for g := range r.grps {
		a.groupEvents(g)
	}
	if ch.nodes || len(ch.pools) > 0 || len(ch.reach) > 0 || len(ch.dataPlane) > 0 {
		a.writePoolConditions()
	}
	if ch.peers || ch.nodes || reach || len(ch.refused) > 0 {
		a.writePeerConditions()
	}
	for node, ss := range ch.sessions {
		s.sessions[node] = ss
	}
	if ch.peers || ch.nodes || len(ch.reach) > 0 || len(ch.sessions) > 0 {
		a.writePeerSessions()
	}
	for _, t := range ch.tookOver {
		a.tookOverEvent(t)
	}
}

// reachRound takes the agents' reachability as the connections found it, and reports whether
// it changed.
func (a *Announcer) reachRound(ch changes, r *round) (changed bool) {
	s := &a.loop
	for n, ok := range ch.reach {
		if s.reachable[n] != ok {
			s.reachable[n] = ok
			changed = true
			// A node cut off keeps as peers, heartbeating it as departing (cutoff.go), the
			// nodes it may take heartbeats from: those of the plan and those of the state it
			// holds (before the first plan, or when the plan already dropped them).
			if !ok {
				peers := append(slices.Collect(maps.Keys(s.part(n).peers)), a.heldPeers(n)...)
				for _, m := range s.cutOff.lost(n, peers) {
					r.nodes[m] = true
				}
			}
		}
		a.writeReachability(n, ok)
	}
	// A node is back only once it holds a state of this leader: reachable again, it may still
	// hold its old one (a push to it can fail, its port filtered again).
	for n := range ch.applied {
		if s.reachable[n] {
			for _, m := range s.cutOff.back(n) {
				r.nodes[m] = true
			}
		}
	}
	return changed
}

// pushRound rebuilds the states of the nodes the round marked and pushes those that changed;
// it forgets the nodes that are gone.
func (a *Announcer) pushRound(r *round) {
	s := &a.loop
	for _, n := range s.nodeList {
		if !r.nodes[n.Name] {
			continue
		}
		head, cs := a.nodeHead(n)
		s.conflicts[n.Name] = cs
		p := s.part(n.Name)
		if s.pushes.due(n.Name, head, p.version) {
			a.agents.Push(n.Name, nodeState{head: head, anns: p.anns.Clone()})
		}
	}
	for _, name := range s.pushes.forget(func(n string) bool { return s.byName[n] != nil }) {
		delete(s.parts, name)
		delete(s.conflicts, name)
		s.dataPlane.forget(name)
	}
}

// nodeHead builds a node's state but its announcements.
func (a *Announcer) nodeHead(n *v1.Node) (*agentv1.DesiredState, []desired.PeerConflict) {
	s := &a.loop
	p := s.part(n.Name)
	peers, conflicts := desired.Peers(n, s.set, a.password)
	st := desired.NodeState(n, nil, peers, slices.Collect(maps.Keys(p.peers)), a.cfg.Options, s.addrOf, a.agents.Keys)
	desired.Departing(st, s.cutOff.departing(n.Name), s.addrOf, a.agents.Keys)
	st.Draining = a.cfg.Drain.Draining(n)
	st.HealthCheckNodePorts = s.dataPlane.portsOf(n.Name)
	st.Egress = a.egressOf(n.Name)
	// The ClusterIP ranges come from every eligible node the peers select (a drained one
	// during its delay, with GRACEFUL_SHUTDOWN).
	if pn := desired.Node(n, s.reachable[n.Name]); !pn.Excluded && (!st.Draining || a.lingering(n.Name)) && len(peers) > 0 {
		if pf := desired.ServicePrefixes(n, s.set); len(pf) > 0 {
			if st.Bgp == nil {
				st.Bgp = &agentv1.BGPOptions{}
			}
			st.Bgp.Prefixes = pf
		}
	}
	return st, conflicts
}

// password returns a peer's password from its Secret, or the last one read when the Secret
// cannot be read now; false when none was ever read (the session stays off, and the peer's
// condition says why).
func (a *Announcer) password(p *pools.Peer) (string, bool) {
	s := &a.loop
	if p.Password.Namespace != a.cfg.PasswordNamespace || a.secrets == nil {
		return "", false
	}
	sec, err := a.secrets.Secrets(p.Password.Namespace).Get(p.Password.Name)
	if err == nil {
		if v, ok := sec.Data[p.Password.Key]; ok && len(v) > 0 {
			s.passwords[p.Name] = string(v)
			return string(v), true
		}
	}
	pw, ok := s.passwords[p.Name]
	return pw, ok
}

// passwordProblem says why a peer's password cannot be read now, or "".
func (a *Announcer) passwordProblem(p *pools.Peer) string {
	ref := p.Password
	if ref == nil {
		return ""
	}
	if ref.Namespace != a.cfg.PasswordNamespace {
		return fmt.Sprintf("spec.passwordSecretRef.namespace %q: BGP password Secrets are read only from namespace %q (cloud-config bgp.passwordSecretNamespace); move the Secret there", ref.Namespace, a.cfg.PasswordNamespace)
	}
	if a.secrets == nil {
		return "no namespace is configured for BGP password Secrets (cloud-config bgp.passwordSecretNamespace)"
	}
	sec, err := a.secrets.Secrets(ref.Namespace).Get(ref.Name)
	switch {
	case err != nil:
		return fmt.Sprintf("Secret %s/%s cannot be read: %v", ref.Namespace, ref.Name, err)
	case len(sec.Data[ref.Key]) == 0:
		return fmt.Sprintf("Secret %s/%s has no key %q", ref.Namespace, ref.Name, ref.Key)
	}
	return ""
}
