package pools

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

// Reservation is an address no pool may give out or announce, and what uses it.
type Reservation struct {
	Addr netip.Addr
	Why  string
}

// WithReserved returns the pools with the reserved addresses cut out of their ranges (a copy
// of each pool that holds one, naming them in Reserved; the others as they are). A reserved
// address is then in no pool: the allocator never gives it, and an address a Service holds
// already is announced from no node (Governing fails closed). reserved maps each address to
// what uses it.
func WithReserved(in []*Pool, reserved map[netip.Addr]string) []*Pool {
	if len(reserved) == 0 {
		return in
	}
	addrs := slices.SortedFunc(maps.Keys(reserved), netip.Addr.Compare)
	out := make([]*Pool, 0, len(in))
	for _, p := range in {
		var hit []netip.Addr
		for _, a := range addrs {
			if p.holds(a.Unmap()) {
				hit = append(hit, a.Unmap())
			}
		}
		if len(hit) == 0 {
			out = append(out, p)
			continue
		}
		c := *p
		c.Allocation.Ranges = cutOut(p.Allocation.Ranges, hit)
		c.Reserved = nil
		for _, a := range hit {
			c.Reserved = append(c.Reserved, Reservation{Addr: a, Why: reserved[a]})
		}
		out = append(out, &c)
	}
	return out
}

// cutOut returns ranges without the addresses of cut (sorted), in new slices.
func cutOut(ranges []ipam.Range, cut []netip.Addr) []ipam.Range {
	out := make([]ipam.Range, 0, len(ranges)+len(cut))
	for _, r := range ranges {
		rest := []ipam.Range{r}
		for _, a := range cut {
			var next []ipam.Range
			for _, x := range rest {
				if !x.Contains(a) {
					next = append(next, x)
					continue
				}
				if a != x.First {
					next = append(next, ipam.Range{First: x.First, Last: a.Prev()})
				}
				if a != x.Last {
					next = append(next, ipam.Range{First: a.Next(), Last: x.Last})
				}
			}
			rest = next
		}
		out = append(out, rest...)
	}
	return out
}
