package lab

import (
	"net/netip"
	"slices"
	"time"
)

// asker asks for addresses on a host's eth0 and reads the answers: ARP for IPv4 (arpAsker),
// NDP for IPv6 (ndpAsker).
type asker interface {
	request(vip netip.Addr) error
	// read returns the next answer until deadline: the address it answers for and the MAC it
	// names; ok false for what is not an answer (an announcement, another protocol); an error
	// at the deadline.
	read(deadline time.Time) (vip netip.Addr, mac string, ok bool, err error)
	close() error
}

// dialAsker opens an asker for one family on the host's eth0; the caller closes it.
func (h *Host) dialAsker(v6 bool) (asker, error) {
	if v6 {
		return h.dialNDP()
	}
	return h.dialARPAsker()
}

// NeighborReplies asks once for vip from the host, by ARP for IPv4 and NDP for IPv6, and
// returns the MAC of every answer within wait, in the order they came: a MAC as often as it
// answered (two nodes answering with one virtual MAC give it twice; so does another asker on
// the host asking at the same time). With first it returns at the first answer.
func (h *Host) NeighborReplies(vip netip.Addr, wait time.Duration, first bool) ([]string, error) {
	a, err := h.dialAsker(vip.Is6())
	if err != nil {
		return nil, err
	}
	defer a.close()
	if err := a.request(vip); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	var macs []string
	for time.Now().Before(deadline) {
		got, mac, ok, err := a.read(deadline)
		if err != nil {
			break // the deadline
		}
		if !ok || got != vip {
			continue
		}
		macs = append(macs, mac)
		if first {
			break
		}
	}
	return macs, nil
}

// AskNeighbor is NeighborReplies with each MAC once, in the order they first answered.
func (h *Host) AskNeighbor(vip netip.Addr, wait time.Duration, first bool) ([]string, error) {
	replies, err := h.NeighborReplies(vip, wait, first)
	var macs []string
	for _, m := range replies {
		if !slices.Contains(macs, m) {
			macs = append(macs, m)
		}
	}
	return macs, err
}
