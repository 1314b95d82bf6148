package l2

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"

	"github.com/metalvip/metalvip/test/lab"
)

// fdbPort returns the switch port the lab's bridge has learnt mac on, or "".
func fdbPort(t *testing.T, l *lab.Lab, mac net.HardwareAddr) string {
	t.Helper()
	out, err := l.Switch.Run(context.Background(), "bridge", "-j", "fdb", "show", "br", "br0")
	if err != nil {
		t.Fatal(err)
	}
	var entries []struct {
		MAC string `json:"mac"`
		Dev string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("bridge -j fdb: %v: %s", err, out)
	}
	for _, e := range entries {
		if e.MAC == mac.String() {
			return e.Dev
		}
	}
	return ""
}

// TestVirtualMACFramesComeFromTheVirtualMAC checks on a real segment that a VIP with a virtual
// MAC is announced in frames from that MAC (the bridge learns it on the node's port) and
// answered naming it, in frames from it, for IPv4 and IPv6.
func TestVirtualMACFramesComeFromTheVirtualMAC(t *testing.T) {
	l := lab.New(t, lab.Options{Nodes: 1})
	node := l.Nodes[0]
	_, set := speakerOn(t, node)
	v4MAC := net.HardwareAddr{0x02, 0x00, 0xcb, 0x00, 0x71, 0x0a}
	v6MAC := net.HardwareAddr{0x06, 0x00, 0x00, 0x00, 0x00, 0x10}
	c := arpClient(t, l.Client)
	nc := clientNDP(t, l.Client)
	set(VIP{Addr: vip4, Interfaces: []string{"eth0"}, MAC: v4MAC}, VIP{Addr: vip6, Interfaces: []string{"eth0"}, MAC: v6MAC})

	for _, mac := range []net.HardwareAddr{v4MAC, v6MAC} {
		deadline := time.Now().Add(2 * time.Second)
		for fdbPort(t, l, mac) != "p-node1" {
			if time.Now().After(deadline) {
				t.Fatalf("the bridge has not learnt %s on node1's port within 2 s (port %q)", mac, fdbPort(t, l, mac))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if err := c.Request(vip4); err != nil {
		t.Fatal(err)
	}
	var from net.HardwareAddr
	reply := func() *arp.Packet {
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			_ = c.SetReadDeadline(deadline)
			p, eth, err := c.Read()
			if err != nil {
				continue
			}
			if p.Operation == arp.OperationReply && p.SenderIP == vip4 && p.TargetIP != vip4 {
				from = eth.Source
				return p
			}
		}
		return nil
	}()
	if reply == nil || reply.SenderHardwareAddr.String() != v4MAC.String() || from.String() != v4MAC.String() {
		t.Errorf("ARP reply %+v in a frame from %s; want it naming %s, from %s", reply, from, v4MAC, v4MAC)
	}

	snm, err := ndp.SolicitedNodeMulticast(vip6)
	if err != nil {
		t.Fatal(err)
	}
	ns := &ndp.NeighborSolicitation{TargetAddress: vip6, Options: []ndp.Option{
		&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: macOf(t, l.Client)},
	}}
	if err := nc.WriteTo(ns, nil, snm); err != nil {
		t.Fatal(err)
	}
	var na *ndp.NeighborAdvertisement
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if na = readNA(t, nc, time.Second, vip6); na != nil && na.Solicited {
			break
		}
	}
	if na == nil || !na.Solicited || targetMAC(na) != v6MAC.String() {
		t.Errorf("advertisement %+v; want a solicited one naming %s", na, v6MAC)
	}
	// The kernel checked the frame's IPv6 checksum and hop limit: a malformed one would not
	// have reached the socket. It came from the virtual MAC: the bridge still has it there.
	if got := fdbPort(t, l, v6MAC); got != "p-node1" {
		t.Errorf("the bridge has %s on %q; want p-node1", v6MAC, got)
	}
}
