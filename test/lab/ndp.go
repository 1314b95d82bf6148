package lab

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// ndpAsker asks for IPv6 addresses by NDP neighbor solicitation from a host's eth0 and reads
// the solicited advertisements that answer, as ARP does for IPv4. It sends with the interface
// in a control message, never by a zone's name: Go looks a zone's name up in a cache shared by
// the namespaces of the process.
type ndpAsker struct {
	pc  *ipv6.PacketConn
	raw net.PacketConn
	cm  *ipv6.ControlMessage
	mac net.HardwareAddr
}

// dialNDP opens an NDP socket on the host's eth0 (from its link-local address) that takes
// neighbor advertisements only; the caller closes it.
func (h *Host) dialNDP() (*ndpAsker, error) {
	var a *ndpAsker
	err := h.Do(func() error {
		ifi, src, err := eth0Address(func(a netip.Addr) bool { return a.Is6() && a.IsLinkLocalUnicast() })
		if err != nil {
			return fmt.Errorf("NDP on %s: no link-local address: %w", h.Name, err)
		}
		// The zone by index: Go resolves a zone's name through a cache shared by every
		// namespace of the process, which may hold another namespace's eth0.
		raw, err := icmp.ListenPacket("ip6:ipv6-icmp", src.WithZone(strconv.Itoa(ifi.Index)).String())
		if err != nil {
			return fmt.Errorf("NDP on %s: %w", h.Name, err)
		}
		pc := raw.IPv6PacketConn()
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeNeighborAdvertisement)
		for _, set := range []func() error{
			func() error { return pc.SetHopLimit(ndp.HopLimit) },
			func() error { return pc.SetMulticastHopLimit(ndp.HopLimit) },
			func() error { return pc.SetChecksum(true, 2) },
			func() error { return pc.SetICMPFilter(&f) },
		} {
			if err := set(); err != nil {
				raw.Close()
				return err
			}
		}
		a = &ndpAsker{pc: pc, raw: raw, mac: ifi.HardwareAddr,
			cm: &ipv6.ControlMessage{HopLimit: ndp.HopLimit, Src: src.AsSlice(), IfIndex: ifi.Index}}
		return nil
	})
	return a, err
}

// request sends a neighbor solicitation for vip to its solicited-node group.
func (a *ndpAsker) request(vip netip.Addr) error {
	group, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		return err
	}
	ns := &ndp.NeighborSolicitation{TargetAddress: vip, Options: []ndp.Option{
		&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: a.mac},
	}}
	b, err := ndp.MarshalMessage(ns)
	if err != nil {
		return err
	}
	_, err = a.pc.WriteTo(b, a.cm, &net.IPAddr{IP: group.AsSlice()})
	return err
}

// read returns the next answer until deadline: the address it answers for and the MAC it
// names. Unsolicited advertisements (a node announcing a takeover) are not answers: ok false.
func (a *ndpAsker) read(deadline time.Time) (vip netip.Addr, mac string, ok bool, err error) {
	_ = a.pc.SetReadDeadline(deadline)
	b := make([]byte, 1500)
	n, _, _, err := a.pc.ReadFrom(b)
	if err != nil {
		if IsTimeout(err) {
			return netip.Addr{}, "", false, err
		}
		return netip.Addr{}, "", false, nil
	}
	m, err := ndp.ParseMessage(b[:n])
	if err != nil {
		return netip.Addr{}, "", false, nil // a message that is not NDP
	}
	na, isNA := m.(*ndp.NeighborAdvertisement)
	if !isNA || !na.Solicited {
		return netip.Addr{}, "", false, nil
	}
	for _, o := range na.Options {
		if lla, isLLA := o.(*ndp.LinkLayerAddress); isLLA && lla.Direction == ndp.Target {
			return na.TargetAddress, lla.Addr.String(), true, nil
		}
	}
	return netip.Addr{}, "", false, nil
}

func (a *ndpAsker) close() error { return a.raw.Close() }
