package ipam

import "net/netip"

// PoolOf returns the name of the usable pool whose ranges hold addr, by the allocator's own
// overlap rule (of overlapping pools the older is used): the one answer to "which pool holds
// this address" for every reader. It is a.Index().PoolOf(addr).
func (a *Allocator) PoolOf(addr netip.Addr) (string, bool) {
	return a.index.PoolOf(addr)
}
