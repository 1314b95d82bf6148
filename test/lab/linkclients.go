package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"golang.org/x/sys/unix"
)

// SpareAddrs returns the segment's IPv4 addresses that no host of this lab uses: not the
// router's, the control host's, a node's, the client's or one of its extra addresses. They
// suit on-link clients of their own (AddLinkClients).
func (l *Lab) SpareAddrs() []netip.Addr {
	used := map[netip.Addr]bool{}
	for _, h := range l.Hosts() {
		used[h.IPv4] = true
	}
	for i := range l.opts.ClientAddrs {
		used[ClientAddr(i)] = true
	}
	var out []netip.Addr
	for a := SegmentV4.Addr().Next(); SegmentV4.Contains(a.Next()); a = a.Next() { // not the network nor broadcast address
		if !used[a] {
			out = append(out, a)
		}
	}
	return out
}

// LinkClient is an on-link client with a MAC and an address of its own: a macvlan interface
// of a host's eth0. Its ARP socket sees what is sent to its MAC (and broadcast), as the host
// behind a real NIC would.
type LinkClient struct {
	Name string
	MAC  net.HardwareAddr
	Addr netip.Addr
	ARP  *arp.Client
}

// AddLinkClients adds one LinkClient per address to the host, named lc0, lc1 and on; they
// and their sockets go when the test ends.
func (h *Host) AddLinkClients(addrs []netip.Addr) ([]*LinkClient, error) {
	var batch strings.Builder
	for i, a := range addrs {
		if !SegmentV4.Contains(a) {
			return nil, fmt.Errorf("link client address %s is not on the segment %s", a, SegmentV4)
		}
		name := fmt.Sprintf("lc%d", i)
		fmt.Fprintf(&batch, "link add %s link eth0 type macvlan mode bridge\n", name)
		fmt.Fprintf(&batch, "addr add %s/32 dev %s\n", a, name)
		fmt.Fprintf(&batch, "link set %s up\n", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "-n", h.NS, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: add link clients: %v: %s", h.Name, err, bytes.TrimSpace(out))
	}
	h.lab.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var del strings.Builder
		for i := range addrs {
			fmt.Fprintf(&del, "link del lc%d\n", i)
		}
		cmd := exec.CommandContext(ctx, "ip", "-n", h.NS, "-force", "-batch", "-")
		cmd.Stdin = strings.NewReader(del.String())
		_ = cmd.Run() // the namespace's deletion removes them anyway
	})
	out := make([]*LinkClient, 0, len(addrs))
	err := h.Do(func() error {
		for i, a := range addrs {
			ifi, err := net.InterfaceByName(fmt.Sprintf("lc%d", i))
			if err != nil {
				return err
			}
			c, err := arp.Dial(ifi)
			if err != nil {
				return fmt.Errorf("ARP socket on %s: %w", ifi.Name, err)
			}
			h.lab.t.Cleanup(func() { c.Close() })
			out = append(out, &LinkClient{Name: ifi.Name, MAC: ifi.HardwareAddr, Addr: a, ARP: c})
		}
		return nil
	})
	return out, err
}

// Ask broadcasts one ARP request for vip from the client, as its kernel would to resolve it.
func (c *LinkClient) Ask(vip netip.Addr) error {
	p, err := arp.NewPacket(arp.OperationRequest, c.MAC, c.Addr, ethernet.Broadcast, vip)
	if err != nil {
		return err
	}
	return c.ARP.WriteTo(p, ethernet.Broadcast)
}

// ForgeARP broadcasts the given ARP packets from the host's eth0 as fast as one raw socket
// sends them, each in a frame from its own sender hardware address (as a forger spoofs both),
// and returns how long the sending took. The frames are built first, so only the sending is
// timed. Traffic stays on the lab's segment.
func (h *Host) ForgeARP(packets []*arp.Packet) (time.Duration, error) {
	frames := make([][]byte, 0, len(packets))
	for _, p := range packets {
		pb, err := p.MarshalBinary()
		if err != nil {
			return 0, err
		}
		fb, err := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: p.SenderHardwareAddr, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
		if err != nil {
			return 0, err
		}
		frames = append(frames, fb)
	}
	var took time.Duration
	err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ARP))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi.Index}); err != nil {
			return err
		}
		start := time.Now()
		// A busy machine drains the link slower than the loop writes: the socket's buffer
		// fills (ENOBUFS). Wait for it to drain, within bounds, as a real flooder's
		// qdisc would.
		waits := 0
		for i, f := range frames {
			for {
				_, err := unix.Write(fd, f)
				if err == nil {
					break
				}
				if !errors.Is(err, unix.ENOBUFS) || waits >= 5000 {
					return fmt.Errorf("forged frame %d of %d (after %d waits for the buffer): %w", i, len(frames), waits, err)
				}
				waits++
				time.Sleep(time.Millisecond)
			}
		}
		took = time.Since(start)
		return nil
	})
	return took, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
