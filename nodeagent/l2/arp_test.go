package l2

import (
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"golang.org/x/net/bpf"

	"github.com/metalvip/metalvip/internal/rendezvous"
)

var (
	clientIP = netip.MustParseAddr("198.51.100.100")
	members  = []string{"node-a", "node-b"}
)

// clientOf returns a client address that rendezvous hashing gives to node among members.
func clientOf(t *testing.T, node string, members []string, skip int) netip.Addr {
	t.Helper()
	for i := range 200 {
		a := netip.AddrFrom4([4]byte{198, 51, 100, byte(51 + i)})
		if rendezvous.Owner(a, members) == node {
			if skip == 0 {
				return a
			}
			skip--
		}
	}
	t.Fatalf("no client address for %s among %v", node, members)
	return netip.Addr{}
}

func perClient(vip netip.Addr, self string, members ...string) VIP {
	return VIP{Addr: vip, Interfaces: []string{"eth0"}, Share: &Share{Self: self, Members: members}}
}

func TestARPAnswersOnlyWhatTheNodeOwns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vips   []VIP
		packet func() *arp.Packet
		on     string
		want   bool
	}{
		{"a request for an owned VIP is answered", []VIP{{Addr: vip4, Interfaces: []string{"eth0"}}},
			func() *arp.Packet { return request(vip4, clientIP, clientMAC) }, "eth0", true},
		{"a request for a VIP no one gave the node is not answered", []VIP{{Addr: vip4, Interfaces: []string{"eth0"}}},
			func() *arp.Packet { return request(otherVIP4, clientIP, clientMAC) }, "eth0", false},
		{"a request on another interface than the VIP's is not answered",
			[]VIP{{Addr: vip4, Interfaces: []string{"eth0"}}, {Addr: otherVIP4, Interfaces: []string{"eth1"}}},
			func() *arp.Packet { return request(vip4, clientIP, clientMAC) }, "eth1", false},
		{"a reply for an owned VIP is not answered", []VIP{{Addr: vip4, Interfaces: []string{"eth0"}}},
			func() *arp.Packet {
				p, _ := arp.NewPacket(arp.OperationReply, clientMAC, clientIP, nodeMAC, vip4)
				return p
			}, "eth0", false},
		{"a per-client VIP's request from a client of this node's share is answered", []VIP{perClient(vip4, "node-a", members...)},
			func() *arp.Packet { return request(vip4, clientOf(t, "node-a", members, 0), clientMAC) }, "eth0", true},
		{"a per-client VIP's request from another member's client is not answered", []VIP{perClient(vip4, "node-a", members...)},
			func() *arp.Packet { return request(vip4, clientOf(t, "node-b", members, 0), clientMAC) }, "eth0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, Options{Burst: 1})
			n.set(tc.vips...)
			p := tc.packet()
			n.deliverARP(tc.on, p, p.SenderHardwareAddr)
			var answers []sentARP
			for _, s := range n.arp[tc.on].arpSent() {
				if s.p.Operation == arp.OperationReply && s.p.TargetIP == p.SenderIP {
					answers = append(answers, s)
				}
			}
			if !tc.want {
				if len(answers) != 0 {
					t.Errorf("answered: %+v", answers[0].p)
				}
				return
			}
			if len(answers) != 1 {
				t.Fatalf("%d answers; want 1", len(answers))
			}
			a := answers[0]
			ifMAC := nodeMAC
			if tc.on == "eth1" {
				ifMAC = node2MAC
			}
			if a.p.SenderIP != p.TargetIP || a.p.SenderHardwareAddr.String() != ifMAC.String() ||
				a.p.TargetHardwareAddr.String() != p.SenderHardwareAddr.String() || a.to.String() != p.SenderHardwareAddr.String() {
				t.Errorf("answer %+v to %s; want %s at %s, to the asker %s", a.p, a.to, p.TargetIP, ifMAC, p.SenderHardwareAddr)
			}
			if got := n.s.Counters().ARPReplies; got != 1 {
				t.Errorf("ARPReplies = %d; want 1", got)
			}
		})
	}
}

func TestARPReleasedVIPIsNoLongerAnswered(t *testing.T) {
	n := newFakeNode(t, Options{Burst: 1})
	n.set(VIP{Addr: vip4, Interfaces: []string{"eth0"}})
	n.set()
	n.arp["eth0"].reset()
	n.ask(vip4, clientIP, clientMAC)
	if got := n.replies(vip4); len(got) != 0 {
		t.Errorf("a released VIP answered: %+v", got[0].p)
	}
	if got := n.s.Counters().ARPRequests; got != 1 {
		t.Errorf("ARPRequests = %d; want the request counted", got)
	}
}

func request(vip, ip netip.Addr, mac net.HardwareAddr) *arp.Packet {
	p, err := arp.NewPacket(arp.OperationRequest, mac, ip, ethernet.Broadcast, vip)
	if err != nil {
		panic(err)
	}
	return p
}

// The kernel passes the speaker ARP requests only, and no gratuitous ones: other nodes'
// announcements of VIPs they take over never wake it.
func TestTheARPSocketTakesRequestsOnly(t *testing.T) {
	vm, err := bpf.NewVM(mustDisassemble(t, arpRequestFilter))
	if err != nil {
		t.Fatal(err)
	}
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 7}
	vip, client := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("198.51.100.100")
	frame := func(op arp.Operation, sender, target netip.Addr, to net.HardwareAddr) []byte {
		p, err := arp.NewPacket(op, mac, sender, to, target)
		if err != nil {
			t.Fatal(err)
		}
		pb, err := p.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		f, err := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: mac, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		pass  bool
	}{
		{"a client's request", frame(arp.OperationRequest, client, vip, ethernet.Broadcast), true},
		{"a probe for the address (sender 0.0.0.0)", frame(arp.OperationRequest, netip.IPv4Unspecified(), vip, ethernet.Broadcast), true},
		{"a gratuitous request", frame(arp.OperationRequest, vip, vip, ethernet.Broadcast), false},
		{"a gratuitous reply", frame(arp.OperationReply, vip, vip, ethernet.Broadcast), false},
		{"a reply", frame(arp.OperationReply, vip, client, mac), false},
	} {
		n, err := vm.Run(tc.frame)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := n > 0; got != tc.pass {
			t.Errorf("%s: passed %v, want %v", tc.name, got, tc.pass)
		}
	}
}

func mustDisassemble(t *testing.T, raw []bpf.RawInstruction) []bpf.Instruction {
	t.Helper()
	prog, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter does not disassemble")
	}
	return prog
}
