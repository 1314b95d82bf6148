package ipam

import "net/netip"

// PoolOf is the allocator's record of the pool an address was given from, for every reader
// (the announcer asks it before it announces an address): for an address a Service holds, the
// pool the address was given from, or the one Restore derived from the pools, never anything
// a tenant can write that another pool's ranges contradict; "" when no pool held the address
// when it was restored. For an address no Service holds it is the usable pool whose ranges
// hold it (of overlapping pools the older). held says which of the two it is.
//
// Which pool's rules announce the address is Index.Governing of this name: the named pool may
// since have been deleted, become invalid or shrunk so that it no longer holds the address,
// and then the valid pool holding it governs, or none (the caller fails closed).
func (a *Allocator) PoolOf(addr netip.Addr) (pool string, held bool) {
	addr = addr.Unmap()
	if h := a.held[addr]; h != nil {
		return h.pool, true
	}
	name, _ := a.index.PoolOf(addr)
	return name, false
}
