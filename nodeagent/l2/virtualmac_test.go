package l2

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

var vmac = net.HardwareAddr{0x02, 0x00, 0xcb, 0x00, 0x71, 0x0a}

func TestAVIPWithAVirtualMACIsAnsweredAndAnnouncedWithIt(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 2})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, MAC: vmac}, VIP{Addr: otherVIP4, Interfaces: []string{"eth0"}})
	waitFor(t, "both takeovers' bursts", func() bool { return len(n.gratuitous(vip4)) == 4 && len(n.gratuitous(otherVIP4)) == 4 })
	for _, g := range n.gratuitous(vip4) {
		if g.p.SenderHardwareAddr.String() != vmac.String() {
			t.Errorf("gratuitous ARP for %s names %s; want the virtual MAC %s (the frame comes from the sender address)", vip4, g.p.SenderHardwareAddr, vmac)
		}
	}
	for _, g := range n.gratuitous(otherVIP4) {
		if g.p.SenderHardwareAddr.String() != nodeMAC.String() {
			t.Errorf("gratuitous ARP for %s, which has no virtual MAC, names %s; want the interface's %s", otherVIP4, g.p.SenderHardwareAddr, nodeMAC)
		}
	}
	n.arp["eth0"].reset()
	n.ask(vip4, clientIP, clientMAC)
	n.ask(otherVIP4, clientIP, clientMAC)
	if r := n.replies(vip4); len(r) != 1 || r[0].p.SenderHardwareAddr.String() != vmac.String() || r[0].to.String() != clientMAC.String() {
		t.Errorf("replies for %s: %+v; want one naming %s, to the client", vip4, r, vmac)
	}
	if r := n.replies(otherVIP4); len(r) != 1 || r[0].p.SenderHardwareAddr.String() != nodeMAC.String() {
		t.Errorf("replies for %s: %+v; want one naming the interface's MAC", otherVIP4, r)
	}
}

func TestAVIPThatGetsAVirtualMACIsAnnouncedAgain(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	waitFor(t, "the takeover's announcement", func() bool { return len(n.gratuitous(vip4)) == 2 })
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, MAC: vmac})
	waitFor(t, "an announcement of the virtual MAC", func() bool { return len(n.gratuitous(vip4)) == 4 })
	if g := n.gratuitous(vip4)[3]; g.p.SenderHardwareAddr.String() != vmac.String() {
		t.Errorf("the new announcement names %s; want %s", g.p.SenderHardwareAddr, vmac)
	}
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, MAC: vmac})
	time.Sleep(20 * time.Millisecond)
	if got := len(n.gratuitous(vip4)); got != 4 {
		t.Errorf("%d announcements after the same Set again; want the 4 before", got)
	}
}

func TestNothingIsSentForAVirtualMACOnceSetDropsIt(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1000, BurstInterval: time.Millisecond})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, MAC: vmac})
	waitFor(t, "the burst under way", func() bool { return len(n.gratuitous(vip4)) >= 10 })
	n.s.SetRefresh(time.Millisecond)
	n.set(VIP{Addr: otherVIP4, Interfaces: []string{"eth0"}})
	after := len(n.gratuitous(vip4))
	n.ask(vip4, clientIP, clientMAC)
	time.Sleep(30 * time.Millisecond) // thirty burst intervals and refreshes
	if got := len(n.gratuitous(vip4)); got != after {
		t.Errorf("%d announcements of the dropped VIP after Set returned", got-after)
	}
	if r := n.replies(vip4); len(r) != 0 {
		t.Errorf("the dropped VIP answered: %+v", r)
	}
}

func TestAnIPv6VIPWithAVirtualMACIsAdvertisedFromIt(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(VIP{Addr: vip6, Interfaces: []string{"eth0"}, MAC: vmac})
	waitFor(t, "the takeover's advertisement", func() bool { return len(n.frames["eth0"].ndpSent()) == 1 })
	check := func(what string, s sentNDP, to netip.Addr, toMAC net.HardwareAddr, solicited bool) {
		t.Helper()
		na, ok := s.m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != vip6 || na.Solicited != solicited || !na.Override || targetLinkLayer(na).String() != vmac.String() {
			t.Errorf("%s: %+v; want an override advertisement of %s at %s, solicited %v", what, s.m, vip6, vmac, solicited)
		}
		if s.to != to || s.toMAC.String() != toMAC.String() || (toMAC != nil && s.from.String() != vmac.String()) {
			t.Errorf("%s sent to %s at %s from %s; want to %s at %s from %s", what, s.to, s.toMAC, s.from, to, toMAC, vmac)
		}
	}
	check("the announcement", n.frames["eth0"].ndpSent()[0], netip.IPv6LinkLocalAllNodes(), allNodesMAC, false)

	client := netip.MustParseAddr("2001:db8:1::100")
	n.solicit(vip6, client, clientMAC, 255)
	sent := n.frames["eth0"].ndpSent()
	if len(sent) != 2 {
		t.Fatalf("%d frames; want the answer to a solicitation with the client's MAC in one from the virtual MAC", len(sent))
	}
	check("the answer", sent[1], client, clientMAC, true)

	// A unicast solicitation may give no source MAC: the raw socket answers (the kernel
	// knows the client's MAC), still naming the virtual MAC.
	n.solicit(vip6, client, nil, 255)
	raw := n.ndp["eth0"].ndpSent()
	if len(raw) != 1 {
		t.Fatalf("%d advertisements on the raw socket; want the answer to a solicitation without a source MAC", len(raw))
	}
	check("the answer without a source MAC", raw[0], client, nil, true)
}

func targetLinkLayer(na *ndp.NeighborAdvertisement) net.HardwareAddr {
	for _, o := range na.Options {
		if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
			return l.Addr
		}
	}
	return nil
}

func TestSetRefusesAVirtualMACItCannotUseAndKeepsTheRest(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	sh := perClient(otherVIP4, "node-a", members...)
	sh.MAC = vmac
	err := n.s.Set([]VIP{
		{Addr: vip4, Interfaces: []string{"eth0"}, MAC: vmac},
		sh,
		{Addr: vip6, Interfaces: []string{"eth0"}, MAC: net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}},
		{Addr: otherVIP6, Interfaces: []string{"eth0"}, MAC: net.HardwareAddr{0, 0, 0, 0, 0, 0}},
	})
	for _, want := range []string{
		"VIP 203.0.113.11: a virtual MAC cannot be shared per client",
		"VIP 2001:db8:100::10: virtual MAC 01:00:5e:00:00:01 is not a unicast Ethernet address",
		"VIP 2001:db8:100::11: virtual MAC 00:00:00:00:00:00 is not a unicast",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set = %v; want it to say %q", err, want)
		}
	}
	if owned := n.s.Owned(); len(owned) != 1 || owned[vip4] == nil {
		t.Errorf("owned %v; want the good VIP alone", owned)
	}
	n.ask(vip4, clientIP, clientMAC)
	if r := n.replies(vip4); len(r) != 1 || r[0].p.Operation != arp.OperationReply {
		t.Errorf("the good VIP's replies: %+v", r)
	}
}
