package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
)

// DialARP opens an ARP socket on the host's eth0; the caller closes it.
func (h *Host) DialARP() (*arp.Client, error) {
	var c *arp.Client
	err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	})
	return c, err
}

// arpAsker asks for IPv4 addresses by ARP, from self (the interface's first IPv4 address, as
// the arp package sends from).
type arpAsker struct {
	c    *arp.Client
	self netip.Addr
}

// dialARPAsker opens an arpAsker on the host's eth0.
func (h *Host) dialARPAsker() (arpAsker, error) {
	var a arpAsker
	err := h.Do(func() error {
		ifi, self, err := eth0Address(netip.Addr.Is4)
		if err != nil {
			return fmt.Errorf("ARP on %s: %w", h.Name, err)
		}
		a.self = self
		a.c, err = arp.Dial(ifi)
		return err
	})
	return a, err
}

// eth0Address returns eth0 (of the namespace the caller runs in) and its first address that
// is, such as netip.Addr.Is4.
func eth0Address(is func(netip.Addr) bool) (*net.Interface, netip.Addr, error) {
	ifi, err := net.InterfaceByName("eth0")
	if err != nil {
		return nil, netip.Addr{}, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, netip.Addr{}, err
	}
	for _, ad := range addrs {
		if p, err := netip.ParsePrefix(ad.String()); err == nil && is(p.Addr()) {
			return ifi, p.Addr(), nil
		}
	}
	return nil, netip.Addr{}, fmt.Errorf("eth0 has no such address (%v)", addrs)
}

func (a arpAsker) request(vip netip.Addr) error { return a.c.Request(vip) }

// IsTimeout reports whether err is a read's deadline passing (rather than a frame it could not
// parse).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// read returns the next ARP reply to self until deadline. Announcements (gratuitous ARP, whose
// target is the address itself) and answers to other addresses of the host (another asker's)
// are not answers: ok false.
func (a arpAsker) read(deadline time.Time) (vip netip.Addr, mac string, ok bool, err error) {
	_ = a.c.SetReadDeadline(deadline)
	p, _, err := a.c.Read()
	if err != nil {
		if IsTimeout(err) {
			return netip.Addr{}, "", false, err
		}
		return netip.Addr{}, "", false, nil // a frame that is not ARP
	}
	if p.Operation != arp.OperationReply || p.TargetIP == p.SenderIP || p.TargetIP != a.self {
		return netip.Addr{}, "", false, nil // an announcement, or an answer to another address
	}
	return p.SenderIP, p.SenderHardwareAddr.String(), true, nil
}

func (a arpAsker) close() error { return a.c.Close() }
