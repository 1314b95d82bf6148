// Package desired turns listed objects into decisions and back: from Services, Nodes,
// EndpointSlices, pools and peers it builds what the planner places (VIPs and nodes), and from
// the plan each node's DesiredState and each Service's announcement condition. It is pure:
// values in, values out; no clients, no clocks, no goroutines. The announcer around it only
// lists objects and writes results.
package desired

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Labels and taints that make a node ineligible to announce.
const (
	LabelExcludeLB = "node.kubernetes.io/exclude-from-external-load-balancers"
	TaintToDelete  = "ToBeDeletedByClusterAutoscaler"
)

// Serves says which Services metalvip serves: of type LoadBalancer, of its class, and without
// a class when Classless. Services of another class are another implementation's: metalvip
// never touches them, not even with an Event.
type Serves struct {
	Class     string
	Classless bool
}

// DefaultServes is what a CCM serves unless its cloud-config says otherwise.
var DefaultServes = Serves{Class: "metalvip.io/vip", Classless: true}

// Ours reports whether metalvip serves svc.
func (s Serves) Ours(svc *v1.Service) bool {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return false
	}
	if c := svc.Spec.LoadBalancerClass; c != nil {
		return s.Class != "" && *c == s.Class
	}
	return s.Classless
}

// Classed reports whether svc is of metalvip's class (served by metalvip's own controller;
// the framework's service controller skips every classed Service).
func (s Serves) Classed(svc *v1.Service) bool {
	c := svc.Spec.LoadBalancerClass
	return c != nil && s.Class != "" && *c == s.Class
}

// Key is a Service's namespace/name.
func Key(svc *v1.Service) string { return svc.Namespace + "/" + svc.Name }

// StatusIPs returns the addresses in a Service's status.
func StatusIPs(svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// Local reports whether a Service sends external traffic only to local endpoints.
func Local(svc *v1.Service) bool {
	return svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
}

// ReadyEndpointNodes returns the nodes, sorted, that run a ready endpoint in the slices.
func ReadyEndpointNodes(slices_ []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if ready && ep.NodeName != nil && !slices.Contains(out, *ep.NodeName) {
				out = append(out, *ep.NodeName)
			}
		}
	}
	slices.Sort(out)
	return out
}

// ReadyEndpointCounts returns, by node, how many ready endpoints of the slices run there.
func ReadyEndpointCounts(slices_ []*discoveryv1.EndpointSlice) map[string]int {
	out := map[string]int{}
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if ready && ep.NodeName != nil {
				out[*ep.NodeName]++
			}
		}
	}
	return out
}

// Sharer is one Service showing an address, with what the planner needs of it.
type Sharer struct {
	Service *v1.Service
	// EndpointNodes run a ready endpoint of the Service (needed for externalTrafficPolicy Local).
	EndpointNodes []string
	// EndpointCounts are its ready endpoints by node (for weighting by endpoints).
	EndpointCounts map[string]int
}

// MaxWeight caps a node's weight (its endpoints counted for a VIP): the link bandwidth it
// stands for (1 Mbit/s each) stays within the community's range, and no router's ratio
// arithmetic overflows.
const MaxWeight = 100000

// Weights returns a BGP VIP's weight on each node: the ready endpoints of its Services
// (summed over the sharers) for a pool that weights by endpoints and Services with
// externalTrafficPolicy Local; nil otherwise (equal shares).
func Weights(v planner.VIP, sharers []Sharer, pool *pools.Pool) map[string]uint32 {
	if v.Mode != planner.BGP || !v.Local || pool == nil || !pool.Announce.WeightByEndpoints {
		return nil
	}
	out := map[string]uint32{}
	for _, sh := range sharers {
		if !Local(sh.Service) {
			continue
		}
		for n, c := range sh.EndpointCounts {
			out[n] = min(out[n]+uint32(c), MaxWeight)
		}
	}
	return out
}

// VIP returns what the planner needs of one address shown by the given Services (several when
// they share it) from pool. It fails closed: an address in no pool (its pool deleted, or
// shrunk so that it no longer holds the address) and an address of a pool that is not valid
// are announced from no node. With
// externalTrafficPolicy Local (which sharing Services have in common) the nodes with a ready
// endpoint of any of them may announce it.
func VIP(addr netip.Addr, sharers []Sharer, pool *pools.Pool) planner.VIP {
	v := planner.VIP{Addr: addr, Mode: planner.L2}
	if pool == nil {
		v.NodeSelector = selector{pools.Nothing()}
	} else {
		if pool.Announce.Mode != 0 {
			v.Mode = pool.Announce.Mode
		}
		if !pool.Valid() {
			v.NodeSelector = selector{pools.Nothing()}
		} else {
			if pool.Announce.NodeSelector != nil {
				v.NodeSelector = selector{pool.Announce.NodeSelector}
			}
			if pool.Announce.Preferred != nil {
				v.Preferred = selector{pool.Announce.Preferred}
			}
		}
	}
	for _, sh := range sharers {
		s := sh.Service
		// A Service's several addresses of one family go to distinct nodes.
		n := 0
		for _, ip := range StatusIPs(s) {
			if ip.Is4() == addr.Is4() {
				n++
			}
		}
		if n > 1 {
			v.Group = Key(s) + "/" + ipam.FamilyOf(addr).String()
		}
		if Local(s) {
			v.Local = true
			for _, node := range sh.EndpointNodes {
				if !slices.Contains(v.EndpointNodes, node) {
					v.EndpointNodes = append(v.EndpointNodes, node)
				}
			}
		}
	}
	slices.Sort(v.EndpointNodes)
	return v
}

// SameVIP reports whether two planner inputs are equal (selectors by their string form).
func SameVIP(a, b planner.VIP) bool {
	return a.Addr == b.Addr && a.Mode == b.Mode && a.Local == b.Local && a.Group == b.Group &&
		slices.Equal(a.EndpointNodes, b.EndpointNodes) && selString(a.NodeSelector) == selString(b.NodeSelector) &&
		selString(a.Preferred) == selString(b.Preferred)
}

func selString(s planner.Selector) string {
	if s == nil {
		return "<all>"
	}
	if ls, ok := s.(selector); ok && ls.Selector != nil {
		return ls.String()
	}
	return "<other>"
}

type selector struct{ labels.Selector }

func (s selector) Matches(m map[string]string) bool { return s.Selector.Matches(labels.Set(m)) }

// Node returns what the planner needs of a node.
func Node(n *v1.Node, agentReachable bool) planner.Node {
	_, excluded := n.Labels[LabelExcludeLB]
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToDelete {
			excluded = true
		}
	}
	return planner.Node{
		Name: n.Name, Labels: n.Labels,
		Excluded:       excluded || n.DeletionTimestamp != nil,
		AgentReachable: agentReachable,
	}
}

// SameNode reports whether two nodes are the same to the plan and the node states: labels,
// taints that exclude, deletion, cordoning (a drain) and the data-plane address; kubelet
// heartbeats are not.
func SameNode(a, b *v1.Node) bool {
	pa, pb := Node(a, false), Node(b, false)
	return pa.Excluded == pb.Excluded && labels.Equals(a.Labels, b.Labels) && NodeAddress(a) == NodeAddress(b) &&
		NodeAddressIn(a, false) == NodeAddressIn(b, false) &&
		a.Spec.Unschedulable == b.Spec.Unschedulable
}

// NodeAddressIn is the node's first InternalIP of a family (IPv4, or IPv6 when v4 is false);
// invalid when it has none.
func NodeAddressIn(n *v1.Node, v4 bool) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type != v1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Unmap().Is4() == v4 {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// NodeAddress is the node's data-plane address: its first InternalIP, IPv4 first.
func NodeAddress(n *v1.Node) netip.Addr {
	var v6 netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != v1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return ip
		}
		if !v6.IsValid() {
			v6 = ip
		}
	}
	return v6
}

// Announcement builds one VIP's part of the node states from its plan entry. services are the
// Services behind it (namespace/name, sorted); addrs gives each node's data-plane address;
// weights (from Weights; nil for none) weight a BGP VIP's route on each of its nodes;
// communities are those its Services add to the pool's (ServiceCommunities, sorted).
func Announcement(e planner.Entry, v planner.VIP, pool *pools.Pool, services []string, addrs func(node string) netip.Addr, weights map[string]uint32, communities []string) *agentv1.Announcement {
	// A copy: the announcement goes to the agents' senders, which marshal it while the
	// announcer changes its own list in place (a Service leaving an address). Sharing it was a
	// data race: a CCM died marshalling a state while 10,000 Services were deleted.
	an := &agentv1.Announcement{Vip: v.Addr.String(), Services: slices.Clone(services)}
	if v.Mode == planner.BGP {
		an.Mode = agentv1.Mode_MODE_BGP
		an.Bgp = &agentv1.BGPAnnouncement{}
		if pool != nil {
			an.Bgp.Communities = slices.Clone(pool.Announce.Communities)
			for _, c := range communities {
				if !slices.Contains(an.Bgp.Communities, c) {
					an.Bgp.Communities = append(an.Bgp.Communities, c)
				}
			}
			an.Bgp.LargeCommunities = slices.Clone(pool.Announce.LargeCommunities)
			an.Bgp.LocalPref = pool.Announce.LocalPref
			an.Bgp.DrainByWeight = pool.Announce.DrainByWeight
			an.Bgp.AggregateLength = uint32(pool.Announce.AggregateV4)
			if v.Addr.Is6() {
				an.Bgp.AggregateLength = uint32(pool.Announce.AggregateV6)
			}
		}
		if weights != nil {
			// One announcement for every node of the VIP, each finding its own weight: the
			// nodes' parts share it (the CCM builds one message per VIP, not per node).
			for _, n := range slices.Sorted(slices.Values(e.Nodes)) {
				an.Bgp.Weights = append(an.Bgp.Weights, &agentv1.NodeWeight{Node: n, Endpoints: weights[n]})
			}
		}
		return an
	}
	an.Mode = agentv1.Mode_MODE_L2
	an.L2 = &agentv1.L2Announcement{}
	for _, c := range e.Nodes {
		a := addrs(c)
		cand := &agentv1.Candidate{Node: c}
		if a.IsValid() {
			cand.Address = a.String()
		}
		an.L2.Candidates = append(an.L2.Candidates, cand)
	}
	if pool != nil {
		an.L2.Interfaces = slices.Clone(pool.Announce.Interfaces)
		an.L2.PerClient = pool.Announce.PerClient
		an.L2.VirtualMac = pool.VirtualMAC(v.Addr)
	}
	return an
}

// Options are the node-wide settings every state carries.
type Options struct {
	GratuitousRefresh time.Duration
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	HeartbeatPort     int
}

// PeerConflict is a peer left off a node because an older peer of the same address (or
// unnumbered interface) selects it too.
type PeerConflict struct {
	Peer, Older, Node string
	// Address is the session both peers would run (agentapi.SessionKey).
	Address string
}

// Peers returns the BGP sessions of a node: every valid peer that selects it, oldest first,
// one per address or unnumbered interface (an older peer of the same wins; the others are returned as
// conflicts). password resolves a peer's password; ok false keeps the session off (its Secret
// cannot be read: a session never runs without the password it was given).
func Peers(node *v1.Node, set *pools.Set, password func(*pools.Peer) (string, bool)) ([]*agentv1.BGPPeer, []PeerConflict) {
	var out []*agentv1.BGPPeer
	var conflicts []PeerConflict
	byAddr := map[string]string{}
	for _, p := range set.Peers() {
		if !p.Selects(node.Labels) {
			continue
		}
		key := agentapi.PeerKey(p.Session)
		if older, dup := byAddr[key]; dup {
			conflicts = append(conflicts, PeerConflict{Peer: p.Name, Older: older, Node: node.Name, Address: key})
			continue
		}
		s := proto.Clone(p.Session).(*agentv1.BGPPeer)
		if p.Password != nil {
			pw, ok := password(p)
			if !ok {
				continue
			}
			s.Password = pw
		}
		byAddr[key] = p.Name
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *agentv1.BGPPeer) int { return strings.Compare(agentapi.PeerKey(a), agentapi.PeerKey(b)) })
	return out, conflicts
}

// Keys gives a node's heartbeat public keys as its agent reported them; nil when unknown.
type Keys func(node string) [][]byte

// NodeState builds a node's desired state (without term and generation, which the
// connection adds): its announcements (sorted by VIP, as given), its BGP sessions, and the
// nodes it exchanges heartbeats with (every other candidate of its L2 VIPs, as given), each
// with its address and the keys its agent reported.
func NodeState(node *v1.Node, anns []*agentv1.Announcement, peers []*agentv1.BGPPeer, heartbeatPeers []string, opts Options, addrs func(string) netip.Addr, keys Keys) *agentv1.DesiredState {
	st := &agentv1.DesiredState{
		Announcements: anns,
		BgpPeers:      peers,
		L2: &agentv1.L2Options{
			GratuitousRefreshSeconds: uint32(opts.GratuitousRefresh / time.Second),
			HeartbeatIntervalMs:      uint32(opts.HeartbeatInterval / time.Millisecond),
			HeartbeatMisses:          uint32(opts.HeartbeatMisses),
			HeartbeatPort:            uint32(opts.HeartbeatPort),
		},
	}
	if addr := NodeAddress(node); addr.Is4() {
		st.Bgp = &agentv1.BGPOptions{RouterId: addr.String()}
	}
	for _, p := range peers {
		if st.Bgp == nil {
			st.Bgp = &agentv1.BGPOptions{}
		}
		if st.Bgp.Asn == 0 {
			st.Bgp.Asn = p.GetLocalAsn()
		}
	}
	names := slices.Sorted(slices.Values(heartbeatPeers))
	for _, n := range names {
		if n == node.Name {
			continue
		}
		p := &agentv1.HeartbeatPeer{Node: n, PublicKeys: keys(n)}
		if a := addrs(n); a.IsValid() {
			p.Address = a.String()
		}
		st.HeartbeatPeers = append(st.HeartbeatPeers, p)
	}
	return st
}

// Departing adds to a node's state the nodes it keeps heartbeating though the CCM cut them off
// (their agents are unreachable, or reachable again but not yet holding a state of this leader;
// see agentv1.HeartbeatPeer.departing), each with its address and keys. A node the state
// already names as a heartbeat peer (the plan made it a candidate again) is marked departing
// too: until it holds the plan's state, it may hold an old one.
func Departing(st *agentv1.DesiredState, names []string, addrs func(string) netip.Addr, keys Keys) {
	for _, n := range names {
		if i := slices.IndexFunc(st.HeartbeatPeers, func(p *agentv1.HeartbeatPeer) bool { return p.GetNode() == n }); i >= 0 {
			p := proto.CloneOf(st.HeartbeatPeers[i])
			p.Departing = true
			st.HeartbeatPeers[i] = p
			continue
		}
		p := &agentv1.HeartbeatPeer{Node: n, PublicKeys: keys(n), Departing: true}
		if a := addrs(n); a.IsValid() {
			p.Address = a.String()
		}
		st.HeartbeatPeers = append(st.HeartbeatPeers, p)
	}
}
