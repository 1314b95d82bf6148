package nodeagent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// controlPlaneWire is what the control-plane VIP puts on the wire now; nothing without a
// local file.
func (a *Agent) controlPlaneWire() cpWire {
	if a.opts.ControlPlane == nil {
		return cpWire{}
	}
	return a.opts.ControlPlane.wire()
}

// controlPlaneChanged puts the control-plane VIP's decision on the wire beside the CCM's VIPs
// (decided again, unchanged). It returns once the speakers have it: the heartbeats show a
// release only after that.
func (a *Agent) controlPlaneChanged() {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state != nil && a.checked.reserved != a.controlPlaneWire().vip {
		a.checked = a.checkState(a.state)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.RetryInterval)
	defer cancel()
	a.applyLocked(ctx)
}

// checkState checks a CCM state's items, and refuses an announcement of the control-plane VIP:
// the CCM cannot take the control-plane endpoint, nor remove it.
func (a *Agent) checkState(st *agentv1.DesiredState) checkedState {
	c := checkItems(st)
	if c.unknown = unknownFields(st.ProtoReflect()); len(c.unknown) > 0 {
		klog.InfoS("The state has fields this agent does not know (a newer CCM): applied as if unset", "fields", c.unknown)
	}
	c.peers = slices.DeleteFunc(c.peers, func(p bgp.Peer) bool {
		if !p.SourceAddress.IsValid() || a.holdsAddress(p.SourceAddress) {
			return false
		}
		i := slices.IndexFunc(st.GetBgpPeers(), func(x *agentv1.BGPPeer) bool { return x.GetAddress() == p.Address.String() })
		c.refused = append(c.refused, &agentv1.Refusal{
			Kind: agentv1.Refusal_KIND_BGP_PEER, Key: agentapi.PeerKey(st.GetBgpPeers()[i]), Field: fmt.Sprintf("bgp_peers[%d].source_address", i),
			Reason: fmt.Sprintf("%s is not an address of node %s; give the BGPPeer a nodeSelector that selects the node holding it, or no sourceAddress", p.SourceAddress, a.opts.Node),
		})
		return true
	})
	vip := a.controlPlaneWire().vip
	if !vip.IsValid() {
		return c
	}
	c.reserved = vip
	keep := c.announcements[:0]
	for _, an := range c.announcements {
		if an.vip == vip {
			i := slices.IndexFunc(st.GetAnnouncements(), func(x *agentv1.Announcement) bool { return x == an.Announcement })
			c.refused = append(c.refused, &agentv1.Refusal{
				Kind: agentv1.Refusal_KIND_ANNOUNCEMENT, Key: an.GetVip(), Field: fmt.Sprintf("announcements[%d].vip", i),
				Reason: fmt.Sprintf("%s is this node's control-plane VIP (kubeadm's control-plane endpoint, from %s); give the Service another address and keep the VIP out of every IPPool", vip, a.opts.ControlPlane.opts.File),
			})
			continue
		}
		keep = append(keep, an)
	}
	c.announcements = keep
	return c
}

// mergePeers gives the speaker the CCM's peers and the file's: a router in both has one
// session, with the file's settings (the control-plane endpoint comes first); a CCM peer whose
// settings differ is reported.
func mergePeers(ccm, file []bgp.Peer) ([]bgp.Peer, []string) {
	out := slices.Clone(file)
	var problems []string
	for _, p := range ccm {
		i := slices.IndexFunc(file, func(f bgp.Peer) bool { return f.Address == p.Address })
		if i < 0 {
			out = append(out, p)
			continue
		}
		if !sameSession(file[i], p) {
			problems = append(problems, fmt.Sprintf("BGP peer %s: also a router of the control-plane file, whose settings its session uses; give the BGPPeer the same settings", p.Address))
		}
	}
	return out, problems
}

func sameSession(x, y bgp.Peer) bool {
	return x.Address == y.Address && x.Port == y.Port && x.PeerASN == y.PeerASN && (x.LocalASN == y.LocalASN || y.LocalASN == 0) &&
		x.HoldTime == y.HoldTime && x.Keepalive == y.Keepalive && x.Password == y.Password &&
		x.MultihopTTL == y.MultihopTTL && x.TTLSecurity == y.TTLSecurity && x.BFD == y.BFD &&
		x.SourceAddress == y.SourceAddress && x.ConnectRetry == y.ConnectRetry
}

// holdsAddress says whether the node holds addr (Options.HoldsAddress, by default one of the
// host's interfaces' addresses).
func (a *Agent) holdsAddress(addr netip.Addr) bool {
	if a.opts.HoldsAddress != nil {
		return a.opts.HoldsAddress(addr)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		klog.ErrorS(err, "Cannot list the node's addresses")
		return false
	}
	for _, x := range addrs {
		if n, ok := x.(*net.IPNet); ok {
			if a2, ok := netip.AddrFromSlice(n.IP); ok && a2.Unmap() == addr.Unmap() {
				return true
			}
		}
	}
	return false
}
