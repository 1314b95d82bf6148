package lab

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

func TestSpareAddrsAvoidEveryHost(t *testing.T) {
	l := &Lab{opts: Options{Nodes: 3, ClientAddrs: 2}}
	l.Router = &Host{IPv4: netip.MustParseAddr("198.51.100.1")}
	l.Control = &Host{IPv4: netip.MustParseAddr("198.51.100.2")}
	l.Client = &Host{IPv4: netip.MustParseAddr("198.51.100.100")}
	l.Switch, l.Remote = &Host{}, &Host{IPv4: netip.MustParseAddr("198.51.100.130")}
	for i := range 3 {
		l.Nodes = append(l.Nodes, &Host{IPv4: netip.AddrFrom4([4]byte{198, 51, 100, byte(11 + i)})})
	}
	spare := l.SpareAddrs()
	for _, used := range []string{"198.51.100.0", "198.51.100.1", "198.51.100.2", "198.51.100.11", "198.51.100.13", "198.51.100.51", "198.51.100.52", "198.51.100.100", "198.51.100.127"} {
		if slices.Contains(spare, netip.MustParseAddr(used)) {
			t.Errorf("%s is spare; it is taken", used)
		}
	}
	if want := 128 - 2 - (2 + 3 + 1 + 2); len(spare) != want { // less network and broadcast, router and control, nodes, client, its extras
		t.Errorf("%d spare addresses; want %d", len(spare), want)
	}
}

// Link clients have MACs of their own and each hears what is sent to it; forged requests
// reach the segment in frames from the MAC they name.
func TestLinkClientsAndForgedRequests(t *testing.T) {
	l := New(t, Options{Nodes: 1})
	node := l.Nodes[0]
	cs, err := l.Client.AddLinkClients(l.SpareAddrs()[:3])
	if err != nil {
		t.Fatal(err)
	}
	macs := map[string]bool{}
	for _, c := range cs {
		macs[c.MAC.String()] = true
	}
	if len(macs) != 3 {
		t.Fatalf("link clients' MACs %v; want three distinct", macs)
	}
	// The first asks for the node's address; the node's kernel answers it alone.
	if err := cs[0].Ask(node.IPv4); err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		got := readReply(c.ARP, node.IPv4, 500*time.Millisecond)
		if (got != nil) != (i == 0) {
			t.Errorf("link client %d heard the reply: %v; want only the one that asked", i, got != nil)
		}
		if got != nil && (got.TargetIP != c.Addr || got.TargetHardwareAddr.String() != c.MAC.String()) {
			t.Errorf("reply %+v; want it to %s at %s", got, c.Addr, c.MAC)
		}
	}

	listener, err := node.DialARP()
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	forged := net.HardwareAddr{0x02, 0xf0, 0, 0, 0, 1}
	p, err := arp.NewPacket(arp.OperationRequest, forged, netip.MustParseAddr("198.18.0.1"), ethernet.Broadcast, netip.MustParseAddr("203.0.113.99"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Control.ForgeARP([]*arp.Packet{p, p, p}); err != nil {
		t.Fatal(err)
	}
	seen := 0
	deadline := time.Now().Add(time.Second)
	_ = listener.SetReadDeadline(deadline)
	for seen < 3 && time.Now().Before(deadline) {
		q, eth, err := listener.Read()
		if err != nil {
			if IsTimeout(err) {
				break
			}
			continue
		}
		if q.SenderHardwareAddr.String() == forged.String() && eth.Source.String() == forged.String() {
			seen++
		}
	}
	if seen != 3 {
		t.Errorf("the node saw %d of 3 forged requests in frames from the forged MAC", seen)
	}
}

func readReply(c *arp.Client, from netip.Addr, wait time.Duration) *arp.Packet {
	deadline := time.Now().Add(wait)
	_ = c.SetReadDeadline(deadline)
	for time.Now().Before(deadline) {
		p, _, err := c.Read()
		if err != nil {
			if IsTimeout(err) {
				return nil
			}
			continue
		}
		if p.Operation == arp.OperationReply && p.SenderIP == from {
			return p
		}
	}
	return nil
}
