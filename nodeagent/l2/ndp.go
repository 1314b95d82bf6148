package l2

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"k8s.io/klog/v2"
)

// NDPConn is the NDP connection of one interface. Its methods are those of mdlayher/ndp's
// *Conn; ReadFrom must return each message's control message with its hop limit
// (ipv6.FlagHopLimit), since solicitations without hop limit 255 are not answered.
type NDPConn interface {
	ReadFrom() (ndp.Message, *ipv6.ControlMessage, netip.Addr, error)
	// WriteTo sends m to dst; a nil cm sends with the connection's defaults (hop limit 255).
	WriteTo(m ndp.Message, cm *ipv6.ControlMessage, dst netip.Addr) error
	JoinGroup(group netip.Addr) error
	LeaveGroup(group netip.Addr) error
	Close() error
}

var _ NDPConn = (*ndp.Conn)(nil)

func (s *Speaker) ndpLoop(ifc *iface) {
	defer s.wg.Done()
	for {
		m, cm, from, err := ifc.ndp.ReadFrom()
		if err != nil {
			if s.readFailed(err) {
				return
			}
			continue
		}
		s.receiveNDP(ifc, m, cm, from.WithZone(""))
	}
}

// receiveNDP answers a Neighbor Solicitation for a VIP owned on the interface, as receiveARP
// does a request.
func (s *Speaker) receiveNDP(ifc *iface, m ndp.Message, cm *ipv6.ControlMessage, from netip.Addr) {
	ns, ok := m.(*ndp.NeighborSolicitation)
	if !ok {
		return
	}
	s.nsReceived.Add(1)
	// Anything without hop limit 255 was routed here, not sent on the link (RFC 4861 7.1.1).
	if cm == nil || cm.HopLimit != ndp.HopLimit {
		return
	}
	s.answering.RLock()
	defer s.answering.RUnlock()
	ans, ok := (*ifc.owned.Load())[ns.TargetAddress]
	if !ok {
		return
	}
	if sh := ans.share; sh != nil {
		if mac := sourceLinkLayer(ns); saneSender(ns.TargetAddress, from, mac) {
			s.clients.see(sighting{vip: ns.TargetAddress, ip: from, at: station{mac: [6]byte(mac), iface: ifc.ifi.Name}})
		}
		if !sh.answers(from) {
			return
		}
	}
	// A solicitation from the unspecified address is duplicate address detection: the
	// answer goes to all nodes and is not solicited (RFC 4861 7.2.4).
	dst, solicited := from, true
	dstMAC := sourceLinkLayer(ns)
	if !from.IsValid() || from.IsUnspecified() {
		dst, solicited, dstMAC = netip.IPv6LinkLocalAllNodes(), false, allNodesMAC
	}
	if err := s.advertise(ifc, ns.TargetAddress, ans.mac, dst, dstMAC, solicited); err != nil {
		klog.V(2).InfoS("Neighbor advertisement failed", "vip", ns.TargetAddress, "interface", ifc.ifi.Name, "err", err)
		return
	}
	s.naSent.Add(1)
}

func sourceLinkLayer(ns *ndp.NeighborSolicitation) net.HardwareAddr {
	for _, o := range ns.Options {
		if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Source {
			return l.Addr
		}
	}
	return nil
}

// allNodesMAC is the Ethernet address of ff02::1.
var allNodesMAC = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}

// advertise sends a Neighbor Advertisement that vip is at mac to dst. When mac is a virtual
// MAC and the destination's MAC is known, the frame also comes from mac (through the
// interface's frame connection): a switch learns the virtual MAC from it. Otherwise the raw
// socket sends it, from the interface's own MAC; a client learns mac from the advertisement
// all the same.
func (s *Speaker) advertise(ifc *iface, vip netip.Addr, mac net.HardwareAddr, dst netip.Addr, dstMAC net.HardwareAddr, solicited bool) error {
	na := &ndp.NeighborAdvertisement{
		Solicited:     solicited,
		Override:      true,
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}},
	}
	if ifc.frames != nil && len(dstMAC) == 6 && !slices.Equal(mac, ifc.ifi.HardwareAddr) {
		return ifc.frames.WriteNDP(na, mac, dstMAC, dst)
	}
	return ifc.ndp.WriteTo(na, nil, dst)
}

// announceNDP sends an unsolicited advertisement for vip, at mac, to all nodes.
func (s *Speaker) announceNDP(ifc *iface, vip netip.Addr, mac net.HardwareAddr) {
	if ifc.ndp == nil {
		return
	}
	if err := s.advertise(ifc, vip, mac, netip.IPv6LinkLocalAllNodes(), allNodesMAC, false); err != nil {
		klog.V(2).InfoS("Unsolicited advertisement failed", "vip", vip, "interface", ifc.ifi.Name, "err", err)
		return
	}
	s.unsolicited.Add(1)
}

// tellNDP sends a client of a per-client VIP just taken over an unasked advertisement.
func (s *Speaker) tellNDP(ifc *iface, vip netip.Addr, c Client) bool {
	if ifc.ndp == nil {
		return false
	}
	if err := s.advertise(ifc, vip, ifc.ifi.HardwareAddr, c.IP, nil, false); err != nil {
		klog.V(2).InfoS("Targeted advertisement failed", "vip", vip, "client", c.IP, "err", err)
		return false
	}
	return true
}

func (ifc *iface) join(vip netip.Addr) error {
	g, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		return err
	}
	if ifc.groups[g] {
		return nil
	}
	if err := ifc.ndp.JoinGroup(g); err != nil {
		return err
	}
	ifc.groups[g] = true
	return nil
}

// leaveUnused leaves the groups no owned VIP needs.
func (ifc *iface) leaveUnused(owned map[netip.Addr]answer) {
	if ifc.ndp == nil {
		return
	}
	need := map[netip.Addr]bool{}
	for a := range owned {
		if a.Is6() {
			if g, err := ndp.SolicitedNodeMulticast(a); err == nil {
				need[g] = true
			}
		}
	}
	for g := range ifc.groups {
		if !need[g] {
			_ = ifc.ndp.LeaveGroup(g)
			delete(ifc.groups, g)
		}
	}
}

// ndpConn is a raw ICMPv6 socket for NDP. github.com/mdlayher/ndp's Conn names the interface
// in every destination address, which is turned into an index through a process-wide cache:
// with sockets in several network namespaces in one process (as in tests) the index can be
// another namespace's. This one names the interface by index in a control message only, and
// works from any goroutine once open. Messages are still marshalled and parsed by package ndp.
type ndpConn struct {
	ifi *net.Interface
	pc  *ipv6.PacketConn
	raw *icmp.PacketConn
	cm  *ipv6.ControlMessage
}

var _ NDPConn = (*ndpConn)(nil)

func listenNDPSolicitations(ifi *net.Interface) (NDPConn, error) {
	return listenNDP(ifi, ipv6.ICMPTypeNeighborSolicitation)
}

// listenNDP opens the socket on ifi, receiving only the ICMPv6 types given, with their hop
// limits.
func listenNDP(ifi *net.Interface, accept ...ipv6.ICMPType) (*ndpConn, error) {
	src, err := linkLocal(ifi)
	if err != nil {
		return nil, err
	}
	// The zone by index, not name: Go resolves a zone's name through a cache shared by the
	// whole process, which in a process with more than one network namespace (the lab's
	// tests) may hold another namespace's interface of that name.
	raw, err := icmp.ListenPacket("ip6:ipv6-icmp", src.WithZone(strconv.Itoa(ifi.Index)).String())
	if err != nil {
		return nil, err
	}
	pc := raw.IPv6PacketConn()
	var f ipv6.ICMPFilter
	f.SetAll(true)
	for _, typ := range accept {
		f.Accept(typ)
	}
	for _, set := range []func() error{
		func() error { return pc.SetHopLimit(ndp.HopLimit) },
		func() error { return pc.SetMulticastHopLimit(ndp.HopLimit) },
		func() error { return pc.SetChecksum(true, 2) },
		func() error { return pc.SetICMPFilter(&f) },
		func() error { return pc.SetControlMessage(ipv6.FlagHopLimit, true) },
	} {
		if err := set(); err != nil {
			raw.Close()
			return nil, err
		}
	}
	return &ndpConn{ifi: ifi, pc: pc, raw: raw, cm: &ipv6.ControlMessage{HopLimit: ndp.HopLimit, Src: src.AsSlice(), IfIndex: ifi.Index}}, nil
}

// ReadFrom returns the next message that parses, with its control message and source.
func (c *ndpConn) ReadFrom() (ndp.Message, *ipv6.ControlMessage, netip.Addr, error) {
	b := make([]byte, 1500)
	n, cm, from, err := c.pc.ReadFrom(b)
	if err != nil {
		return nil, nil, netip.Addr{}, err
	}
	m, err := ndp.ParseMessage(b[:n])
	if err != nil {
		return nil, nil, netip.Addr{}, err
	}
	var src netip.Addr
	if ia, ok := from.(*net.IPAddr); ok {
		src, _ = netip.AddrFromSlice(ia.IP)
	}
	return m, cm, src, nil
}

// WriteTo sends m to dst, with the socket's source and interface when cm is nil.
func (c *ndpConn) WriteTo(m ndp.Message, cm *ipv6.ControlMessage, dst netip.Addr) error {
	b, err := ndp.MarshalMessage(m)
	if err != nil {
		return err
	}
	if cm == nil {
		cm = c.cm
	}
	_, err = c.pc.WriteTo(b, cm, &net.IPAddr{IP: dst.WithZone("").AsSlice()})
	return err
}

func (c *ndpConn) JoinGroup(g netip.Addr) error {
	return c.pc.JoinGroup(c.ifi, &net.IPAddr{IP: g.AsSlice()})
}

func (c *ndpConn) LeaveGroup(g netip.Addr) error {
	return c.pc.LeaveGroup(c.ifi, &net.IPAddr{IP: g.AsSlice()})
}

// Close closes the socket.
func (c *ndpConn) Close() error { return c.raw.Close() }

// FrameConn sends Neighbor Advertisements in frames from a given MAC: those of a virtual MAC,
// which a raw ICMPv6 socket would send from the interface's own. Tests give fakes.
type FrameConn interface {
	// WriteNDP sends m from the interface's link-local address to dst, in a frame from src
	// to dstMAC, with hop limit 255.
	WriteNDP(m ndp.Message, src, dstMAC net.HardwareAddr, dst netip.Addr) error
	Close() error
}

// frameConn is a packet socket that receives nothing (protocol 0) and sends IPv6 frames.
type frameConn struct {
	ifi *net.Interface
	c   *packet.Conn
	src netip.Addr // the interface's link-local address
}

func openFrames(ifi *net.Interface) (FrameConn, error) {
	src, err := linkLocal(ifi)
	if err != nil {
		return nil, err
	}
	c, err := packet.Listen(ifi, packet.Raw, 0, nil)
	if err != nil {
		return nil, err
	}
	return &frameConn{ifi: ifi, c: c, src: src}, nil
}

func (c *frameConn) WriteNDP(m ndp.Message, src, dstMAC net.HardwareAddr, dst netip.Addr) error {
	icmp6, err := ndp.MarshalMessageChecksum(m, c.src, dst)
	if err != nil {
		return err
	}
	ip := make([]byte, 40, 40+len(icmp6))
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:], uint16(len(icmp6)))
	ip[6], ip[7] = 58, ndp.HopLimit // ICMPv6, hop limit 255
	s16, d16 := c.src.As16(), dst.As16()
	copy(ip[8:], s16[:])
	copy(ip[24:], d16[:])
	f := &ethernet.Frame{Destination: dstMAC, Source: src, EtherType: ethernet.EtherTypeIPv6, Payload: append(ip, icmp6...)}
	b, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = c.c.WriteTo(b, &packet.Addr{HardwareAddr: dstMAC})
	return err
}

func (c *frameConn) Close() error { return c.c.Close() }

// linkLocal returns the interface's IPv6 link-local address.
func linkLocal(ifi *net.Interface) (netip.Addr, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no IPv6 link-local address", ifi.Name)
}
