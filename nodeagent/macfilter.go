package nodeagent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The MAC filter makes the node take frames sent to the virtual MACs it answers with. A NIC
// drops frames for a MAC it does not have, and the kernel drops those it lets through
// (PACKET_OTHERHOST) unless told: for each interface, the MAC goes into the NIC's unicast
// filter (as `bridge fdb add MAC dev IF self permanent` does) and an nftables rule at the
// interface's ingress marks frames sent to it as the host's. The frames are then the
// interface's own: routing, rp_filter and the answers (from the interface's MAC) are as for
// any other frame. No device is made for a MAC, so the kernel itself never sends from one;
// only the speaker does. What is left after a crash (the table and filter entries) receives
// frames and sends none; the next agent finds it in its table and removes what it does not
// want.

// MACFilter is the seam to what makes the node receive frames sent to virtual MACs.
type MACFilter interface {
	// Set makes want (MACs by interface) the complete set of virtual MACs the node takes
	// frames for. An interface that does not exist is left out and named in the error.
	Set(want map[string][]net.HardwareAddr) error
	// Check puts back what Set made if something else changed it (a firewall reload that
	// flushed every table).
	Check() error
	// Close takes frames for no virtual MAC any more.
	Close() error
}

// macTable is the agent's nftables table (family netdev): a set and an ingress chain per
// interface, named vmac-<interface>.
const macTable = "metalvip"

// nftMACFilter is the MAC filter of a network namespace: nftables and the NICs' unicast
// filters (through rtnetlink).
type nftMACFilter struct {
	mu      sync.Mutex
	nl      *netlink.Handle
	nftOpts []nftables.ConnOption
	closeNS func() error
	known   bool                // applied is what the kernel holds
	applied map[string][]string // MACs ("02:00:cb:00:71:05"), sorted, by interface
}

var _ MACFilter = (*nftMACFilter)(nil)

// NewMACFilter returns the MAC filter of the agent's network namespace. It touches nothing
// until the first Set.
func NewMACFilter() (MACFilter, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &nftMACFilter{nl: h, closeNS: func() error { return nil }}, nil
}

// newMACFilterIn returns the MAC filter of the network namespace ns (for tests that run in the
// lab's namespaces from the test binary's).
func newMACFilterIn(ns netns.NsHandle) (*nftMACFilter, error) {
	h, opts, closeNS, err := handlesIn(ns)
	if err != nil {
		return nil, err
	}
	return &nftMACFilter{nl: h, nftOpts: opts, closeNS: closeNS}, nil
}

// handlesIn returns a netlink handle and the nftables option for the network namespace ns,
// and what releases the namespace once both are done with.
func handlesIn(ns netns.NsHandle) (*netlink.Handle, []nftables.ConnOption, func() error, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, nil, nil, err
	}
	dup, err := unix.Dup(int(ns))
	if err != nil {
		h.Close()
		return nil, nil, nil, err
	}
	return h, []nftables.ConnOption{nftables.WithNetNSFd(dup)}, func() error { return unix.Close(dup) }, nil
}

func (f *nftMACFilter) Set(want map[string][]net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := map[string][]string{}
	for ifname, macs := range want {
		for _, m := range macs {
			next[ifname] = append(next[ifname], m.String())
		}
		if len(next[ifname]) > 0 {
			slices.Sort(next[ifname])
			next[ifname] = slices.Compact(next[ifname])
		}
	}
	if !f.known {
		cur, err := f.read()
		if err != nil {
			if len(next) == 0 && errors.Is(err, unix.EPERM) {
				// An agent without NET_ADMIN can have put nothing there, and needs nothing.
				f.known, f.applied = true, nil
				return nil
			}
			return err
		}
		f.known, f.applied = true, cur
	}
	if maps.EqualFunc(f.applied, next, slices.Equal) {
		return nil
	}
	return f.apply(next)
}

func (f *nftMACFilter) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.known {
		return nil // nothing set yet
	}
	cur, err := f.read()
	if err != nil {
		return err
	}
	if maps.EqualFunc(f.applied, cur, slices.Equal) {
		return nil
	}
	return f.apply(f.applied)
}

func (f *nftMACFilter) Close() error {
	err := f.Set(nil)
	f.nl.Close()
	return errors.Join(err, f.closeNS())
}

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: macTable}
}

func setName(ifname string) string { return "vmac-" + ifname }

// read returns what the table holds: the MACs of each interface's set.
func (f *nftMACFilter) read() (map[string][]string, error) {
	c, err := nftables.New(f.nftOpts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(macTable, nftables.TableFamilyNetdev); errors.Is(err, unix.ENOENT) {
		return map[string][]string{}, nil
	} else if err != nil {
		return nil, fmt.Errorf("nftables: table netdev %s: %w", macTable, err)
	}
	sets, err := c.GetSets(table())
	if err != nil {
		return nil, fmt.Errorf("nftables: list table netdev %s: %w", macTable, err)
	}
	out := map[string][]string{}
	for _, s := range sets {
		ifname, ok := strings.CutPrefix(s.Name, "vmac-")
		if !ok {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("nftables: list set %s: %w", s.Name, err)
		}
		for _, e := range els {
			if len(e.Key) >= 6 {
				out[ifname] = append(out[ifname], net.HardwareAddr(e.Key[:6]).String())
			}
		}
		slices.Sort(out[ifname])
	}
	return out, nil
}

// apply makes next what the kernel holds: new MACs into the NICs' filters first, then the
// table replaced in one transaction, then the MACs no longer wanted out of the filters. On
// failure f.known is cleared, so that the next call reads the kernel again.
func (f *nftMACFilter) apply(next map[string][]string) error {
	var errs []error
	links := map[string]netlink.Link{}
	for _, ifname := range slices.Sorted(maps.Keys(next)) {
		l, err := f.nl.LinkByName(ifname)
		if err != nil {
			errs = append(errs, fmt.Errorf("interface %s: %w", ifname, err))
			delete(next, ifname)
			continue
		}
		links[ifname] = l
		for _, m := range next[ifname] {
			if !slices.Contains(f.applied[ifname], m) {
				if err := f.unicast(f.nl.NeighAdd, l, m); err != nil && !errors.Is(err, unix.EEXIST) {
					// Not fatal: many drivers go promiscuous instead, and veths take every frame.
					errs = append(errs, fmt.Errorf("add %s to the unicast filter of %s: %w", m, ifname, err))
				}
			}
		}
	}

	c, err := nftables.New(f.nftOpts...)
	if err != nil {
		f.known = false
		return errors.Join(append(errs, fmt.Errorf("nftables: %w", err))...)
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t) // together with the next AddTable, one transaction replaces the table whole
	if len(next) > 0 {
		c.AddTable(t)
		for _, ifname := range slices.Sorted(maps.Keys(next)) {
			if err := addReceiveChain(c, t, ifname, next[ifname]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		f.known = false
		return errors.Join(append(errs, fmt.Errorf("nftables: replace table netdev %s: %w", macTable, err))...)
	}

	for ifname, macs := range f.applied {
		for _, m := range macs {
			if slices.Contains(next[ifname], m) {
				continue
			}
			l, err := f.nl.LinkByName(ifname)
			if err != nil {
				continue // gone, and its filter with it
			}
			if err := f.unicast(f.nl.NeighDel, l, m); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove %s from the unicast filter of %s: %w", m, ifname, err))
			}
		}
	}
	f.applied = next
	return errors.Join(errs...)
}

// unicast adds or removes mac in the NIC's unicast address filter.
func (f *nftMACFilter) unicast(op func(*netlink.Neigh) error, l netlink.Link, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	return op(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, HardwareAddr: hw})
}

// addReceiveChain adds to c the set of an interface's MACs and the chain that marks frames
// sent to one of them as the host's:
//
//	set vmac-IF { type ether_addr; elements = { ... } }
//	chain vmac-IF { type filter hook ingress device IF priority -500; ether daddr @vmac-IF meta pkttype set host }
func addReceiveChain(c *nftables.Conn, t *nftables.Table, ifname string, macs []string) error {
	set := &nftables.Set{Table: t, Name: setName(ifname), KeyType: nftables.TypeEtherAddr}
	var els []nftables.SetElement
	for _, m := range macs {
		hw, err := net.ParseMAC(m)
		if err != nil {
			return err
		}
		els = append(els, nftables.SetElement{Key: hw})
	}
	if err := c.AddSet(set, els); err != nil {
		return fmt.Errorf("nftables: set %s: %w", set.Name, err)
	}
	ch := c.AddChain(&nftables.Chain{
		Name: setName(ifname), Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityRef(-500), Device: ifname,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: 6},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Immediate{Register: 1, Data: []byte{unix.PACKET_HOST}},
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, SourceRegister: true, Register: 1},
	}})
	return nil
}
