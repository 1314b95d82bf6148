package nodeagent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// MaxTerm is the highest term a state may carry: terms come from the leader Lease's
// leaseTransitions (an int32) plus one, never from a clock.
const MaxTerm = 1 << 31

// Bounds of the L2 options, the same as the CCM's configuration allows.
const (
	minHeartbeatInterval = 10 * time.Millisecond
	maxHeartbeatInterval = 10 * time.Second
	minHeartbeatMisses   = 2
	maxHeartbeatMisses   = 100
)

// checkWhole checks what the whole state stands or falls with: whom it is for, its term, and
// the node-wide settings. Such a state is refused whole (INVALID_ARGUMENT): it is the CCM's
// mistake, not an object's.
func checkWhole(st *agentv1.DesiredState, node string) error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if st.GetNode() != node {
		add("node: the state is for %q; this agent is %q", st.GetNode(), node)
	}
	if t := st.GetTerm(); t == 0 || t > MaxTerm {
		add("term: %d is out of range; a term is the leader Lease's leaseTransitions plus one, 1 to %d", t, uint64(MaxTerm))
	}
	if id := st.GetBgp().GetRouterId(); id != "" {
		if a, err := netip.ParseAddr(id); err != nil || !a.Is4() {
			add("bgp.router_id: %q is not an IPv4 address; give the node's IPv4 address, or none for the agent's own", id)
		}
	}
	l2 := st.GetL2()
	if iv := time.Duration(l2.GetHeartbeatIntervalMs()) * time.Millisecond; iv != 0 && (iv < minHeartbeatInterval || iv > maxHeartbeatInterval) {
		add("l2.heartbeat_interval_ms: %d is out of range; give 0 (50) or %d to %d", l2.GetHeartbeatIntervalMs(), minHeartbeatInterval.Milliseconds(), maxHeartbeatInterval.Milliseconds())
	}
	if n := l2.GetHeartbeatMisses(); n != 0 && (n < minHeartbeatMisses || n > maxHeartbeatMisses) {
		add("l2.heartbeat_misses: %d is out of range; give 0 (3) or %d to %d", n, minHeartbeatMisses, maxHeartbeatMisses)
	}
	if p := l2.GetHeartbeatPort(); p > 65535 {
		add("l2.heartbeat_port: %d is not a UDP port; give 0 (7473) or 1 to 65535", p)
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// CheckState says what the agent of node would refuse of st: the whole of it (the error, as
// Apply's INVALID_ARGUMENT), or items alone (as Apply's refused). For parity tests: what the
// API server accepts, the agent must take.
func CheckState(st *agentv1.DesiredState, node string) ([]*agentv1.Refusal, error) {
	if err := checkWhole(st, node); err != nil {
		return nil, err
	}
	return checkItems(st).refused, nil
}

// checkedState is a state split by the per-item checks: what to apply, and what is refused.
// A refused item costs only itself.
type checkedState struct {
	announcements []checkedAnnouncement
	peers         []bgp.Peer
	hbPeers       map[string]failover.Peer // by node: keys and address of every heartbeat peer
	refused       []*agentv1.Refusal
	problems      []string   // items that are the CCM's own (heartbeat peers), left out
	reserved      netip.Addr // the control-plane VIP announcements were refused for (standalone.go)
	hcPorts       []uint16   // health check node ports to ask kube-proxy (dataplane)
	unknown       []string   // fields of the state this build does not know (unknown.go)
	egress        []checkedEgress
}

// checkedAnnouncement is an announcement checkItems accepted, with what it decoded of it: the
// rest of the agent reads these, never the strings again.
type checkedAnnouncement struct {
	*agentv1.Announcement
	vip netip.Addr
	// mac is the L2 announcement's virtual MAC; nil when it has none.
	mac net.HardwareAddr
	// candidates are the L2 candidates' data-plane addresses, in their order; invalid (the
	// zero Addr) where the CCM gave none.
	candidates []netip.Addr
}

// checkItems checks every announcement and BGP peer on its own.
func checkItems(st *agentv1.DesiredState) checkedState {
	var c checkedState
	var egressProblems []string
	c.egress, egressProblems = checkEgress(st)
	c.problems = append(c.problems, egressProblems...)
	refuse := func(kind agentv1.Refusal_Kind, key, field, format string, args ...any) {
		c.refused = append(c.refused, &agentv1.Refusal{Kind: kind, Key: key, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	seenVIP := map[netip.Addr]int{}
	seenMAC := map[string]int{} // virtual MACs
	n := 0
	for _, an := range st.GetAnnouncements() {
		n += len(an.GetL2().GetCandidates())
	}
	candAddrs := make([]netip.Addr, 0, n) // every candidate's address, one array for all
	c.announcements = make([]checkedAnnouncement, 0, len(st.GetAnnouncements()))
	for i, an := range st.GetAnnouncements() {
		at := fmt.Sprintf("announcements[%d]", i)
		bad := func(field, format string, args ...any) {
			refuse(agentv1.Refusal_KIND_ANNOUNCEMENT, an.GetVip(), at+field, format, args...)
		}
		vip, err := netip.ParseAddr(an.GetVip())
		if err != nil || vip.Zone() != "" || vip.Is4In6() {
			bad(".vip", "%q is not an IP address; give an IPv4 or IPv6 address without a zone", an.GetVip())
			continue
		}
		if vip.IsUnspecified() || vip.IsMulticast() || vip.IsLoopback() || vip.IsLinkLocalUnicast() {
			bad(".vip", "%s is not a unicast address this node can announce; give a global or unique local address", vip)
			continue
		}
		if j, dup := seenVIP[vip]; dup {
			bad(".vip", "%s is also announcements[%d]; give each VIP once", vip, j)
			continue
		}
		if f, reason := checkAnnouncement(an); reason != "" {
			bad(f, "%s", reason)
			continue
		}
		ca := checkedAnnouncement{Announcement: an, vip: vip}
		if an.GetMode() == agentv1.Mode_MODE_L2 {
			if m := an.GetL2().GetVirtualMac(); m != "" {
				ca.mac, _ = net.ParseMAC(m) // checkAnnouncement checked it
				if j, dup := seenMAC[ca.mac.String()]; dup {
					bad(".l2.virtual_mac", "%s is also the MAC of announcements[%d] (%s); give each VIP its own", ca.mac, j, st.GetAnnouncements()[j].GetVip())
					continue
				}
				seenMAC[ca.mac.String()] = i
			}
			start := len(candAddrs)
			for _, cd := range an.GetL2().GetCandidates() {
				addr, _ := netip.ParseAddr(cd.GetAddress()) // checked; "" stays the zero Addr
				candAddrs = append(candAddrs, addr)
			}
			ca.candidates = candAddrs[start:len(candAddrs):len(candAddrs)]
		}
		seenVIP[vip] = i
		c.announcements = append(c.announcements, ca)
	}

	defaultASN := st.GetBgp().GetAsn()
	seenPeer := map[string]int{}
	for i, p := range st.GetBgpPeers() {
		at := fmt.Sprintf("bgp_peers[%d]", i)
		bad := func(field, format string, args ...any) {
			refuse(agentv1.Refusal_KIND_BGP_PEER, agentapi.PeerKey(p), at+field, format, args...)
		}
		var addr netip.Addr
		var err error
		if p.GetInterface() == "" || p.GetAddress() != "" {
			if addr, err = netip.ParseAddr(p.GetAddress()); err != nil {
				bad(".address", "%q is not an IP address; give the peer's address", p.GetAddress())
				continue
			}
		}
		if p.GetPort() > 65535 {
			bad(".port", "%d is not a TCP port; give 0 (179) or 1 to 65535", p.GetPort())
			continue
		}
		if p.GetEbgpMultihopTtl() > 255 {
			bad(".ebgp_multihop_ttl", "%d is out of range; give 0 (directly connected) or 1 to 255", p.GetEbgpMultihopTtl())
			continue
		}
		if p.GetHoldTimeSeconds() > 65535 || p.GetKeepaliveSeconds() > 65535 {
			bad(".hold_time_seconds", "hold time %d s, keepalive %d s: give at most 65535 s", p.GetHoldTimeSeconds(), p.GetKeepaliveSeconds())
			continue
		}
		if b := p.GetBfd(); b.GetMinRxMs() > 60000 || b.GetMinTxMs() > 60000 {
			bad(".bfd", "intervals of %d and %d ms: give 0 (300) or 1 to 60000 ms", b.GetMinRxMs(), b.GetMinTxMs())
			continue
		}
		if p.GetConnectRetrySeconds() > 65535 {
			bad(".connect_retry_seconds", "%d is out of range; give 0 (5) or 1 to 65535", p.GetConnectRetrySeconds())
			continue
		}
		peer := bgpPeer(addr, p)
		if src := p.GetSourceAddress(); src != "" {
			if peer.SourceAddress, err = netip.ParseAddr(src); err != nil {
				bad(".source_address", "%q is not an IP address; give one this node holds, or none", src)
				continue
			}
		}
		if err := bgp.CheckPeer(defaultASN, peer); err != nil {
			var fe *bgp.FieldError
			if errors.As(err, &fe) {
				bad("."+peerField(fe.Field), "%s", fe.Reason)
			} else {
				bad("", "%v", err)
			}
			continue
		}
		key := agentapi.SessionKey(addr.Unmap().String(), p.GetInterface())
		if j, dup := seenPeer[key]; dup {
			bad(".address", "%s is also bgp_peers[%d]; give each peer once (one session per address or interface)", key, j)
			continue
		}
		seenPeer[key] = i
		c.peers = append(c.peers, peer)
	}

	c.hbPeers = map[string]failover.Peer{}
	for i, hp := range st.GetHeartbeatPeers() {
		at := fmt.Sprintf("heartbeat_peers[%d]", i)
		addr, err := netip.ParseAddr(hp.GetAddress())
		if hp.GetAddress() != "" && err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s.address: %q is not an IP address; node %s left out of the heartbeats", at, hp.GetAddress(), hp.GetNode()))
			continue
		}
		fp := failover.Peer{Node: hp.GetNode(), Addr: addr, Departing: hp.GetDeparting()}
		for k, key := range hp.GetPublicKeys() {
			if err := failover.ValidPublicKey(key); err != nil {
				c.problems = append(c.problems, fmt.Sprintf("%s.public_keys[%d]: %v; left out", at, k, err))
				continue
			}
			fp.PublicKeys = append(fp.PublicKeys, key)
		}
		c.hbPeers[hp.GetNode()] = fp
	}
	for i, p := range st.GetHealthCheckNodePorts() {
		if p == 0 || p > 65535 {
			c.problems = append(c.problems, fmt.Sprintf("health_check_node_ports[%d]: %d is not a port; left out", i, p))
			continue
		}
		c.hcPorts = append(c.hcPorts, uint16(p))
	}
	return c
}

// checkAnnouncement checks an announcement's mode and its mode's fields; it returns the field
// (after "announcements[i]") and the reason, or "" when it is fine.
func checkAnnouncement(an *agentv1.Announcement) (string, string) {
	switch an.GetMode() {
	case agentv1.Mode_MODE_L2:
		cands := an.GetL2().GetCandidates()
		if len(cands) == 0 {
			return ".l2.candidates", "an L2 VIP needs at least one candidate"
		}
		for k, c := range cands {
			if c.GetNode() == "" {
				return fmt.Sprintf(".l2.candidates[%d].node", k), "empty; give the candidate's node name"
			}
			if c.GetAddress() != "" {
				if _, err := netip.ParseAddr(c.GetAddress()); err != nil {
					return fmt.Sprintf(".l2.candidates[%d].address", k), fmt.Sprintf("%q is not an IP address; give the node's data-plane address", c.GetAddress())
				}
			}
		}
		for k, ifi := range an.GetL2().GetInterfaces() {
			if ifi == "" || len(ifi) > 15 || strings.ContainsAny(ifi, "/ \t\n") {
				return fmt.Sprintf(".l2.interfaces[%d]", k), fmt.Sprintf("%q is not an interface name; give a name such as eth0, or none for the agent's default", ifi)
			}
		}
		if m := an.GetL2().GetVirtualMac(); m != "" {
			mac, err := net.ParseMAC(m)
			switch {
			case err != nil || len(mac) != 6:
				return ".l2.virtual_mac", fmt.Sprintf("%q is not an Ethernet address; give six bytes such as 02:00:cb:00:71:05, or none", m)
			case mac[0]&1 != 0 || slices.Equal(mac, make(net.HardwareAddr, 6)):
				return ".l2.virtual_mac", fmt.Sprintf("%s is not a unicast Ethernet address; a VIP's MAC is unicast, such as 02:00:cb:00:71:05", mac)
			case an.GetL2().GetPerClient():
				return ".l2.virtual_mac", "a virtual MAC is on one node at a time and per_client answers from several: give one or the other"
			}
		}
	case agentv1.Mode_MODE_BGP:
		if l := an.GetBgp().GetAggregateLength(); l != 0 {
			if v, err := netip.ParseAddr(an.GetVip()); err == nil && int(l) > v.BitLen() {
				return ".bgp.aggregate_length", fmt.Sprintf("%d is longer than the %d bits of %s; give 0 (a host route) or 1 to %d", l, v.BitLen(), v, v.BitLen())
			}
		}
		for k, c := range an.GetBgp().GetCommunities() {
			if _, err := bgp.ParseCommunity(c); err != nil {
				return fmt.Sprintf(".bgp.communities[%d]", k), err.Error() + "; write ASN:value with both parts from 0 to 65535, e.g. 64512:100"
			}
		}
		for k, c := range an.GetBgp().GetLargeCommunities() {
			if _, err := bgp.ParseLargeCommunity(c); err != nil {
				return fmt.Sprintf(".bgp.large_communities[%d]", k), err.Error() + "; write ASN:value1:value2 with each part from 0 to 4294967295, e.g. 4200000000:1:2"
			}
		}
		for k, w := range an.GetBgp().GetWeights() {
			switch {
			case w.GetNode() == "":
				return fmt.Sprintf(".bgp.weights[%d].node", k), "empty; give the node's name"
			case w.GetEndpoints() > bgp.MaxWeight:
				return fmt.Sprintf(".bgp.weights[%d].endpoints", k), fmt.Sprintf("%d is above %d", w.GetEndpoints(), bgp.MaxWeight)
			}
		}
	default:
		return ".mode", fmt.Sprintf("%v; give MODE_L2 or MODE_BGP", an.GetMode())
	}
	return "", ""
}

// peerField maps a bgp.Peer field to its name in the contract.
func peerField(goName string) string {
	switch goName {
	case "Address":
		return "address"
	case "PeerASN":
		return "peer_asn"
	case "LocalASN":
		return "local_asn"
	case "HoldTime":
		return "hold_time_seconds"
	case "Keepalive":
		return "keepalive_seconds"
	case "MultihopTTL":
		return "ebgp_multihop_ttl"
	case "SourceAddress":
		return "source_address"
	case "ConnectRetry":
		return "connect_retry_seconds"
	case "BFD.Enabled":
		return "bfd.enabled"
	case "BFD.MinRx":
		return "bfd.min_rx_ms"
	case "BFD.MinTx":
		return "bfd.min_tx_ms"
	case "BFD.Multiplier":
		return "bfd.multiplier"
	}
	return strings.ToLower(goName)
}

// bgpPeer translates a contract peer; the caller has checked the ranges.
func bgpPeer(addr netip.Addr, p *agentv1.BGPPeer) bgp.Peer {
	return bgp.Peer{
		Address:         addr,
		Interface:       p.GetInterface(),
		Port:            uint16(p.GetPort()),
		PeerASN:         p.GetPeerAsn(),
		LocalASN:        p.GetLocalAsn(),
		HoldTime:        time.Duration(p.GetHoldTimeSeconds()) * time.Second,
		Keepalive:       time.Duration(p.GetKeepaliveSeconds()) * time.Second,
		Password:        p.GetPassword(),
		MultihopTTL:     uint8(p.GetEbgpMultihopTtl()),
		TTLSecurity:     p.GetTtlSecurity(),
		GracefulRestart: p.GetGracefulRestart(),
		ConnectRetry:    time.Duration(p.GetConnectRetrySeconds()) * time.Second,
		BFD: bgp.BFD{
			Enabled:    p.GetBfd().GetEnabled(),
			MinRx:      time.Duration(p.GetBfd().GetMinRxMs()) * time.Millisecond,
			MinTx:      time.Duration(p.GetBfd().GetMinTxMs()) * time.Millisecond,
			Multiplier: p.GetBfd().GetMultiplier(),
		},
	}
}
