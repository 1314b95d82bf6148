package announcer

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

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
	addrs6    map[string]netip.Addr // nodes with an IPv6 InternalIP: the first
	reachable map[string]bool
	planner   *planner.Planner

	shown   shown                            // which addresses each Service shows, and the reverse
	extIPs  map[string][]netip.Addr          // Service -> its externalIPs announced (also in svcAddrs)
	extWant map[string]bool                  // Services that ask for their externalIPs to be announced
	extSaid map[string]string                // Service -> its ExternalIPs condition last set (text form)
	vips    map[netip.Addr]planner.VIP       // what the planner was given
	pools   addrPools                        // which pool's rules announce each address
	weights map[netip.Addr]map[string]uint32 // BGP VIPs weighted by endpoints: node -> weight
	// communities are the communities a BGP VIP's Services add to its pool's (sorted).
	communities map[netip.Addr][]string
	anns        map[netip.Addr]*agentv1.Announcement
	annNodes    map[netip.Addr][]string // the nodes each announcement was given to
	parts       map[string]*nodePart    // node -> its announcements
	groups      map[string][]netip.Addr // group -> member addresses
	pushes      pushes
	cutOff      cutOff                // unreachable nodes and the nodes that heartbeat them as departing
	cpVIPs      map[string]netip.Addr // node -> the control-plane VIP its agent reports serving

	conds     map[string]uint64                 // Service -> condition last set (conditionSum; noCondition: removed)
	passwords map[string]string                 // peer -> last password read
	statusSet map[string]string                 // pool/peer/node status last set (text form)
	conflicts map[string][]desired.PeerConflict // node -> peers left off it
	sessions  map[string][]*agentv1.PeerStatus  // node -> its BGP sessions, as its agent reported them

	dataPlane dataPlanes // what each node's agent says of its kube-proxy, and the ports it is asked

	egress     map[netip.Addr]egressVIP         // addresses whose Services' pods leave from them
	egressAsks map[netip.Addr]egressAsk         // addresses whose Services may have egress (before claims)
	annPeered  map[netip.Addr]bool              // BGP addresses whose parts carry egress heartbeat peers
	egressWhy  map[string]map[netip.Addr]string // Service -> its asking addresses -> why refused ("": granted)
	egressSaid map[string]string                // Service -> Egress condition last set (text form)
}

// nodePart is one node's announcements, ordered by VIP in a copy-on-write tree (a snapshot
// for the push costs nothing, a change O(log n)), and how many of its VIPs name each other
// node as a peer (its heartbeat peers): an L2 VIP its candidates, a BGP VIP with egress the
// announcers that may be its egress node (egressPeers).
type nodePart struct {
	anns    *btree.BTreeG[annItem]
	peers   map[string]int
	version uint64
}

type annItem struct {
	ip    netip.Addr
	an    *agentv1.Announcement
	peers []string // the nodes this VIP makes heartbeat peers of the part's node
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

func newLoopState(maxCandidates int, records Records) loopState {
	return loopState{
		first:       true,
		planner:     planner.New(planner.Options{MaxCandidates: maxCandidates}),
		byName:      map[string]*v1.Node{},
		addrs:       map[string]netip.Addr{},
		reachable:   map[string]bool{},
		shown:       newShown(),
		extIPs:      map[string][]netip.Addr{},
		extWant:     map[string]bool{},
		extSaid:     map[string]string{},
		vips:        map[netip.Addr]planner.VIP{},
		pools:       newAddrPools(records),
		weights:     map[netip.Addr]map[string]uint32{},
		communities: map[netip.Addr][]string{},
		anns:        map[netip.Addr]*agentv1.Announcement{},
		annNodes:    map[netip.Addr][]string{},
		parts:       map[string]*nodePart{},
		groups:      map[string][]netip.Addr{},
		pushes:      pushes{},
		cutOff:      newCutOff(),
		cpVIPs:      map[string]netip.Addr{},
		conds:       map[string]uint64{},
		passwords:   map[string]string{},
		statusSet:   map[string]string{},
		conflicts:   map[string][]desired.PeerConflict{},
		sessions:    map[string][]*agentv1.PeerStatus{},
		dataPlane:   newDataPlanes(),
		egress:      map[netip.Addr]egressVIP{},
		egressAsks:  map[netip.Addr]egressAsk{},
		annPeered:   map[netip.Addr]bool{},
		egressWhy:   map[string]map[netip.Addr]string{},
		egressSaid:  map[string]string{},
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
	s.addrs6 = map[string]netip.Addr{}
	for _, n := range list {
		s.byName[n.Name] = n
		s.addrs[n.Name] = desired.NodeAddress(n)
		if a := desired.NodeAddressIn(n, false); a.IsValid() {
			s.addrs6[n.Name] = a
		}
	}
	isNode := func(name string) bool { return s.byName[name] != nil }
	s.forgetStatus("node/", isNode)
	s.forgetStatus("dataplane/", isNode)
}

// forgetStatus drops the status last set of the objects under prefix that are gone (keep says
// which are not), so that the map grows with the objects there are, not with those there were
// (nodes of an autoscaled cluster come and go under new names). One that comes back is told
// afresh.
func (s *loopState) forgetStatus(prefix string, keep func(name string) bool) {
	for k := range s.statusSet {
		if name, ok := strings.CutPrefix(k, prefix); ok && !keep(name) {
			delete(s.statusSet, k)
		}
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
	pn.Excluded = pn.Excluded || d.Draining(n) || s.dataPlane.down(n.Name)
	return pn
}

func (s *loopState) part(node string) *nodePart {
	p := s.parts[node]
	if p == nil {
		p = &nodePart{anns: btree.NewG(32, annLess), peers: map[string]int{}}
		s.parts[node] = p
	}
	return p
}

// set puts an announcement in the part, with the heartbeat peers it gives the node (an L2
// VIP's candidates when extra is nil).
func (p *nodePart) set(ip netip.Addr, an *agentv1.Announcement, extra []string) {
	peers := extra
	if peers == nil {
		for _, c := range an.GetL2().GetCandidates() {
			peers = append(peers, c.GetNode())
		}
	}
	if old, found := p.anns.ReplaceOrInsert(annItem{ip, an, peers}); found {
		p.unpeer(old.peers)
	}
	for _, n := range peers {
		p.peers[n]++
	}
	p.version++
}

// remove takes a VIP's announcement out of the part.
func (p *nodePart) remove(ip netip.Addr) {
	if old, found := p.anns.Delete(annItem{ip: ip}); found {
		p.unpeer(old.peers)
		p.version++
	}
}

func (p *nodePart) unpeer(peers []string) {
	for _, n := range peers {
		if p.peers[n]--; p.peers[n] <= 0 {
			delete(p.peers, n)
		}
	}
}
