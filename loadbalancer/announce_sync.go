package loadbalancer

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// loopState is what the announcer's loop knows between rounds. Only the loop touches it.
type loopState struct {
	first bool         // no full plan made yet
	seed  planner.Plan // what the agents held at start, for the first plan

	set       *pools.Set
	nodeList  []*v1.Node
	byName    map[string]*v1.Node
	addrs     map[string]netip.Addr
	reachable map[string]bool
	planner   *planner.Planner

	svcAddrs map[string][]netip.Addr          // Service -> addresses its status shows, and its externalIPs announced
	extIPs   map[string][]netip.Addr          // Service -> its externalIPs announced (also in svcAddrs)
	extWant  map[string]bool                  // Services that ask for their externalIPs to be announced
	extSaid  map[string]string                // Service -> its ExternalIPs condition last set (text form)
	vipSvcs  map[netip.Addr][]string          // address -> Services showing it, sorted
	vips     map[netip.Addr]planner.VIP       // what the planner was given
	vipPool  map[netip.Addr]*pools.Pool       // the address's pool (nil: none)
	weights  map[netip.Addr]map[string]uint32 // BGP VIPs weighted by endpoints: node -> weight
	anns     map[netip.Addr]*agentv1.Announcement
	annNodes map[netip.Addr][]string // the nodes each announcement was given to
	parts    map[string]*nodePart    // node -> its announcements
	groups   map[string][]netip.Addr // group -> member addresses
	states   map[string]pushed

	conds       map[string]string                          // Service -> condition last set (its text form)
	primaries   map[netip.Addr]string                      // last primary per L2 VIP, for Moved Events
	noNode      map[netip.Addr]bool                        // VIPs told to have no eligible node
	groupMsg    map[string]string                          // last VIPsShareNodes message per group
	refused     map[string]map[netip.Addr]*agentv1.Refusal // node -> VIP -> refusal
	peerRefused map[string]map[string]*agentv1.Refusal     // node -> peer address -> refusal
	whole       map[string]string                          // node -> why its whole state was refused
	warned      map[string]string                          // "kind/key" -> last warning given
	passwords   map[string]string                          // peer -> last password read
	statusSet   map[string]string                          // pool/peer/node status last set (text form)
	conflicts   map[string][]desired.PeerConflict          // node -> peers left off it
	sessions    map[string][]*agentv1.PeerStatus           // node -> its BGP sessions, as its agent reported them
	drainSince  map[string]time.Time                       // node -> when its drain began (as this CCM saw it)
	drainEnded  map[string]bool                            // nodes whose drain delay is over
	drainTimers map[string]*time.Timer                     // wake the loop at the end of a drain's delay
}

// nodePart is one node's announcements, ordered by VIP in a copy-on-write tree (a snapshot
// for the push costs nothing, a change O(log n)), and how many of its L2 VIPs each other node
// is a candidate of (its heartbeat peers).
type nodePart struct {
	anns    *btree.BTreeG[annItem]
	peers   map[string]int
	version uint64
}

type annItem struct {
	ip netip.Addr
	an *agentv1.Announcement
}

func annLess(a, b annItem) bool { return a.ip.Less(b.ip) }

// nodeState is what a node is pushed: everything but the announcements in head, and a
// snapshot of the announcements, put together only when sent.
type nodeState struct {
	head *agentv1.DesiredState
	anns *btree.BTreeG[annItem]
}

// Build puts the state together.
func (n nodeState) Build() *agentv1.DesiredState {
	st := proto.Clone(n.head).(*agentv1.DesiredState)
	st.Announcements = make([]*agentv1.Announcement, 0, n.anns.Len())
	n.anns.Ascend(func(it annItem) bool {
		st.Announcements = append(st.Announcements, it.an)
		return true
	})
	return st
}

// pushed is what a node was last pushed.
type pushed struct {
	head    *agentv1.DesiredState
	version uint64
}

func newLoopState(maxCandidates int) loopState {
	return loopState{
		first:       true,
		planner:     planner.New(planner.Options{MaxCandidates: maxCandidates}),
		byName:      map[string]*v1.Node{},
		addrs:       map[string]netip.Addr{},
		reachable:   map[string]bool{},
		svcAddrs:    map[string][]netip.Addr{},
		extIPs:      map[string][]netip.Addr{},
		extWant:     map[string]bool{},
		extSaid:     map[string]string{},
		vipSvcs:     map[netip.Addr][]string{},
		vips:        map[netip.Addr]planner.VIP{},
		vipPool:     map[netip.Addr]*pools.Pool{},
		weights:     map[netip.Addr]map[string]uint32{},
		anns:        map[netip.Addr]*agentv1.Announcement{},
		annNodes:    map[netip.Addr][]string{},
		parts:       map[string]*nodePart{},
		groups:      map[string][]netip.Addr{},
		states:      map[string]pushed{},
		conds:       map[string]string{},
		primaries:   map[netip.Addr]string{},
		noNode:      map[netip.Addr]bool{},
		groupMsg:    map[string]string{},
		refused:     map[string]map[netip.Addr]*agentv1.Refusal{},
		peerRefused: map[string]map[string]*agentv1.Refusal{},
		whole:       map[string]string{},
		warned:      map[string]string{},
		passwords:   map[string]string{},
		statusSet:   map[string]string{},
		conflicts:   map[string][]desired.PeerConflict{},
		sessions:    map[string][]*agentv1.PeerStatus{},
		drainSince:  map[string]time.Time{},
		drainEnded:  map[string]bool{},
		drainTimers: map[string]*time.Timer{},
	}
}

// refreshNodes lists the nodes again.
func (s *loopState) refreshNodes(a *Announcer) {
	list, err := a.nodes.List(labels.Everything())
	if err != nil {
		klog.ErrorS(err, "List Nodes")
		return
	}
	slices.SortFunc(list, func(x, y *v1.Node) int { return strings.Compare(x.Name, y.Name) })
	s.nodeList = list
	s.byName = make(map[string]*v1.Node, len(list))
	s.addrs = make(map[string]netip.Addr, len(list))
	for _, n := range list {
		s.byName[n.Name] = n
		s.addrs[n.Name] = desired.NodeAddress(n)
	}
}

func (s *loopState) addrOf(node string) netip.Addr { return s.addrs[node] }

func (s *loopState) plannerNodes(d desired.Drain) []planner.Node {
	out := make([]planner.Node, 0, len(s.nodeList))
	for _, n := range s.nodeList {
		out = append(out, s.plannerNode(n, d))
	}
	return out
}

// plannerNode is what the planner knows of a node: a node being drained takes nothing (what
// it announces lingers for the drain's delay, see drainRound).
func (s *loopState) plannerNode(n *v1.Node, d desired.Drain) planner.Node {
	pn := desired.Node(n, s.reachable[n.Name])
	pn.Excluded = pn.Excluded || d.Draining(n)
	return pn
}

// round is what one sync found to redo.
type round struct {
	spec  map[netip.Addr]bool // re-derive the planner input
	entry map[netip.Addr]bool // rebuild the announcement
	nodes map[string]bool     // rebuild the node's state
	parts map[string]bool     // the node's announcements changed (its state surely did)
	conds map[string]bool     // rewrite the Service's condition
	grps  map[string]bool     // re-tell the group's spread
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
		for ip := range s.vipSvcs {
			p := a.poolFor(ip)
			if p != s.vipPool[ip] || p != nil && ch.pools[p.Name] {
				r.spec[ip] = true
			}
		}
	}
	// Nodes and reachability. A change of reachability alone replans, but rebuilds only the
	// states of the nodes whose part the replan changes (entryRound marks them): no Node
	// object changed, so no other node's head did. Rebuilding and comparing all of them cost
	// 58% of the CCM's CPU over a node's death at 1,000 nodes (make bench-scale).
	reach := false
	for n, ok := range ch.reach {
		if s.reachable[n] != ok {
			s.reachable[n] = ok
			reach = true
		}
		a.writeReachability(n, ok)
	}
	if ch.nodes {
		s.refreshNodes(a)
		a.agents.SetNodes(ctx, s.addrs)
		a.drainRound(&r)
		for _, n := range s.nodeList {
			r.nodes[n.Name] = true
		}
	}
	for ip := range r.spec {
		a.specRound(ip, &r)
	}
	if s.first {
		list := make([]planner.VIP, 0, len(s.vips))
		for _, v := range s.vips {
			list = append(list, v)
		}
		s.planner.Reset(s.seed, list, s.plannerNodes(a.cfg.Drain))
		s.seed, s.first = nil, false
		for ip := range s.vips {
			r.entry[ip] = true
		}
	} else if ch.nodes || reach {
		for _, ip := range s.planner.SetNodes(s.plannerNodes(a.cfg.Drain)) {
			r.entry[ip] = true
		}
	}
	for ip := range r.entry {
		a.entryRound(ip, &r)
	}
	if ch.peers || ch.keys || a.refusalsChanged(ch.refused) {
		for _, n := range s.nodeList {
			r.nodes[n.Name] = true
		}
	}
	for node, rf := range ch.refused {
		a.refusedRound(node, rf, &r)
	}

	// Push the nodes whose state changed.
	for _, n := range s.nodeList {
		if !r.nodes[n.Name] {
			continue
		}
		head, cs := a.nodeHead(n)
		s.conflicts[n.Name] = cs
		p := s.part(n.Name)
		if last, ok := s.states[n.Name]; ok && last.version == p.version && proto.Equal(last.head, head) {
			continue // rebuilt for its peers or keys, which did not change
		}
		s.states[n.Name] = pushed{head, p.version}
		a.agents.Push(n.Name, nodeState{head: head, anns: p.anns.Clone()})
	}
	for name := range s.states {
		if _, ok := s.byName[name]; !ok {
			delete(s.states, name)
			delete(s.parts, name)
			delete(s.conflicts, name)
		}
	}

	for key := range r.conds {
		a.writeCondition(key)
	}
	for g := range r.grps {
		a.groupEvents(g)
	}
	if ch.nodes || len(ch.pools) > 0 || len(ch.reach) > 0 {
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

// poolFor returns the pool of an address: the one its first Service's allocation record
// names, else the one holding it.
func (a *Announcer) poolFor(ip netip.Addr) *pools.Pool {
	s := &a.loop
	recorded := ""
	if keys := s.vipSvcs[ip]; len(keys) > 0 {
		if svc := a.service(keys[0]); svc != nil {
			recorded, _ = annotation.AllocatedPool.Value(svc)
		}
	}
	return s.set.PoolOf(recorded, ip)
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
	old := s.svcAddrs[key]
	for _, ip := range old {
		r.spec[ip] = true
		if !slices.Contains(now, ip) {
			s.vipSvcs[ip] = slices.DeleteFunc(s.vipSvcs[ip], func(k string) bool { return k == key })
			if len(s.vipSvcs[ip]) == 0 {
				delete(s.vipSvcs, ip)
			}
		}
	}
	for _, ip := range now {
		r.spec[ip] = true
		if !slices.Contains(s.vipSvcs[ip], key) {
			s.vipSvcs[ip] = append(s.vipSvcs[ip], key)
			slices.Sort(s.vipSvcs[ip])
		}
	}
	if len(now) == 0 {
		delete(s.svcAddrs, key)
	} else {
		s.svcAddrs[key] = now
	}
	r.conds[key] = true
}

// specRound derives the planner input of one address and gives it to the planner.
func (a *Announcer) specRound(ip netip.Addr, r *round) {
	s := &a.loop
	keys := s.vipSvcs[ip]
	old, had := s.vips[ip]
	if had && old.Group != "" {
		r.grps[old.Group] = true
	}
	if len(keys) == 0 {
		delete(s.vips, ip)
		delete(s.vipPool, ip)
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
	var sharers []desired.Sharer
	for _, k := range keys {
		svc := a.service(k)
		if svc == nil {
			continue
		}
		sh := desired.Sharer{Service: svc}
		if desired.Local(svc) {
			sel := labels.SelectorFromSet(labels.Set{"kubernetes.io/service-name": svc.Name})
			es, _ := a.endpoints.EndpointSlices(svc.Namespace).List(sel)
			sh.EndpointNodes = desired.ReadyEndpointNodes(es)
			sh.EndpointCounts = desired.ReadyEndpointCounts(es)
		}
		sharers = append(sharers, sh)
	}
	pool := a.poolFor(ip)
	v := desired.VIP(ip, sharers, pool)
	if w := desired.Weights(v, sharers, pool); w != nil {
		s.weights[ip] = w
	} else {
		delete(s.weights, ip)
	}
	poolChanged := s.vipPool[ip] != pool
	s.vipPool[ip] = pool
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
	_ = poolChanged
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
	for _, k := range s.vipSvcs[ip] {
		r.conds[k] = true
	}
	old := s.anns[ip]
	e, ok := s.planner.Entry(ip)
	if ok {
		pool := s.vipPool[ip]
		e = desired.Linger(e, s.vips[ip], s.annNodes[ip], a.lingering,
			pool != nil && pool.Announce.PerClient, pool != nil && pool.VirtualMAC(ip) != "")
	}
	var next *agentv1.Announcement
	if v, known := s.vips[ip]; ok && known {
		next = desired.Announcement(e, v, s.vipPool[ip], s.vipSvcs[ip], s.addrOf, s.weights[ip])
	}
	if old != nil && next != nil && proto.Equal(old, next) && slices.Equal(s.annNodes[ip], e.Nodes) {
		return // (a BGP announcement does not name its nodes: compare them apart)
	}
	a.moveEvents(ip, e, ok)
	for _, n := range s.annNodes[ip] {
		s.part(n).remove(ip)
		r.nodes[n], r.parts[n] = true, true
	}
	if next == nil {
		delete(s.anns, ip)
		delete(s.annNodes, ip)
		return
	}
	s.anns[ip] = next
	s.annNodes[ip] = slices.Clone(e.Nodes)
	for _, n := range e.Nodes {
		s.part(n).set(ip, next)
		r.nodes[n], r.parts[n] = true, true
	}
}

func (s *loopState) part(node string) *nodePart {
	p := s.parts[node]
	if p == nil {
		p = &nodePart{anns: btree.NewG(32, annLess), peers: map[string]int{}}
		s.parts[node] = p
	}
	return p
}

// set puts an announcement in the part.
func (p *nodePart) set(ip netip.Addr, an *agentv1.Announcement) {
	if old, found := p.anns.ReplaceOrInsert(annItem{ip, an}); found {
		p.unpeer(old.an)
	}
	for _, c := range an.GetL2().GetCandidates() {
		p.peers[c.GetNode()]++
	}
	p.version++
}

// remove takes a VIP's announcement out of the part.
func (p *nodePart) remove(ip netip.Addr) {
	if old, found := p.anns.Delete(annItem{ip: ip}); found {
		p.unpeer(old.an)
		p.version++
	}
}

func (p *nodePart) unpeer(an *agentv1.Announcement) {
	for _, c := range an.GetL2().GetCandidates() {
		if p.peers[c.GetNode()]--; p.peers[c.GetNode()] <= 0 {
			delete(p.peers, c.GetNode())
		}
	}
}

// nodeHead builds a node's state but its announcements.
func (a *Announcer) nodeHead(n *v1.Node) (*agentv1.DesiredState, []desired.PeerConflict) {
	s := &a.loop
	p := s.part(n.Name)
	peers, conflicts := desired.Peers(n, s.set, a.password)
	st := desired.NodeState(n, nil, peers, slices.Collect(maps.Keys(p.peers)), a.cfg.Options, s.addrOf, a.agents.Keys)
	st.Draining = a.cfg.Drain.Draining(n)
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

// refusalsChanged says whether what the agents said they refused may differ from what they
// said before. Every Apply answered reports its refusals, most often none after none: that is
// no change, and must not rebuild every node's state (after a node's death at 1,000 nodes the
// pushed agents' answers did so, 40% of the CCM's CPU, make bench-scale).
func (a *Announcer) refusalsChanged(ch map[string]refusal) bool {
	s := &a.loop
	for node, rf := range ch {
		if len(rf.items) > 0 || rf.whole != "" || len(s.refused[node]) > 0 || len(s.peerRefused[node]) > 0 || s.whole[node] != "" {
			return true
		}
	}
	return false
}

// refusedRound records what a node's agent refused.
func (a *Announcer) refusedRound(node string, rf refusal, r *round) {
	s := &a.loop
	prev := s.refused[node]
	next := map[netip.Addr]*agentv1.Refusal{}
	peers := map[string]*agentv1.Refusal{}
	for _, it := range rf.items {
		switch it.GetKind() {
		case agentv1.Refusal_KIND_ANNOUNCEMENT:
			if ip, err := netip.ParseAddr(it.GetKey()); err == nil {
				next[ip] = it
			}
		case agentv1.Refusal_KIND_BGP_PEER:
			peers[it.GetKey()] = it
		}
	}
	for ip := range prev {
		if _, still := next[ip]; !still {
			for _, k := range s.vipSvcs[ip] {
				r.conds[k] = true
			}
		}
	}
	for ip, it := range next {
		for _, k := range s.vipSvcs[ip] {
			r.conds[k] = true
			a.warnOnce("svc-refused/"+k+"/"+ip.String()+"/"+node, it.GetField()+it.GetReason(), func() {
				if svc := a.service(k); svc != nil {
					a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonAnnouncementRefused,
						"The agent on %s refused the announcement of %s: %s: %s", node, ip, it.GetField(), it.GetReason())
				}
			})
		}
	}
	s.refused[node] = next
	s.peerRefused[node] = peers
	if rf.whole != "" {
		s.whole[node] = rf.whole
		klog.ErrorS(nil, "Agent refused the whole state", "node", node, "reason", rf.whole)
	} else {
		delete(s.whole, node)
	}
}

// warnOnce runs emit unless the same warning (key, what) was the last given.
func (a *Announcer) warnOnce(key, what string, emit func()) {
	if a.loop.warned[key] == what {
		return
	}
	a.loop.warned[key] = what
	emit()
}

// moveEvents tells a VIP's Services when its primary moves, and when no node may announce it.
func (a *Announcer) moveEvents(ip netip.Addr, e planner.Entry, ok bool) {
	s := &a.loop
	svcs := s.vipSvcs[ip]
	if !ok {
		delete(s.primaries, ip)
		delete(s.noNode, ip)
		return
	}
	if len(e.Nodes) == 0 {
		if !s.noNode[ip] {
			s.noNode[ip] = true
			for _, k := range svcs {
				if svc := a.service(k); svc != nil {
					a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonNoEligibleNode,
						"No node may announce %s: none is eligible (the pool's node selector, nodes labelled %s, unreachable agents, or no ready local endpoint); see the pool's NodesEligible condition", ip, desired.LabelExcludeLB)
				}
			}
		}
		return
	}
	delete(s.noNode, ip)
	if e.Mode != planner.L2 {
		return
	}
	prev, next := s.primaries[ip], e.Primary()
	s.primaries[ip] = next
	if prev == "" || prev == next {
		return
	}
	why := "to keep the nodes balanced"
	if !slices.Contains(e.Nodes, prev) {
		why = prev + " may no longer announce it: excluded, its agent unreachable, or no local endpoint"
	}
	for _, k := range svcs {
		if svc := a.service(k); svc != nil {
			a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, ReasonMoved, "%s moved from %s to %s: %s", ip, prev, next, why)
		}
	}
}

// groupEvents says, once per change, when a Service's several addresses of one family share
// primary nodes (fewer eligible nodes than addresses), and when they no longer do.
func (a *Announcer) groupEvents(g string) {
	s := &a.loop
	ips := slices.Clone(s.groups[g])
	if len(ips) == 0 {
		delete(s.groupMsg, g)
		return
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	byNode := map[string][]string{}
	var nodes []string
	for _, ip := range ips {
		e, _ := s.planner.Entry(ip)
		pr := e.Primary()
		if pr == "" {
			continue
		}
		if byNode[pr] == nil {
			nodes = append(nodes, pr)
		}
		byNode[pr] = append(byNode[pr], ip.String())
	}
	slices.Sort(nodes)
	var shared []string
	for _, n := range nodes {
		if len(byNode[n]) > 1 {
			shared = append(shared, strings.Join(byNode[n], " and ")+" on "+n)
		}
	}
	msg, reason, kind := "", "", v1.EventTypeNormal
	switch {
	case len(shared) > 0:
		reason, kind = ReasonVIPsShareNodes, v1.EventTypeWarning
		msg = fmt.Sprintf("%d addresses on %d nodes: fewer nodes are eligible than addresses, so some share a node (%s); they spread when more nodes become eligible", len(ips), len(nodes), strings.Join(shared, "; "))
	case s.groupMsg[g] != "":
		reason = ReasonVIPsSpread
		msg = fmt.Sprintf("%d addresses on %d distinct nodes", len(ips), len(nodes))
	}
	if msg == "" || s.groupMsg[g] == msg {
		return
	}
	if reason == ReasonVIPsSpread {
		delete(s.groupMsg, g)
	} else {
		s.groupMsg[g] = msg
	}
	if keys := s.vipSvcs[ips[0]]; len(keys) > 0 {
		if svc := a.service(keys[0]); svc != nil {
			a.cfg.Recorder.Eventf(svc, kind, reason, "%s", msg)
		}
	}
}

// tookOverEvent turns an agent's take-over into an Event on the Services of the VIP, when it
// is a failover: the planned first candidate beginning to answer a new VIP says nothing the
// Announced condition does not (and would cost a write per Service).
func (a *Announcer) tookOverEvent(t tookOver) {
	vip, err := netip.ParseAddr(t.ev.GetVip())
	if err != nil {
		return
	}
	if e, ok := a.loop.planner.Entry(vip); ok && (e.Mode != planner.L2 || e.Primary() == t.node || a.loop.vipPool[vip] != nil && a.loop.vipPool[vip].Announce.PerClient) {
		return
	}
	for _, k := range a.loop.vipSvcs[vip] {
		if svc := a.service(k); svc != nil {
			a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, ReasonTookOver, "Node %s answers for %s now: %s", t.node, vip, t.ev.GetDetail())
		}
	}
}

// raiseTerm raises this leader's term above what an agent holds, through the Lease.
func (a *Announcer) raiseTerm(ctx context.Context, above uint64) {
	t, err := a.fence.Raise(ctx, above)
	if err != nil {
		klog.ErrorS(err, "An agent holds a newer term than this leader's, and raising the term failed; retrying on the next refusal", "held", above, "term", a.agents.Term())
		return
	}
	klog.InfoS("Raised the term above one an agent held", "held", above, "term", t)
	a.agents.SetTerm(t)
}

// seedPlan is the plan the agents' states describe: for each L2 VIP the candidates of the
// newest state (highest term; within a term, generations count per node, so the primary's
// own copy wins), for a BGP VIP the nodes that advertise it.
func seedPlan(held map[string]*agentv1.DesiredState) planner.Plan {
	type source struct {
		term    uint64
		primary bool
	}
	plan := planner.Plan{}
	from := map[netip.Addr]source{}
	for _, node := range slices.Sorted(maps.Keys(held)) {
		st := held[node]
		for _, an := range st.GetAnnouncements() {
			ip, err := netip.ParseAddr(an.GetVip())
			if err != nil {
				continue
			}
			if an.GetMode() == agentv1.Mode_MODE_BGP {
				e := plan[ip]
				e.Mode = planner.BGP
				e.Nodes = append(e.Nodes, node)
				plan[ip] = e
				continue
			}
			e := planner.Entry{Mode: planner.L2}
			for _, c := range an.GetL2().GetCandidates() {
				e.Nodes = append(e.Nodes, c.GetNode())
			}
			src := source{st.GetTerm(), e.Primary() == node}
			if old, ok := from[ip]; ok && (old.term > src.term || old.term == src.term && (old.primary || !src.primary)) {
				continue
			}
			from[ip] = src
			plan[ip] = e
		}
	}
	return plan
}

// drainRound notes the drains that began or ended: a node that began draining gets a timer for
// the end of its delay (which re-plans it); one whose delay is over has its lingering
// announcements rebuilt without it.
func (a *Announcer) drainRound(r *round) {
	s := &a.loop
	now := time.Now()
	for _, n := range s.nodeList {
		draining := a.cfg.Drain.Draining(n)
		since, known := s.drainSince[n.Name]
		switch {
		case draining && !known:
			s.drainSince[n.Name] = now
			klog.InfoS("Node is being drained: it takes no new VIP, and withdraws what it announces after the delay", "node", n.Name, "delay", a.cfg.Drain.Delay)
			s.drainTimers[n.Name] = time.AfterFunc(a.cfg.Drain.Delay+10*time.Millisecond, func() {
				a.note(func(c *changes) { c.nodes = true })
			})
		case draining && !s.drainEnded[n.Name] && !now.Before(since.Add(a.cfg.Drain.Delay)):
			s.drainEnded[n.Name] = true
			klog.InfoS("Drain delay over: the node withdraws what it announced", "node", n.Name)
			s.part(n.Name).anns.Ascend(func(it annItem) bool {
				r.entry[it.ip] = true
				return true
			})
		case !draining && known:
			a.endDrain(n.Name)
		}
	}
	for name := range s.drainSince {
		if _, ok := s.byName[name]; !ok {
			a.endDrain(name)
		}
	}
}

func (a *Announcer) endDrain(node string) {
	s := &a.loop
	if t := s.drainTimers[node]; t != nil {
		t.Stop()
	}
	delete(s.drainTimers, node)
	delete(s.drainSince, node)
	delete(s.drainEnded, node)
}

// lingering reports whether a node is within its drain's delay: it keeps announcing what it
// announced, and takes nothing new.
func (a *Announcer) lingering(node string) bool {
	since, ok := a.loop.drainSince[node]
	return ok && time.Now().Before(since.Add(a.cfg.Drain.Delay))
}
