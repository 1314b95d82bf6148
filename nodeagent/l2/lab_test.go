package l2

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"go.uber.org/goleak"
	"golang.org/x/net/ipv6"

	"github.com/metalvip/metalvip/internal/rendezvous"
	"github.com/metalvip/metalvip/test/lab"
)

// The tests in this file use real sockets in the lab's network namespaces (root). The
// speaker's decisions are tested without root, on fake connections, in the other test files.

func TestMain(m *testing.M) {
	// The test harness's process starter lives as long as the test binary, by design.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/metalvip/metalvip/test/testenv.spawner"))
}

var (
	vip4      = netip.MustParseAddr("203.0.113.10")
	otherVIP4 = netip.MustParseAddr("203.0.113.11")
	vip6      = netip.MustParseAddr("2001:db8:100::10")
	otherVIP6 = netip.MustParseAddr("2001:db8:100::11")
)

// speakerOn starts a speaker inside a node's namespace; Set must run there too, since it opens
// the sockets.
func speakerOn(t *testing.T, h *lab.Host) (*Speaker, func(...VIP)) {
	t.Helper()
	s := New(Options{Refresh: time.Hour, BurstInterval: 20 * time.Millisecond})
	t.Cleanup(func() { s.Close() })
	return s, func(vips ...VIP) {
		t.Helper()
		if err := h.Do(func() error { return s.Set(vips) }); err != nil {
			t.Fatalf("Set(%v): %v", vips, err)
		}
	}
}

func macOf(t *testing.T, h *lab.Host) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// arpClient opens an ARP socket on the host's eth0.
func arpClient(t *testing.T, h *lab.Host) *arp.Client {
	t.Helper()
	c, err := h.DialARP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readARP returns the first ARP packet matching keep within timeout, or nil.
func readARP(t *testing.T, c *arp.Client, timeout time.Duration, keep func(*arp.Packet) bool) *arp.Packet {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_ = c.SetReadDeadline(deadline)
		p, _, err := c.Read()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			continue
		}
		if keep(p) {
			return p
		}
	}
	return nil
}

func TestARPAnswersOnlyOwnedVIPs(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 2})
	node, client := l.Nodes[0], l.Client
	s, set := speakerOn(t, node)
	set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	mac := macOf(t, node)
	c := arpClient(t, client)

	ask := func(target netip.Addr) *arp.Packet {
		if err := c.Request(target); err != nil {
			t.Fatal(err)
		}
		return readARP(t, c, time.Second, func(p *arp.Packet) bool {
			return p.Operation == arp.OperationReply && p.SenderIP == target
		})
	}
	reply := ask(vip4)
	if reply == nil {
		t.Fatalf("no ARP reply for owned %s", vip4)
	}
	if reply.SenderHardwareAddr.String() != mac.String() {
		t.Errorf("reply for %s names %s, want the node's %s", vip4, reply.SenderHardwareAddr, mac)
	}
	if r := ask(otherVIP4); r != nil {
		t.Errorf("a reply for %s, which no node owns: %+v", otherVIP4, r)
	}
	// The node's own kernel must not answer for VIPs either (arp_ignore): the other node has
	// every VIP as a local route and no speaker.
	if got := s.Counters(); got.ARPReplies < 1 || got.ARPRequests < 2 {
		t.Errorf("counters %+v; want at least 2 requests seen and 1 reply", got)
	}

	// Released: no more answers.
	set()
	if r := ask(vip4); r != nil {
		t.Errorf("a reply for %s after it was released: %+v", vip4, r)
	}
}

func TestTakeoverSendsGratuitousARP(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	node := l.Nodes[0]
	s, set := speakerOn(t, node)
	mac := macOf(t, node)
	listener := arpClient(t, l.Client)

	start := time.Now()
	set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	p := readARP(t, listener, 2*time.Second, func(p *arp.Packet) bool {
		return p.SenderIP == vip4 && p.TargetIP == vip4
	})
	if p == nil {
		t.Fatal("no gratuitous ARP for the VIP taken over")
	}
	if p.SenderHardwareAddr.String() != mac.String() {
		t.Errorf("gratuitous ARP names %s, want %s", p.SenderHardwareAddr, mac)
	}
	t.Logf("gratuitous ARP seen %s after the takeover", time.Since(start).Round(time.Microsecond))
	// The burst (3 times request and reply) completes.
	deadline := time.Now().Add(2 * time.Second)
	for s.Counters().GratuitousARPs < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Counters().GratuitousARPs; got != 6 {
		t.Errorf("%d gratuitous ARPs sent, want a burst of 6", got)
	}
}

func TestRefreshAnnouncesAgain(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	node := l.Nodes[0]
	s := New(Options{Refresh: time.Hour, Burst: 1})
	s.SetRefresh(200 * time.Millisecond) // as an Apply with gratuitous_refresh_seconds does
	t.Cleanup(func() { s.Close() })
	if err := node.Do(func() error { return s.Set([]VIP{{Addr: vip4, Interfaces: []string{"eth0"}}}) }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Counters().GratuitousARPs < 6 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := s.Counters().GratuitousARPs; got < 6 {
		t.Errorf("%d gratuitous ARPs after refreshes; want the takeover's and at least two refreshes' (6)", got)
	}
}

// clientNDP opens an NDP socket on the host's eth0 that sees advertisements.
func clientNDP(t *testing.T, h *lab.Host) *ndpConn {
	t.Helper()
	var c *ndpConn
	if err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = listenNDP(ifi, ipv6.ICMPTypeNeighborAdvertisement)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readNA(t *testing.T, c *ndpConn, timeout time.Duration, target netip.Addr) *ndp.NeighborAdvertisement {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_ = c.pc.SetReadDeadline(deadline)
		m, _, _, err := c.ReadFrom()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			continue
		}
		if na, ok := m.(*ndp.NeighborAdvertisement); ok && na.TargetAddress == target {
			return na
		}
	}
	return nil
}

func targetMAC(na *ndp.NeighborAdvertisement) string {
	for _, o := range na.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
			return lla.Addr.String()
		}
	}
	return ""
}

func TestNDPAnswersOnlyOwnedVIPsAndAdvertisesTakeover(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	node := l.Nodes[0]
	s, set := speakerOn(t, node)
	mac := macOf(t, node)
	c := clientNDP(t, l.Client)
	clientMAC := macOf(t, l.Client)

	set(VIP{Addr: vip6, Interfaces: []string{"eth0"}})
	na := readNA(t, c, 2*time.Second, vip6)
	if na == nil || na.Solicited || !na.Override || targetMAC(na) != mac.String() {
		t.Fatalf("unsolicited advertisement on takeover = %+v; want override, not solicited, naming %s", na, mac)
	}

	solicit := func(target netip.Addr) *ndp.NeighborAdvertisement {
		snm, err := ndp.SolicitedNodeMulticast(target)
		if err != nil {
			t.Fatal(err)
		}
		ns := &ndp.NeighborSolicitation{TargetAddress: target, Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: clientMAC},
		}}
		if err := c.WriteTo(ns, nil, snm); err != nil {
			t.Fatal(err)
		}
		for {
			na := readNA(t, c, time.Second, target)
			if na == nil || na.Solicited {
				return na
			}
			// An unsolicited one left from the takeover burst: keep reading.
		}
	}
	na = solicit(vip6)
	if na == nil {
		t.Fatalf("no advertisement for owned %s", vip6)
	}
	if targetMAC(na) != mac.String() || !na.Solicited {
		t.Errorf("advertisement %+v; want solicited, naming %s", na, mac)
	}
	if na := solicit(otherVIP6); na != nil {
		t.Errorf("an advertisement for %s, which no node owns: %+v", otherVIP6, na)
	}
	if got := s.Counters(); got.NeighborAdvertisements < 1 || got.UnsolicitedAdvertisements < 1 {
		t.Errorf("counters %+v", got)
	}
}

// TestSetRefusesMissingInterfaces checks that bad input is refused with a clear error and
// disturbs nothing else.
func TestSetRefusesMissingInterfaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("opening raw sockets needs root")
	}
	l := lab.New(t, lab.Options{Nodes: 1})
	s, set := speakerOn(t, l.Nodes[0])
	set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	err := l.Nodes[0].Do(func() error {
		return s.Set([]VIP{{Addr: vip4, Interfaces: []string{"eth0"}}, {Addr: otherVIP4, Interfaces: []string{"nosuch0"}}, {Addr: vip6}})
	})
	if err == nil {
		t.Fatal("Set accepted a missing interface and a VIP without interfaces")
	}
	if owned := s.Owned(); len(owned[vip4]) != 1 || len(owned) != 1 {
		t.Errorf("owned after a partly bad Set = %v; the good VIP must stay", owned)
	}
}

// askFrom sends an ARP request for vip from each client address through c, and returns which
// node MAC answered each client within a second.
func askFrom(t *testing.T, c *arp.Client, mac net.HardwareAddr, vip netip.Addr, clients []netip.Addr) map[netip.Addr][]string {
	t.Helper()
	for _, a := range clients {
		p, err := arp.NewPacket(arp.OperationRequest, mac, a, ethernet.Broadcast, vip)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
			t.Fatal(err)
		}
	}
	got := map[netip.Addr][]string{}
	readARP(t, c, time.Second, func(p *arp.Packet) bool {
		if p.Operation == arp.OperationReply && p.SenderIP == vip && slices.Contains(clients, p.TargetIP) {
			got[p.TargetIP] = append(got[p.TargetIP], p.SenderHardwareAddr.String())
		}
		return false // read until the deadline
	})
	return got
}

// twoNodesManyClients builds a lab of two nodes, named node-a and node-b, and a client with n
// extra addresses; it returns those addresses and the nodes' names by MAC.
func twoNodesManyClients(t *testing.T, n int) (l *lab.Lab, clients []netip.Addr, names []string, macs map[string]string) {
	t.Helper()
	l = lab.New(t, lab.Options{Nodes: 2, ClientAddrs: n})
	for i := range n {
		clients = append(clients, lab.ClientAddr(i))
	}
	names = []string{"node-a", "node-b"}
	macs = map[string]string{}
	for i, h := range l.Nodes {
		macs[macOf(t, h).String()] = names[i]
	}
	return l, clients, names, macs
}

// TestPerClientAnswersOnlyOwnClients checks the per-client share: two nodes answer one VIP,
// each only for the clients rendezvous hashing gives it, with no gratuitous ARP; when one
// member goes, the other tells exactly the clients it takes over, by unicast reply.
func TestPerClientAnswersOnlyOwnClients(t *testing.T) {
	const n = 20
	l, clients, names, macs := twoNodesManyClients(t, n)
	speakers := map[string]*Speaker{}
	sets := map[string]func(...VIP){}
	for i, h := range l.Nodes {
		speakers[names[i]], sets[names[i]] = speakerOn(t, h)
	}
	c := arpClient(t, l.Client)
	clientMAC := macOf(t, l.Client)

	share := func(self string, members ...string) VIP {
		return VIP{Addr: vip4, Interfaces: []string{"eth0"}, Share: &Share{Self: self, Members: members}}
	}
	for _, name := range names {
		sets[name](share(name, names...))
	}
	got := askFrom(t, c, clientMAC, vip4, clients)
	served := map[string]int{}
	for _, a := range clients {
		want := rendezvous.Owner(a, names)
		if len(got[a]) != 1 || macs[got[a][0]] != want {
			t.Errorf("client %s answered by %v; want only %s", a, got[a], want)
		}
		served[want]++
	}
	if served["node-a"] == 0 || served["node-b"] == 0 {
		t.Fatalf("the hash gave every client to one node: %v", served)
	}
	for name, s := range speakers {
		if g := s.Counters().GratuitousARPs; g != 0 {
			t.Errorf("%s sent %d gratuitous ARPs for a per-client VIP; want none", name, g)
		}
		if known, answered := s.Clients(vip4); known != n || answered != served[name] {
			t.Errorf("%s Clients = %d known, %d answered; want %d, %d", name, known, answered, n, served[name])
		}
	}

	// node-a goes: node-b, told it is alone, sends each of node-a's clients a unicast reply.
	sets["node-a"]()
	sets["node-b"](share("node-b", "node-b"))
	told := map[netip.Addr]int{}
	readARP(t, c, 2*time.Second, func(p *arp.Packet) bool {
		if p.Operation == arp.OperationReply && p.SenderIP == vip4 && macs[p.SenderHardwareAddr.String()] == "node-b" {
			told[p.TargetIP]++
		}
		return len(told) == served["node-a"]
	})
	for _, a := range clients {
		if owner := rendezvous.Owner(a, names); (owner == "node-a") != (told[a] == 1) {
			t.Errorf("client %s (was %s's) told %d times; want once exactly for node-a's clients", a, owner, told[a])
		}
	}
	if got := speakers["node-b"].Counters().TargetedReplies; got != uint64(served["node-a"]) {
		t.Errorf("node-b counted %d targeted replies; want %d", got, served["node-a"])
	}
	// Now node-b answers everyone.
	got = askFrom(t, c, clientMAC, vip4, clients)
	for _, a := range clients {
		if len(got[a]) != 1 || macs[got[a][0]] != "node-b" {
			t.Errorf("client %s answered by %v after node-a left; want only node-b", a, got[a])
		}
	}
}

// TestRememberedClientsAreTold checks that a restarted speaker, given the clients its
// predecessor knew, tells them when it takes them over though it has not seen them ask.
func TestRememberedClientsAreTold(t *testing.T) {
	const n = 12
	l, clients, names, macs := twoNodesManyClients(t, n)
	c := arpClient(t, l.Client)
	share := func(self string, members ...string) VIP {
		return VIP{Addr: vip4, Interfaces: []string{"eth0"}, Share: &Share{Self: self, Members: members}}
	}
	_, setA := speakerOn(t, l.Nodes[0])
	b, setB := speakerOn(t, l.Nodes[1])
	setA(share("node-a", names...))
	setB(share("node-b", names...))
	// Clients are kept across a restart once they asked twice.
	askFrom(t, c, macOf(t, l.Client), vip4, clients)
	askFrom(t, c, macOf(t, l.Client), vip4, clients)
	known, _ := b.KnownClients()
	if len(known) != n {
		t.Fatalf("node-b knows %d clients; want %d", len(known), n)
	}

	// node-b restarts: a new speaker, given what the old one knew.
	b.Close()
	b2, setB2 := speakerOn(t, l.Nodes[1])
	b2.Remember(known)
	setB2(share("node-b", names...))
	// node-a goes: node-b tells node-a's clients, none of which asked it since its restart.
	start := time.Now()
	setA()
	setB2(share("node-b", "node-b"))
	told := map[netip.Addr]bool{}
	var wantTold int
	for _, ip := range clients {
		if rendezvous.Owner(ip, names) == "node-a" {
			wantTold++
		}
	}
	readARP(t, c, 2*time.Second, func(p *arp.Packet) bool {
		if p.Operation == arp.OperationReply && p.SenderIP == vip4 && macs[p.SenderHardwareAddr.String()] == "node-b" &&
			rendezvous.Owner(p.TargetIP, names) == "node-a" {
			told[p.TargetIP] = true
		}
		return len(told) == wantTold
	})
	if len(told) != wantTold || wantTold == 0 {
		t.Errorf("the restarted node-b told %d of node-a's %d clients within %s", len(told), wantTold, time.Since(start).Round(time.Millisecond))
	}
	if got, _ := b2.KnownClients(); len(got) != n {
		t.Errorf("the restarted node-b knows %d clients; want the %d remembered", len(got), n)
	}
}
