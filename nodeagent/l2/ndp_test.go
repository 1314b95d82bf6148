package l2

import (
	"net/netip"
	"testing"

	"github.com/mdlayher/ndp"

	"github.com/metalvip/metalvip/internal/rendezvous"
)

var client6 = netip.MustParseAddr("2001:db8:1::100")

func TestNDPAnswersOnlyWhatTheNodeOwns(t *testing.T) {
	for _, tc := range []struct {
		name          string
		target, from  netip.Addr
		hops          int
		wantTo        netip.Addr // invalid: no answer
		wantSolicited bool
	}{
		{"a solicitation for an owned VIP is answered to its sender, solicited", vip6, client6, 255, client6, true},
		{"duplicate address detection is answered to all nodes, unsolicited", vip6, netip.IPv6Unspecified(), 255, netip.IPv6LinkLocalAllNodes(), false},
		{"a solicitation for a VIP no one gave the node is not answered", otherVIP6, client6, 255, netip.Addr{}, false},
		{"a solicitation that was routed (hop limit under 255) is not answered", vip6, client6, 254, netip.Addr{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, Options{Burst: 1})
			n.set(VIP{Addr: vip6, Interfaces: []string{"eth0"}})
			waitFor(t, "the takeover's advertisement", func() bool { return len(n.ndp["eth0"].ndpSent()) == 1 })
			n.ndp["eth0"].reset()
			n.solicit(tc.target, tc.from, clientMAC, tc.hops)
			sent := n.ndp["eth0"].ndpSent()
			if !tc.wantTo.IsValid() {
				if len(sent) != 0 {
					t.Errorf("answered: %+v to %s", sent[0].m, sent[0].to)
				}
				return
			}
			if len(sent) != 1 {
				t.Fatalf("%d advertisements; want 1", len(sent))
			}
			na, ok := sent[0].m.(*ndp.NeighborAdvertisement)
			if !ok || sent[0].to != tc.wantTo || na.TargetAddress != tc.target || na.Solicited != tc.wantSolicited || !na.Override ||
				targetMAC(na) != nodeMAC.String() {
				t.Errorf("sent %+v to %s; want an override advertisement for %s at %s to %s, solicited %v",
					sent[0].m, sent[0].to, tc.target, nodeMAC, tc.wantTo, tc.wantSolicited)
			}
		})
	}
}

func TestNDPPerClientAnswersOnlyTheNodesShare(t *testing.T) {
	n := newFakeNode(t, Options{})
	n.set(perClient(vip6, "node-a", members...))
	var mine, theirs netip.Addr
	for i := range 100 {
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 15: byte(i + 1)})
		if rendezvous.Owner(a, members) == "node-a" && !mine.IsValid() {
			mine = a
		} else if rendezvous.Owner(a, members) == "node-b" && !theirs.IsValid() {
			theirs = a
		}
	}
	n.solicit(vip6, mine, clientMAC, 255)
	n.solicit(vip6, theirs, clientMAC, 255)
	sent := n.ndp["eth0"].ndpSent()
	if len(sent) != 1 || sent[0].to != mine {
		t.Errorf("advertisements %+v; want one, to node-a's client %s", sent, mine)
	}
	if known, answered := n.s.Clients(vip6); known != 2 || answered != 1 {
		t.Errorf("Clients = %d known, %d answered; want 2, 1", known, answered)
	}
	if got := n.s.Counters().UnsolicitedAdvertisements; got != 0 {
		t.Errorf("%d unsolicited advertisements for a per-client VIP; want none", got)
	}
}
