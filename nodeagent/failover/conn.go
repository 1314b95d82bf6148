package failover

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// onLinkTTL is what heartbeats are sent with and must arrive with (GTSM, RFC 5082): a
// datagram with less crossed a router, so it does not come from the segment.
const onLinkTTL = 255

// batch is how many datagrams one read takes (recvmmsg), so that a flood costs few syscalls.
const batch = 64

// hbConn is the heartbeat socket: sends with TTL (hop limit) 255, receives in batches with
// each datagram's TTL (hop limit).
type hbConn struct {
	udp   *net.UDPConn
	read  func([]ipv4.Message, int) (int, error) // ipv4.Message and ipv6.Message are one type
	v6    bool
	msgs  []ipv4.Message
	bufs  [][]byte
	oobs  [][]byte
	close func() error
}

func listen(addr netip.AddrPort) (*hbConn, error) {
	network := "udp4"
	if addr.Addr().Is6() {
		network = "udp6"
	}
	udp, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	// A larger queue rides out bursts; the kernel caps it at net.core.rmem_max.
	_ = udp.SetReadBuffer(4 << 20)
	c := &hbConn{udp: udp, v6: addr.Addr().Is6(), close: udp.Close}
	if c.v6 {
		pc := ipv6.NewPacketConn(udp)
		if err := pc.SetControlMessage(ipv6.FlagHopLimit, true); err != nil {
			udp.Close()
			return nil, fmt.Errorf("ask for hop limits: %w", err)
		}
		if err := pc.SetHopLimit(onLinkTTL); err != nil {
			udp.Close()
			return nil, fmt.Errorf("set hop limit: %w", err)
		}
		c.read = pc.ReadBatch
	} else {
		pc := ipv4.NewPacketConn(udp)
		if err := pc.SetControlMessage(ipv4.FlagTTL, true); err != nil {
			udp.Close()
			return nil, fmt.Errorf("ask for TTLs: %w", err)
		}
		if err := pc.SetTTL(onLinkTTL); err != nil {
			udp.Close()
			return nil, fmt.Errorf("set TTL: %w", err)
		}
		c.read = pc.ReadBatch
	}
	c.msgs = make([]ipv4.Message, batch)
	c.bufs, c.oobs = make([][]byte, batch), make([][]byte, batch)
	for i := range c.msgs {
		// One byte more than the longest heartbeat, so that a longer datagram shows as longer.
		c.bufs[i] = make([]byte, maxFrameSize+1)
		c.oobs[i] = make([]byte, 64)
		c.msgs[i].Buffers = [][]byte{c.bufs[i]}
		c.msgs[i].OOB = c.oobs[i]
	}
	return c, nil
}

// datagram is one received datagram; data and the address are valid until the next readBatch.
type datagram struct {
	data []byte
	from netip.Addr
	ttl  int // -1 when the kernel gave none
}

// readBatch reads at least one datagram into out.
func (c *hbConn) readBatch(out []datagram) ([]datagram, error) {
	for i := range c.msgs {
		c.msgs[i].OOB = c.oobs[i]
	}
	n, err := c.read(c.msgs, 0)
	if err != nil {
		return out, err
	}
	for i := range n {
		m := &c.msgs[i]
		var from netip.Addr
		if ua, ok := m.Addr.(*net.UDPAddr); ok {
			from, _ = netip.AddrFromSlice(ua.IP)
			from = from.Unmap()
		}
		out = append(out, datagram{data: c.bufs[i][:m.N], from: from, ttl: ttlOf(m.OOB[:m.NN], c.v6)})
	}
	return out, nil
}

// ttlOf finds the IP_TTL (IPV6_HOPLIMIT) control message without allocating.
func ttlOf(oob []byte, v6 bool) int {
	level, typ := int32(unix.IPPROTO_IP), int32(unix.IP_TTL)
	if v6 {
		level, typ = unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT
	}
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0])) // the buffers are 8-byte aligned
		clen := int(h.Len)
		if clen < unix.SizeofCmsghdr || clen > len(oob) {
			return -1
		}
		if h.Level == level && h.Type == typ && clen >= unix.CmsgLen(4) {
			return int(int32(binary.NativeEndian.Uint32(oob[unix.CmsgLen(0):])))
		}
		next := unix.CmsgSpace(clen - unix.CmsgLen(0))
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	return -1
}

func (c *hbConn) send(b []byte, to netip.AddrPort) error {
	_, err := c.udp.WriteToUDPAddrPort(b, to)
	return err
}
