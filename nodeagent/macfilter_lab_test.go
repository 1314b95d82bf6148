package nodeagent

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/metalvip/metalvip/test/lab"
)

// macFilterOn returns the MAC filter of a lab host's namespace.
func macFilterOn(t *testing.T, h *lab.Host) *nftMACFilter {
	t.Helper()
	ns, err := netns.GetFromPath(filepath.Join("/run/netns", h.NS))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	f, err := newMACFilterIn(ns)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTheMACFilterMakesTheNodeReceiveAVirtualMAC checks in the lab that a client whose
// neighbour entry for a VIP is a virtual MAC (permanent, as for a client that ignores
// gratuitous ARP) reaches the node only while the node's filter takes that MAC; that a
// flushed firewall is put back by Check; and that a new filter (a restarted agent) removes what
// an old one left.
func TestTheMACFilterMakesTheNodeReceiveAVirtualMAC(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	node := l.Nodes[0]
	vip := netip.MustParseAddr("203.0.113.40")
	mac := net.HardwareAddr{0x02, 0x00, 0xcb, 0x00, 0x71, 0x28}
	ctx := context.Background()
	if _, err := l.Client.Run(ctx, "ip", "neigh", "replace", vip.String(), "lladdr", mac.String(), "dev", "eth0", "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	reaches := func() bool { return l.Client.Ping(ctx, vip, 2) == nil }
	unicastFilter := func() string {
		out, _ := node.Run(ctx, "bridge", "fdb", "show", "dev", "eth0", "self")
		return string(out)
	}
	if reaches() {
		t.Fatal("the client reaches the VIP at a MAC the node does not take: the test cannot tell")
	}

	f := macFilterOn(t, node)
	if err := f.Set(map[string][]net.HardwareAddr{"eth0": {mac}}); err != nil {
		t.Fatal(err)
	}
	if !reaches() {
		t.Error("the client does not reach the VIP at its virtual MAC while the filter takes it")
	}
	if !strings.Contains(unicastFilter(), mac.String()) {
		t.Errorf("the NIC's unicast filter lacks %s: %s", mac, unicastFilter())
	}

	t.Run("a flushed firewall is put back by Check", func(t *testing.T) {
		c, err := nftables.New(f.nftOpts...)
		if err != nil {
			t.Fatal(err)
		}
		c.FlushRuleset()
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if reaches() {
			t.Fatal("the client still reaches the VIP with the table flushed")
		}
		if err := f.Check(); err != nil {
			t.Fatal(err)
		}
		if !reaches() {
			t.Error("not put back")
		}
	})

	t.Run("a new agent removes what an old one left", func(t *testing.T) {
		fresh := macFilterOn(t, node) // f is left as a crashed agent would leave it
		if err := fresh.Set(nil); err != nil {
			t.Fatal(err)
		}
		if reaches() {
			t.Error("the client still reaches the VIP after the new filter took nothing")
		}
		if strings.Contains(unicastFilter(), mac.String()) {
			t.Errorf("the unicast filter still has %s: %s", mac, unicastFilter())
		}
		if err := fresh.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := f.Close(); err != nil {
		t.Error(err)
	}
}
