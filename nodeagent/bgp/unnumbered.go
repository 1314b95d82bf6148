package bgp

import (
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"k8s.io/klog/v2"
)

// An unnumbered peer (Peer.Interface) is the one link-local neighbour of its link. Each side
// must learn the other's link-local address before the session can come up:
//
//   - gobgp looks the router up in the kernel's neighbour table when the peer is added (more
//     than one non-failed link-local entry, and it refuses: point-to-point links only). The
//     router's own Router Advertisements may be minutes apart, so the speaker asks: an ICMPv6
//     echo request to all nodes on the link (ff02::1), which the router answers after
//     soliciting this node's address; its Neighbor Solicitation puts it in the table.
//   - FRR accepts a session on an unnumbered link ("neighbor IF interface") only from the
//     address it learned from a Router Advertisement received on it. The speaker sends one
//     with a router lifetime of 0 (RFC 4861: not a default router, so no host routes through
//     the node), as FRR on a node would.
//
// Both go out when the peer is added and again every unnumberedRetry while its session is not
// established (a router that restarted has forgotten the node).
const (
	// unnumberedResolve is how long the first attempt to add an unnumbered peer waits for
	// the answer to the solicitation.
	unnumberedResolve = 100 * time.Millisecond
	// unnumberedRetry is the wait between solicitations while the session is not up.
	unnumberedRetry = time.Second
)

// solicitNeighbours sends a Router Advertisement (lifetime 0) and an ICMPv6 echo request to
// ff02::1 on iface. Best effort: a failure is logged, and the next attempt sends again.
func solicitNeighbours(iface string) {
	if err := advertise(iface); err != nil {
		klog.V(2).InfoS("Cannot advertise this node on an unnumbered link", "interface", iface, "err", err)
	}
	if err := echoAllNodes(iface); err != nil {
		klog.V(2).InfoS("Cannot solicit the neighbours of an unnumbered link", "interface", iface, "err", err)
	}
}

func advertise(iface string) error {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return err
	}
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return err
	}
	defer c.Close()
	ra := &ndp.RouterAdvertisement{
		CurrentHopLimit: 64,
		RouterLifetime:  0,
		Options:         []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	return c.WriteTo(ra, nil, netip.IPv6LinkLocalAllNodes())
}

func echoAllNodes(iface string) error {
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return err
	}
	defer c.Close()
	msg := icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("metalvip")}}
	b, err := msg.Marshal(nil) // the kernel fills in the checksum of ICMPv6 raw sockets
	if err != nil {
		return err
	}
	_, err = c.WriteTo(b, &net.IPAddr{IP: net.IPv6linklocalallnodes, Zone: iface})
	return err
}
