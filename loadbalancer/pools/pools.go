// Package pools decodes IPPools and BGPPeers once, validates them once, and answers "which pool
// holds this address" once, for every reader: the allocator, the announcer and metalvipctl. It
// is pure: objects in, values out; no clients, no clocks.
//
// It fails closed: an object the API server accepted but metalvip cannot use (an object stored
// under an older schema, a selector the label parser refuses) gives no addresses and is
// announced from no node, and its Problems name the field and say why. Nothing else is
// disturbed.
package pools

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Problem is one field of an object that metalvip cannot use, and why.
type Problem struct {
	Field   string // e.g. "spec.announce.nodeSelector"
	Message string // what is wrong and what to write instead
}

func (p Problem) String() string { return p.Field + ": " + p.Message }

// Problems joins problems into one message.
func Problems(ps []Problem) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, "; ")
}

// Pool is an IPPool as metalvip uses it.
type Pool struct {
	Name       string
	UID        types.UID
	Generation int64
	Created    time.Time
	// Allocation is what the allocator needs; used only when the pool is Valid.
	Allocation ipam.Pool
	Announce   Announce
	// Problems, when any, make the pool unusable: it gives no addresses and is announced
	// from no node.
	Problems []Problem
	// Reserved are addresses of its ranges that the cluster uses otherwise (the control-plane
	// VIP), cut out of Allocation.Ranges: never given out, never announced (WithReserved).
	Reserved []Reservation
}

// Valid reports whether the pool has no problem.
func (p *Pool) Valid() bool { return p != nil && len(p.Problems) == 0 }

// Announce is how and from where a pool's addresses are announced.
type Announce struct {
	Mode planner.Mode
	// NodeSelector picks the nodes that may announce; nil: every node.
	NodeSelector labels.Selector
	// Preferred nodes win ties; nil: none.
	Preferred  labels.Selector
	Interfaces []string
	// PerClient: every live candidate answers its share of clients.
	PerClient bool
	// MACScheme, when set, gives each address a MAC of its own (virtualmac.go).
	MACScheme   v1alpha1.VirtualMACScheme
	Communities []string
	// LargeCommunities are RFC 8092's, "ASN:value1:value2".
	LargeCommunities []string
	// ServiceCommunities are those a Service may add with metalvip.io/bgp-communities.
	ServiceCommunities []string
	LocalPref          uint32
	// WeightByEndpoints weights a BGP route by the node's ready endpoints (ETP Local).
	WeightByEndpoints bool
	// AggregateV4 and AggregateV6 are the prefix lengths of the routes that carry the pool's
	// addresses; 0 for host routes.
	AggregateV4, AggregateV6 uint8
	// DrainByWeight: a drained node lowers its routes' link bandwidth instead of adding
	// GRACEFUL_SHUTDOWN (spec.announce.bgp.drain: Weight).
	DrainByWeight bool
	// ExternalIPs: the pool's addresses may be announced as Services' spec.externalIPs.
	ExternalIPs bool
	// Egress: the pool's Services may send their pods' traffic from their addresses.
	Egress bool
}

// Peer is a BGPPeer as metalvip uses it.
type Peer struct {
	Name       string
	UID        types.UID
	Generation int64
	Created    time.Time
	// Session is the session to send to the agents, without its password.
	Session *agentv1.BGPPeer
	// Password names the Secret key holding the session's password; nil: none.
	Password *v1alpha1.SecretKeyRef
	// NodeSelector picks the nodes that peer; nil: every node.
	NodeSelector labels.Selector
	// ServiceCIDRs are aggregates (the ClusterIP ranges) the nodes it selects advertise.
	ServiceCIDRs []netip.Prefix
	// Problems, when any, keep the session off every node.
	Problems []Problem
}

// Valid reports whether the peer has no problem.
func (p *Peer) Valid() bool { return p != nil && len(p.Problems) == 0 }

// Selects reports whether the peer's sessions run on a node with these labels. An invalid
// peer selects nothing.
func (p *Peer) Selects(nodeLabels map[string]string) bool {
	return p.Valid() && (p.NodeSelector == nil || p.NodeSelector.Matches(labels.Set(nodeLabels)))
}

// nothing is the selector of an object that failed to decode: it matches no node.
type nothing struct{ labels.Selector }

func (nothing) Matches(labels.Labels) bool { return false }

// String tells nothing from everything (both are "" to package labels).
func (nothing) String() string { return "<nothing>" }

// Nothing returns a selector that matches no labels.
func Nothing() labels.Selector { return nothing{labels.Nothing()} }

// toTyped converts what an informer or a list holds into the typed object.
func toTyped(obj any, into runtime.Object) error {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		return runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into)
	case nil:
		return errors.New("no object")
	default:
		return fmt.Errorf("unexpected object %T", obj)
	}
}

// DecodePool decodes and validates an IPPool (typed or unstructured). The result always names
// the pool; an object that does not decode at all is a pool with a problem.
func DecodePool(obj any) *Pool {
	if t, ok := obj.(*v1alpha1.IPPool); ok {
		return decodePool(t)
	}
	var ip v1alpha1.IPPool
	if err := toTyped(obj, &ip); err != nil {
		name := ""
		if u, ok := obj.(*unstructured.Unstructured); ok {
			name = u.GetName()
		}
		return &Pool{Name: name, Problems: []Problem{{"spec", fmt.Sprintf("does not decode: %v", err)}}}
	}
	return decodePool(&ip)
}

func decodePool(ip *v1alpha1.IPPool) *Pool {
	p := &Pool{Name: ip.Name, UID: ip.UID, Generation: ip.Generation, Created: ip.CreationTimestamp.Time}
	add := func(field, format string, args ...any) {
		p.Problems = append(p.Problems, Problem{field, fmt.Sprintf(format, args...)})
	}
	sp := ip.Spec
	p.Allocation = ipam.Pool{
		Name:          ip.Name,
		AutoAssign:    sp.AutoAssign == nil || *sp.AutoAssign,
		AvoidBuggyIPs: sp.AvoidBuggyIPs,
		Priority:      sp.Priority,
		Order:         ip.CreationTimestamp.UnixNano(),
	}
	if len(sp.Addresses) == 0 {
		add("spec.addresses", "empty; give at least one CIDR or first-last range")
	}
	for i, s := range sp.Addresses {
		r, err := ipam.ParseRange(string(s))
		if err != nil {
			add(fmt.Sprintf("spec.addresses[%d]", i), "%v", err)
			continue
		}
		p.Allocation.Ranges = append(p.Allocation.Ranges, r)
	}
	if sa := sp.ServiceAllocation; sa != nil {
		p.Allocation.Namespaces = sa.Namespaces
		p.Allocation.NamespaceSelector = selector(sa.NamespaceSelector, "spec.serviceAllocation.namespaceSelector", add)
		p.Allocation.ServiceSelector = selector(sa.ServiceSelector, "spec.serviceAllocation.serviceSelector", add)
	}
	switch sp.ExternalIPs {
	case v1alpha1.ExternalIPsAllow:
		p.Announce.ExternalIPs = true
	case v1alpha1.ExternalIPsDeny, "":
	default:
		add("spec.externalIPs", "%q; write Allow or Deny", sp.ExternalIPs)
	}
	switch sp.Egress {
	case v1alpha1.EgressAllow:
		p.Announce.Egress = true
	case v1alpha1.EgressDeny, "":
	default:
		add("spec.egress", "%q; write Allow or Deny", sp.Egress)
	}
	an := sp.Announce
	switch an.Mode {
	case v1alpha1.AnnounceL2, "":
		p.Announce.Mode = planner.L2
	case v1alpha1.AnnounceBGP:
		p.Announce.Mode = planner.BGP
	default:
		add("spec.announce.mode", "%q is not a mode; write L2 or BGP", an.Mode)
	}
	p.Announce.NodeSelector = selector(an.NodeSelector, "spec.announce.nodeSelector", add)
	p.Announce.Preferred = selector(an.PreferredNodeSelector, "spec.announce.preferredNodeSelector", add)
	if l2 := an.L2; l2 != nil {
		if p.Announce.Mode != planner.L2 {
			add("spec.announce.l2", "applies only to mode L2; remove it or set mode: L2")
		}
		p.Announce.Interfaces = slices.Clone(l2.Interfaces)
		for i, name := range l2.Interfaces {
			if err := agentapi.CheckInterfaceName(name); err != nil {
				add(fmt.Sprintf("spec.announce.l2.interfaces[%d]", i), "%v", err)
			}
		}
		switch l2.Spreading {
		case v1alpha1.SpreadPerClient:
			p.Announce.PerClient = true
		case v1alpha1.SpreadSingle, "":
		default:
			add("spec.announce.l2.spreading", "%q; write Single or PerClient", l2.Spreading)
		}
		if vm := l2.VirtualMAC; vm != nil {
			switch p.Announce.MACScheme = vm.Scheme; vm.Scheme {
			case v1alpha1.VirtualMACLocal, v1alpha1.VirtualMACVRRP:
			case "":
				p.Announce.MACScheme = v1alpha1.VirtualMACLocal // the CRD's default
			default:
				add("spec.announce.l2.virtualMAC.scheme", "%q; write Local or VRRP", vm.Scheme)
			}
			if p.Announce.PerClient {
				add("spec.announce.l2.virtualMAC", "a virtual MAC is on one node at a time; spreading PerClient answers from several: use one or the other")
			}
			checkVirtualMAC(p.Announce.MACScheme, sp.Addresses, add)
		}
	}
	if b := an.BGP; b != nil {
		if p.Announce.Mode != planner.BGP {
			add("spec.announce.bgp", "applies only to mode BGP; remove it or set mode: BGP")
		}
		for i, c := range b.Communities {
			if err := ValidCommunity(c); err != nil {
				add(fmt.Sprintf("spec.announce.bgp.communities[%d]", i), "%v", err)
			}
		}
		p.Announce.Communities = slices.Clone(b.Communities)
		for i, c := range b.LargeCommunities {
			if err := ValidLargeCommunity(c); err != nil {
				add(fmt.Sprintf("spec.announce.bgp.largeCommunities[%d]", i), "%v", err)
			}
		}
		p.Announce.LargeCommunities = slices.Clone(b.LargeCommunities)
		for i, c := range b.ServiceCommunities {
			if err := ValidCommunity(c); err != nil {
				add(fmt.Sprintf("spec.announce.bgp.serviceCommunities[%d]", i), "%v", err)
			}
		}
		p.Announce.ServiceCommunities = slices.Clone(b.ServiceCommunities)
		if lp := b.LocalPref; lp != nil {
			if *lp < 0 || *lp > 1<<32-1 {
				add("spec.announce.bgp.localPref", "%d is out of range; give 0 to 4294967295", *lp)
			} else {
				p.Announce.LocalPref = uint32(*lp)
			}
		}
		p.Announce.WeightByEndpoints = b.WeightByEndpoints
		p.Announce.AggregateV4 = aggregate("spec.announce.bgp.aggregationLength", b.AggregationLength, 32, sp.Addresses, add)
		p.Announce.AggregateV6 = aggregate("spec.announce.bgp.aggregationLengthV6", b.AggregationLengthV6, 128, sp.Addresses, add)
		if (p.Announce.AggregateV4 != 0 || p.Announce.AggregateV6 != 0) && b.WeightByEndpoints {
			add("spec.announce.bgp.weightByEndpoints", "an aggregate route carries several addresses and so no one Service's endpoints: turn weightByEndpoints or the aggregation off")
		}
		if (p.Announce.AggregateV4 != 0 || p.Announce.AggregateV6 != 0) && len(b.ServiceCommunities) > 0 {
			add("spec.announce.bgp.serviceCommunities", "an aggregate route carries several Services' addresses and so no one Service's communities: remove serviceCommunities or the aggregation")
		}
		switch b.Drain {
		case "", v1alpha1.DrainGracefulShutdown:
		case v1alpha1.DrainWeight:
			p.Announce.DrainByWeight = true
		default:
			add("spec.announce.bgp.drain", "%q is not a drain mode; give GracefulShutdown or Weight", b.Drain)
		}
	}
	return p
}

// aggregate checks an aggregation length of one family (bits: 32 or 128) against the pool's
// addresses of that family: CIDRs no longer than it (no ranges), so that an aggregate
// covers no address outside the pool (the CRD's rule too). It returns 0 for host routes
// (unset, or the full length).
func aggregate(field string, v *int32, bits int, addrs []v1alpha1.AddressRange, add func(string, string, ...any)) uint8 {
	if v == nil || int(*v) == bits {
		return 0
	}
	if *v < 0 || int(*v) > bits {
		add(field, "%d is out of range; give 0 to %d", *v, bits)
		return 0
	}
	for _, a := range addrs {
		s := string(a)
		if strings.Contains(s, ":") != (bits == 128) {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Bits() > int(*v) {
			add(field, "%d: with it give the pool's addresses of the family as CIDRs no longer than /%d, not %s: an aggregate would cover addresses outside the pool", *v, *v, s)
			return 0
		}
	}
	return uint8(*v)
}

// ValidCommunity checks a standard BGP community "ASN:value", two numbers of 0 to 65535.
func ValidCommunity(c string) error {
	hi, lo, ok := strings.Cut(c, ":")
	if !ok {
		return fmt.Errorf("community %q: write two numbers of 0 to 65535 as ASN:value, e.g. 64500:100", c)
	}
	for _, part := range []string{hi, lo} {
		n := 0
		if part == "" || len(part) > 5 {
			return fmt.Errorf("community %q: write two numbers of 0 to 65535 as ASN:value, e.g. 64500:100", c)
		}
		for _, r := range part {
			if r < '0' || r > '9' {
				return fmt.Errorf("community %q: write two numbers of 0 to 65535 as ASN:value, e.g. 64500:100", c)
			}
			n = n*10 + int(r-'0')
		}
		if n > 65535 {
			return fmt.Errorf("community %q: %d is above 65535; each half is a 16-bit number", c, n)
		}
	}
	return nil
}

// ValidLargeCommunity checks a large community written ASN:value1:value2 (RFC 8092): three
// decimal numbers from 0 to 4294967295.
func ValidLargeCommunity(c string) error {
	parts := strings.Split(c, ":")
	if len(parts) != 3 {
		return fmt.Errorf("large community %q: write three numbers of 0 to 4294967295 as ASN:value1:value2, e.g. 4200000000:1:2", c)
	}
	for _, part := range parts {
		if part == "" || len(part) > 10 || strings.Trim(part, "0123456789") != "" {
			return fmt.Errorf("large community %q: write three numbers of 0 to 4294967295 as ASN:value1:value2, e.g. 4200000000:1:2", c)
		}
		if n, _ := strconv.ParseUint(part, 10, 64); n > 1<<32-1 {
			return fmt.Errorf("large community %q: %s is above 4294967295; each part is a 32-bit number", c, part)
		}
	}
	return nil
}

// selector parses a label selector; one that does not parse selects nothing and is reported.
func selector(ls *v1alpha1.LabelSelector, field string, add func(string, string, ...any)) labels.Selector {
	if ls == nil {
		return nil
	}
	s, err := ls.AsSelector()
	if err != nil {
		add(field, "%v; it selects nothing until fixed", err)
		return Nothing()
	}
	return s
}

// DecodePeer decodes and validates a BGPPeer (typed or unstructured).
func DecodePeer(obj any) *Peer {
	if t, ok := obj.(*v1alpha1.BGPPeer); ok {
		return decodePeer(t)
	}
	var bp v1alpha1.BGPPeer
	if err := toTyped(obj, &bp); err != nil {
		name := ""
		if u, ok := obj.(*unstructured.Unstructured); ok {
			name = u.GetName()
		}
		return &Peer{Name: name, Problems: []Problem{{"spec", fmt.Sprintf("does not decode: %v", err)}}}
	}
	return decodePeer(&bp)
}

func decodePeer(bp *v1alpha1.BGPPeer) *Peer {
	p := &Peer{Name: bp.Name, UID: bp.UID, Generation: bp.Generation, Created: bp.CreationTimestamp.Time}
	add := func(field, format string, args ...any) {
		p.Problems = append(p.Problems, Problem{field, fmt.Sprintf(format, args...)})
	}
	sp := bp.Spec
	s := &agentv1.BGPPeer{Address: sp.Address, GracefulRestart: sp.GracefulRestart, TtlSecurity: sp.TTLSecurity}
	var addr netip.Addr
	var err error
	if sp.Address != "" {
		addr, err = netip.ParseAddr(sp.Address)
	}
	switch {
	case sp.Interface != "" && sp.Address != "":
		add("spec", "give the router's address, or the interface of an unnumbered session, not both")
	case sp.Interface != "":
		if err := agentapi.CheckInterfaceName(sp.Interface); err != nil {
			add("spec.interface", "%v", err)
		} else {
			s.Interface = sp.Interface
		}
	case sp.Address == "":
		add("spec.address", "missing; give the router's address, e.g. 198.51.100.1, or the interface of an unnumbered session")
	case err != nil:
		add("spec.address", "%q is not an IP address; write the router's address, e.g. 198.51.100.1", sp.Address)
	case addr.Zone() != "" || addr.IsLinkLocalUnicast():
		add("spec.address", "%s is link-local; give the router's global or unique-local address, or interface for BGP unnumbered", sp.Address)
	case addr.IsUnspecified() || addr.IsMulticast() || addr.IsLoopback() || addr.Is4() && addr.As4()[0] == 255:
		add("spec.address", "%s is not a router's unicast address", sp.Address)
	default:
		s.Address = addr.Unmap().String()
	}
	asn := func(field string, v int64) uint32 {
		if v < 1 || v > 1<<32-1 {
			add(field, "%d is out of range; give 1 to 4294967295", v)
			return 0
		}
		return uint32(v)
	}
	s.PeerAsn = asn("spec.peerASN", sp.PeerASN)
	s.LocalAsn = asn("spec.myASN", sp.MyASN)
	if sp.Port != nil {
		if *sp.Port < 1 || *sp.Port > 65535 {
			add("spec.port", "%d is out of range; give 1 to 65535", *sp.Port)
		} else {
			s.Port = uint32(*sp.Port)
		}
	}
	hold := int32(90)
	if sp.HoldTimeSeconds != nil {
		h := *sp.HoldTimeSeconds
		if h < 0 || h > 65535 || (h != 0 && h < 3) {
			add("spec.holdTimeSeconds", "%d; give 0 or 3 to 65535", h)
		} else {
			s.HoldTimeSeconds = uint32(h)
			if h != 0 {
				hold = h
			}
		}
	}
	if sp.KeepaliveSeconds != nil {
		k := *sp.KeepaliveSeconds
		switch {
		case k < 0 || k > 21845:
			add("spec.keepaliveSeconds", "%d is out of range; give 0 to 21845", k)
		case k >= hold:
			add("spec.keepaliveSeconds", "%d is not shorter than the hold time %d; give at most a third of it", k, hold)
		default:
			s.KeepaliveSeconds = uint32(k)
		}
	}
	if sp.SourceAddress != "" {
		src, err := netip.ParseAddr(sp.SourceAddress)
		switch {
		case sp.Interface != "":
			add("spec.sourceAddress", "an unnumbered session runs from the node's link-local address on %s; remove sourceAddress", sp.Interface)
		case err != nil || src.Zone() != "":
			add("spec.sourceAddress", "%q is not an IP address; write one the node holds, e.g. 198.51.100.11", sp.SourceAddress)
		case addr.IsValid() && src.Unmap().Is4() != addr.Unmap().Is4():
			add("spec.sourceAddress", "%s is not of the address family of %s", sp.SourceAddress, sp.Address)
		case src.IsUnspecified() || src.IsMulticast() || src.IsLoopback() || src.IsLinkLocalUnicast():
			add("spec.sourceAddress", "%s is not a node's unicast address", sp.SourceAddress)
		default:
			s.SourceAddress = src.Unmap().String()
		}
	}
	if c := sp.ConnectRetrySeconds; c != nil {
		if *c < 1 || *c > 65535 {
			add("spec.connectRetrySeconds", "%d is out of range; give 1 to 65535", *c)
		} else {
			s.ConnectRetrySeconds = uint32(*c)
		}
	}
	if m := sp.EBGPMultihop; m != nil {
		if *m < 1 || *m > 255 {
			add("spec.ebgpMultihop", "%d is out of range; give 1 to 255", *m)
		} else if *m > 1 && sp.Interface != "" {
			add("spec.ebgpMultihop", "an unnumbered session's router is on the link %s, one hop away; remove ebgpMultihop", sp.Interface)
		} else if *m > 1 {
			s.EbgpMultihopTtl = uint32(*m)
		}
	}
	if b := sp.BFD; b != nil && b.Enabled {
		if s.EbgpMultihopTtl > 0 {
			add("spec.bfd", "BFD here is single-hop: turn bfd off or remove ebgpMultihop")
		}
		s.Bfd = &agentv1.BFD{Enabled: true}
		ms := func(field string, v *int32, lo, hi int32) uint32 {
			if v == nil {
				return 0
			}
			if *v < lo || *v > hi {
				add(field, "%d is out of range; give %d to %d", *v, lo, hi)
				return 0
			}
			return uint32(*v)
		}
		s.Bfd.MinRxMs = ms("spec.bfd.minRxMilliseconds", b.MinRxMilliseconds, 10, 60000)
		s.Bfd.MinTxMs = ms("spec.bfd.minTxMilliseconds", b.MinTxMilliseconds, 10, 60000)
		s.Bfd.Multiplier = ms("spec.bfd.multiplier", b.Multiplier, 2, 255)
	}
	if ref := sp.PasswordSecretRef; ref != nil {
		if ref.Name == "" || ref.Key == "" {
			add("spec.passwordSecretRef", "give the Secret's name and key")
		}
		r := *ref
		p.Password = &r
	}
	p.NodeSelector = selector(sp.NodeSelector, "spec.nodeSelector", add)
	for i, c := range sp.ServiceCIDRs {
		field := fmt.Sprintf("spec.serviceCIDRs[%d]", i)
		pf, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			add(field, "%q is not a CIDR; write one such as 10.96.0.0/16", c)
		case pf.Masked() != pf:
			add(field, "%s has bits set after its prefix length; write %s", c, pf.Masked())
		case pf.Addr().Is4() && pf.Bits() < 8 || pf.Addr().Is6() && pf.Bits() < 48:
			add(field, "%s is wider than a /8 (IPv4) or a /48 (IPv6); a ClusterIP range is narrower", c)
		case pf.Addr().Is4In6() || pf.Addr().IsLoopback() || pf.Addr().IsMulticast() || pf.Addr().IsLinkLocalUnicast():
			add(field, "%s is not a unicast range", c)
		case slices.Contains(p.ServiceCIDRs, pf):
			add(field, "%s is listed twice", c)
		default:
			p.ServiceCIDRs = append(p.ServiceCIDRs, pf)
		}
	}
	p.Session = s
	return p
}

// Set is a consistent view of every pool and peer.
type Set struct {
	pools map[string]*Pool
	peers []*Peer // oldest first
	index *ipam.Index
}

// NewSet indexes pools and peers, with the allocator's own overlap rule (ipam.Index): O(ranges)
// per pool, whatever their size. A pool whose virtual MACs an older pool's addresses would
// share is not used (virtualmac.go).
func NewSet(pools []*Pool, peers []*Peer) *Set {
	s := &Set{pools: make(map[string]*Pool, len(pools))}
	for _, p := range pools {
		s.pools[p.Name] = p
	}
	s.refuseMACConflicts()
	s.index = ipam.NewIndex(s.AllocatorPools())
	s.peers = slices.Clone(peers)
	slices.SortFunc(s.peers, func(a, b *Peer) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return s
}

// Pool returns a pool by name, valid or not; nil when there is none.
func (s *Set) Pool(name string) *Pool { return s.pools[name] }

// Pools returns every pool, sorted by name.
func (s *Set) Pools() []*Pool {
	out := make([]*Pool, 0, len(s.pools))
	for _, p := range s.pools {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Pool) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Peers returns every peer, oldest first (the order in which duplicates are resolved).
func (s *Set) Peers() []*Peer { return s.peers }

// AllocatorPools returns what the allocator needs of the valid pools.
func (s *Set) AllocatorPools() []ipam.Pool {
	var out []ipam.Pool
	for _, p := range s.Pools() {
		if p.Valid() {
			out = append(out, p.Allocation)
		}
	}
	return out
}

// PoolOf returns the pool whose ranges hold an address, for an address no allocation record
// speaks for (an externalIP, a reader without the allocator): the usable pool (of
// overlapping pools the older), else a valid pool an older one shadows, else an invalid pool
// whose ranges hold it (announced from no node: the caller reports its problems); nil when
// none. The pool of an address a Service holds is the allocator's record: see Governing.
func (s *Set) PoolOf(addr netip.Addr) *Pool {
	addr = addr.Unmap()
	if name, ok := s.index.PoolOf(addr); ok {
		return s.pools[name]
	}
	var valid, invalid *Pool
	for _, p := range s.pools {
		if !p.holds(addr) {
			continue
		}
		switch {
		case p.Valid() && (valid == nil || p.older(valid)):
			valid = p
		case !p.Valid() && (invalid == nil || p.older(invalid)):
			invalid = p
		}
	}
	if valid != nil {
		return valid
	}
	return invalid
}

// Governing returns the pool whose rules announce an address the allocator records as given
// from the named pool (ipam.Index.Governing): that pool while it holds the address, else the
// valid pool holding it (the usable one, else the oldest shadowed one); an invalid pool of
// that name when no valid pool holds it (announced from no node: the caller reports its
// problems); else nil, which fails closed: the address is announced from no node.
func (s *Set) Governing(name string, addr netip.Addr) *Pool {
	addr = addr.Unmap()
	if n, ok := s.index.Governing(name, addr); ok {
		return s.pools[n]
	}
	if p := s.pools[name]; p != nil && p.holds(addr) {
		return p
	}
	return nil
}

// holds reports whether one of the pool's ranges holds addr (the ranges that decoded, for an
// invalid pool).
func (p *Pool) holds(addr netip.Addr) bool {
	for _, r := range p.Allocation.Ranges {
		if r.Contains(addr) {
			return true
		}
	}
	return false
}

// older orders pools as the allocator does: by Order, then name.
func (p *Pool) older(q *Pool) bool {
	if p.Allocation.Order != q.Allocation.Order {
		return p.Allocation.Order < q.Allocation.Order
	}
	return p.Name < q.Name
}
