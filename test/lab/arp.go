package lab

import (
	"errors"
	"net"
	"net/netip"
	"slices"
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

// AskARP asks once for vip by ARP from the host and returns the MACs that answered within
// wait, each once, in the order they answered; with first it returns at the first answer.
// Announcements (gratuitous ARP, whose target is vip itself) are not answers.
func (h *Host) AskARP(vip netip.Addr, wait time.Duration, first bool) ([]string, error) {
	c, err := h.DialARP()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Request(vip); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	_ = c.SetReadDeadline(deadline)
	var macs []string
	for time.Now().Before(deadline) {
		p, _, err := c.Read()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			continue // a frame that is not ARP
		}
		if p.Operation != arp.OperationReply || p.SenderIP != vip || p.TargetIP == vip {
			continue
		}
		if mac := p.SenderHardwareAddr.String(); !slices.Contains(macs, mac) {
			macs = append(macs, mac)
		}
		if first {
			break
		}
	}
	return macs, nil
}
