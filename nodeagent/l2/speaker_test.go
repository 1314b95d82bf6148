package l2

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// gratuitous returns the gratuitous ARPs (sender and target the VIP, to broadcast) sent on
// eth0 for vip.
func (n *fakeNode) gratuitous(vip netip.Addr) []sentARP {
	var out []sentARP
	for _, s := range n.arp["eth0"].arpSent() {
		if s.p.SenderIP == vip && s.p.TargetIP == vip {
			out = append(out, s)
		}
	}
	return out
}

// A takeover of a thousand VIPs is announced from one goroutine, each VIP its burst of three,
// in the order given: not a goroutine per VIP, all waking together for the speaker's lock.
func TestATakeoverOfAThousandVIPsIsAnnouncedByOneGoroutine(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 3})
	var vips []VIP
	for i := range 1000 {
		vips = append(vips, VIP{Addr: netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), Interfaces: []string{"eth0"}})
	}
	base := runtime.NumGoroutine()
	n.set(vips...)
	if g := runtime.NumGoroutine(); g > base+2 {
		t.Errorf("%d goroutines after a takeover of 1,000 VIPs, %d before", g, base)
	}
	waitFor(t, "3 requests and 3 replies for each of the 1,000 VIPs", func() bool { return len(n.arp["eth0"].arpSent()) == 6000 })
	// The first round is every VIP once, in the order given, before any VIP's repeat, however
	// slowly the machine sends (a repeat is due 1 ms after a VIP's first announcement).
	sent := n.arp["eth0"].arpSent()
	for i, v := range vips {
		if req, rep := sent[2*i].p.SenderIP, sent[2*i+1].p.SenderIP; req != v.Addr || rep != v.Addr {
			t.Fatalf("announcements %d and %d of the first round were for %s and %s; want %s: the VIPs in the order given, none repeated before all are announced", 2*i, 2*i+1, req, rep, v.Addr)
		}
	}
}

func TestTakeoverAnnouncesWithABurst(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 3})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	waitFor(t, "a burst of 3 requests and 3 replies", func() bool { return len(n.gratuitous(vip4)) == 6 })
	ops := map[arp.Operation]int{}
	for _, g := range n.gratuitous(vip4) {
		ops[g.p.Operation]++
		if g.to.String() != ethernet.Broadcast.String() || g.p.SenderHardwareAddr.String() != nodeMAC.String() {
			t.Errorf("gratuitous ARP %+v to %s; want the node's MAC, to broadcast", g.p, g.to)
		}
	}
	if ops[arp.OperationRequest] != 3 || ops[arp.OperationReply] != 3 {
		t.Errorf("gratuitous ARPs by operation %v; want 3 requests and 3 replies", ops)
	}

	t.Run("the same set again announces nothing more", func(t *testing.T) {
		n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
		time.Sleep(20 * time.Millisecond) // a burst would have begun: its interval is 1 ms
		if got := len(n.gratuitous(vip4)); got != 6 {
			t.Errorf("%d gratuitous ARPs after the same Set; want the 6 of the takeover", got)
		}
	})
	t.Run("a VIP kept, with Again raised, is announced again", func(t *testing.T) {
		n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, Again: 1})
		waitFor(t, "a second burst", func() bool { return len(n.gratuitous(vip4)) == 12 })
		n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, Again: 1})
		time.Sleep(20 * time.Millisecond)
		if got := len(n.gratuitous(vip4)); got != 12 {
			t.Errorf("%d gratuitous ARPs after a Set with the same Again; want the 12 of the two bursts", got)
		}
	})
	t.Run("a per-client VIP is never announced", func(t *testing.T) {
		n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}}, perClient(otherVIP4, "node-a", members...))
		time.Sleep(20 * time.Millisecond)
		if got := len(n.gratuitous(otherVIP4)); got != 0 {
			t.Errorf("%d gratuitous ARPs for a per-client VIP; want none", got)
		}
	})
	t.Run("an IPv6 VIP is announced by unsolicited advertisements to all nodes", func(t *testing.T) {
		n.set(VIP{Addr: vip6, Interfaces: []string{"eth0"}})
		waitFor(t, "3 unsolicited advertisements", func() bool { return len(n.ndp["eth0"].ndpSent()) == 3 })
		for _, s := range n.ndp["eth0"].ndpSent() {
			na, ok := s.m.(*ndp.NeighborAdvertisement)
			if !ok || na.Solicited || !na.Override || na.TargetAddress != vip6 || s.to != netip.IPv6LinkLocalAllNodes() {
				t.Errorf("sent %+v to %s; want an unsolicited override advertisement for %s to all nodes", s.m, s.to, vip6)
			}
		}
	})
}

func TestRefreshAnnouncesOwnedVIPsAgain(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}}, perClient(otherVIP4, "node-a", members...))
	waitFor(t, "the takeover's announcement", func() bool { return len(n.gratuitous(vip4)) == 2 })
	n.s.SetRefresh(5 * time.Millisecond)
	waitFor(t, "two refreshes", func() bool { return len(n.gratuitous(vip4)) >= 6 })
	if got := len(n.gratuitous(otherVIP4)); got != 0 {
		t.Errorf("%d refreshes of a per-client VIP; want none", got)
	}
	n.s.SetRefresh(0) // back to the hour given at New
	time.Sleep(10 * time.Millisecond)
	before := len(n.gratuitous(vip4))
	time.Sleep(30 * time.Millisecond)
	if got := len(n.gratuitous(vip4)); got != before {
		t.Errorf("%d more announcements in 30 ms after the refresh went back to an hour", got-before)
	}
}

// learnClients makes node-a's speaker, sharing vip with node-b, learn n clients of each node
// (each seen twice, so kept) and returns them by owner.
func learnClients(t *testing.T, n *fakeNode, vip netip.Addr, count int) map[string][]netip.Addr {
	t.Helper()
	out := map[string][]netip.Addr{}
	for _, owner := range members {
		for i := range count {
			ip := clientOf(t, owner, members, i)
			mac := net.HardwareAddr{0x02, 0, 0, 0, 1, ip.As4()[3]}
			n.ask(vip, ip, mac)
			n.ask(vip, ip, mac)
			out[owner] = append(out[owner], ip)
		}
	}
	return out
}

func TestTakeoverTellsExactlyTheClientsTakenOver(t *testing.T) {
	n := newFakeNode(t, Options{})
	n.set(perClient(vip4, "node-a", members...))
	byOwner := learnClients(t, n, vip4, 4)
	n.arp["eth0"].reset()

	// node-b goes: node-a tells each of node-b's clients, at its own MAC, and no one else.
	n.set(perClient(vip4, "node-a", "node-a"))
	told := map[netip.Addr]string{}
	for _, r := range n.replies(vip4) {
		if r.to.String() != r.p.TargetHardwareAddr.String() || r.p.SenderHardwareAddr.String() != nodeMAC.String() {
			t.Errorf("targeted reply %+v to %s; want it unicast to the client, naming the node", r.p, r.to)
		}
		told[r.p.TargetIP] = r.to.String()
	}
	want := map[netip.Addr]string{}
	for _, ip := range byOwner["node-b"] {
		want[ip] = net.HardwareAddr{0x02, 0, 0, 0, 1, ip.As4()[3]}.String()
	}
	if !mapsEqual(told, want) {
		t.Errorf("told %v; want node-b's clients at their MACs %v", told, want)
	}
	if got := n.s.Counters().TargetedReplies; got != uint64(len(want)) {
		t.Errorf("TargetedReplies = %d; want %d", got, len(want))
	}

	// node-b returns: node-a takes nobody over, so tells nobody.
	n.arp["eth0"].reset()
	n.set(perClient(vip4, "node-a", members...))
	if got := n.replies(vip4); len(got) != 0 {
		t.Errorf("%d replies when node-a's share shrank; want none", len(got))
	}
}

func TestTakeoverTellsIPv6ClientsByAdvertisement(t *testing.T) {
	n := newFakeNode(t, Options{})
	n.set(perClient(vip6, "node-a", members...))
	var theirs []netip.Addr
	for i := range 40 {
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 15: byte(i + 1)})
		n.solicit(vip6, a, net.HardwareAddr{0x02, 0, 0, 0, 2, byte(i + 1)}, 255)
		if clientOwner(a) == "node-b" {
			theirs = append(theirs, a)
		}
	}
	n.ndp["eth0"].reset()
	n.set(perClient(vip6, "node-a", "node-a"))
	var told []netip.Addr
	for _, s := range n.ndp["eth0"].ndpSent() {
		if na, ok := s.m.(*ndp.NeighborAdvertisement); ok && na.TargetAddress == vip6 && !na.Solicited {
			told = append(told, s.to)
		}
	}
	slices.SortFunc(told, netip.Addr.Compare)
	slices.SortFunc(theirs, netip.Addr.Compare)
	if len(theirs) == 0 || !slices.Equal(told, theirs) {
		t.Errorf("advertised to %v; want node-b's clients %v", told, theirs)
	}
}

func clientOwner(a netip.Addr) string { return (&Share{Members: members}).owner(a) }

func (sh *Share) owner(a netip.Addr) string {
	for _, m := range sh.Members {
		if (&Share{Self: m, Members: sh.Members}).answers(a) {
			return m
		}
	}
	return ""
}

func TestTakeoverTellsClientsThatAskedTwiceFirst(t *testing.T) {
	n := newFakeNode(t, Options{})
	n.set(perClient(vip4, "node-a", members...))
	once, twice := clientOf(t, "node-b", members, 0), clientOf(t, "node-b", members, 1)
	n.ask(vip4, twice, node2MAC)
	n.ask(vip4, twice, node2MAC)
	n.ask(vip4, once, clientMAC) // the most recent, but seen once
	n.arp["eth0"].reset()
	n.set(perClient(vip4, "node-a", "node-a"))
	r := n.replies(vip4)
	if len(r) != 2 || r[0].p.TargetIP != twice || r[1].p.TargetIP != once {
		t.Errorf("told in order %v; want %s (asked twice) before %s (once)", targets(r), twice, once)
	}
}

func targets(r []sentARP) []netip.Addr {
	var out []netip.Addr
	for _, s := range r {
		out = append(out, s.p.TargetIP)
	}
	return out
}

func mapsEqual(a, b map[netip.Addr]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Bad input is refused with a clear error and disturbs nothing else.
func TestSetRefusesWhatItCannotAnswerAndKeepsTheRest(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	err := n.s.Set([]VIP{
		{Addr: vip4, Interfaces: []string{"eth0"}},
		{Addr: otherVIP4, Interfaces: []string{"nosuch0"}},
		{Addr: vip6},
		{Addr: otherVIP6, Interfaces: []string{"lo"}},
	})
	for _, want := range []string{"VIP 203.0.113.11 on nosuch0", "VIP 2001:db8:100::10: no interface", "VIP 2001:db8:100::11 on lo: interface lo has no Ethernet address"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set error %v; want it to say %q", err, want)
		}
	}
	if owned := n.s.Owned(); len(owned) != 1 || len(owned[vip4]) != 1 {
		t.Errorf("owned after a partly bad Set = %v; the good VIP must stay", owned)
	}
	n.ask(vip4, clientIP, clientMAC)
	if got := n.replies(vip4); len(got) != 1 {
		t.Errorf("the good VIP answered %d times after a partly bad Set; want 1", len(got))
	}
}

func TestSetReportsASocketThatDoesNotOpen(t *testing.T) {
	opts := Options{
		LookupInterface: func(string) (*net.Interface, error) {
			return &net.Interface{Index: 2, Name: "eth0", HardwareAddr: nodeMAC}, nil
		},
		OpenARP: func(*net.Interface) (ARPConn, error) { return nil, errors.New("operation not permitted") },
	}
	s := New(opts)
	defer s.Close()
	err := s.Set([]VIP{{Addr: vip4, Interfaces: []string{"eth0"}}})
	if err == nil || !strings.Contains(err.Error(), "VIP 203.0.113.10 on eth0: open ARP socket: operation not permitted") {
		t.Errorf("Set = %v; want the socket's error with the VIP and interface", err)
	}
	if len(s.Owned()) != 0 {
		t.Errorf("owned %v with no socket", s.Owned())
	}
}

func TestCloseEndsTheLoopsAndRefusesNewSockets(t *testing.T) {
	n := newFakeNode(t, Options{})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}}, VIP{Addr: vip6, Interfaces: []string{"eth0"}})
	done := make(chan error, 1)
	go func() { done <- n.s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5 s")
	}
	if err := n.s.Set([]VIP{{Addr: otherVIP4, Interfaces: []string{"eth1"}}}); err == nil {
		t.Error("Set after Close opened a socket")
	}
}
