package lab

import (
	"errors"
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

// arpAsker asks for IPv4 addresses by ARP.
type arpAsker struct{ c *arp.Client }

func (a arpAsker) request(vip netip.Addr) error { return a.c.Request(vip) }

// read returns the next ARP reply until deadline. Announcements (gratuitous ARP, whose target
// is the address itself) are not answers: ok false.
func (a arpAsker) read(deadline time.Time) (vip netip.Addr, mac string, ok bool, err error) {
	_ = a.c.SetReadDeadline(deadline)
	p, _, err := a.c.Read()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return netip.Addr{}, "", false, err
		}
		return netip.Addr{}, "", false, nil // a frame that is not ARP
	}
	if p.Operation != arp.OperationReply || p.TargetIP == p.SenderIP {
		return netip.Addr{}, "", false, nil
	}
	return p.SenderIP, p.SenderHardwareAddr.String(), true, nil
}

func (a arpAsker) close() error { return a.c.Close() }
