package l2

import (
	"bytes"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// ARPConn is the ARP connection of one interface. mdlayher/arp's *Client is one; tests give
// fakes.
type ARPConn interface {
	// Read returns the next ARP packet and the frame it came in.
	Read() (*arp.Packet, *ethernet.Frame, error)
	// WriteTo sends p in a frame to addr, from p's sender hardware address (so from a
	// virtual MAC when p names one).
	WriteTo(p *arp.Packet, addr net.HardwareAddr) error
	Close() error
}

var _ ARPConn = (*arp.Client)(nil)

// dialARP opens an interface's ARP connection, which takes only what the speaker answers: ARP
// requests that are not gratuitous (a gratuitous request names its sender as its target). The
// kernel drops the rest before the agent wakes: when other nodes take over a thousand VIPs,
// their announcements (two frames per VIP, three times) would otherwise each cost every agent
// on the segment a read, and the CPU its heartbeats need.
func dialARP(ifi *net.Interface) (ARPConn, error) {
	p, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, &packet.Config{Filter: arpRequestFilter})
	if err != nil {
		return nil, err
	}
	c, err := arp.New(ifi, p)
	if err != nil {
		_ = p.Close()
		return nil, err
	}
	return c, nil
}

// arpRequestFilter passes the frames of ARP requests whose sender and target addresses
// differ (offsets in an Ethernet frame: the operation at 20, the sender's IPv4 address at 28,
// the target's at 38).
var arpRequestFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadAbsolute{Off: 20, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(arp.OperationRequest), SkipTrue: 5},
	bpf.LoadAbsolute{Off: 28, Size: 4},
	bpf.TAX{},
	bpf.LoadAbsolute{Off: 38, Size: 4},
	bpf.JumpIfX{Cond: bpf.JumpEqual, SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
})

func mustAssemble(prog []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(err) // a constant program
	}
	return raw
}

func (s *Speaker) arpLoop(ifc *iface) {
	defer s.wg.Done()
	for {
		p, eth, err := ifc.arp.Read()
		if err != nil {
			if s.readFailed(err) {
				return
			}
			continue
		}
		s.receiveARP(ifc, p, eth)
	}
}

// receiveARP answers a request for a VIP owned on the interface: every request for an
// ordinary VIP, and for a per-client VIP only those of this node's share of clients, whose
// senders it also learns (see clients.go). The answer names the VIP's MAC (its virtual MAC,
// or the interface's) and comes from it.
func (s *Speaker) receiveARP(ifc *iface, p *arp.Packet, eth *ethernet.Frame) {
	if p.Operation != arp.OperationRequest {
		return
	}
	s.arpRequests.Add(1)
	s.answering.RLock()
	defer s.answering.RUnlock()
	ans, ok := (*ifc.owned.Load())[p.TargetIP]
	if !ok {
		return
	}
	if sh := ans.share; sh != nil {
		// A sender that names another MAC than its frame's is not learnt: its answer would go
		// where the request did not come from.
		if eth != nil && bytes.Equal(eth.Source, p.SenderHardwareAddr) && saneSender(p.TargetIP, p.SenderIP, p.SenderHardwareAddr) {
			s.clients.see(sighting{vip: p.TargetIP, ip: p.SenderIP, at: station{mac: [6]byte(p.SenderHardwareAddr), iface: ifc.ifi.Name}})
		}
		if !sh.answers(p.SenderIP) {
			return
		}
	}
	reply, err := arp.NewPacket(arp.OperationReply, ans.mac, p.TargetIP, p.SenderHardwareAddr, p.SenderIP)
	if err == nil {
		err = ifc.arp.WriteTo(reply, p.SenderHardwareAddr)
	}
	if err != nil {
		klog.V(2).InfoS("ARP reply failed", "vip", p.TargetIP, "interface", ifc.ifi.Name, "err", err)
		return
	}
	s.arpReplies.Add(1)
}

// announceARP sends a gratuitous ARP request and reply for vip from mac (some hosts heed only
// one of the two; switches learn mac from either).
func (s *Speaker) announceARP(ifc *iface, vip netip.Addr, mac net.HardwareAddr) {
	if ifc.arp == nil {
		return
	}
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		p, err := arp.NewPacket(op, mac, vip, ethernet.Broadcast, vip)
		if err == nil {
			err = ifc.arp.WriteTo(p, ethernet.Broadcast)
		}
		if err != nil {
			klog.V(2).InfoS("Gratuitous ARP failed", "vip", vip, "interface", ifc.ifi.Name, "err", err)
			continue
		}
		s.gratuitous.Add(1)
	}
}

// tellARP sends a client of a per-client VIP just taken over an unasked reply, to its MAC.
func (s *Speaker) tellARP(ifc *iface, vip netip.Addr, c Client) bool {
	if ifc.arp == nil {
		return false
	}
	p, err := arp.NewPacket(arp.OperationReply, ifc.ifi.HardwareAddr, vip, c.MAC, c.IP)
	if err == nil {
		err = ifc.arp.WriteTo(p, c.MAC)
	}
	if err != nil {
		klog.V(2).InfoS("Targeted reply failed", "vip", vip, "client", c.IP, "err", err)
		return false
	}
	return true
}
