package ipam

import "net/netip"

// PoolOf is the one answer to "which pool's rules govern this address" for every reader (the
// announcer asks it before it announces an address). For an address a Service holds it is the
// allocator's record: the pool the address was given from, or the one Restore derived from
// the pools, never from anything a tenant can write; "" when no pool held the address when it
// was restored. For an address no Service holds it is the usable pool whose ranges hold it
// (of overlapping pools the older). held says which of the two it is.
//
// The named pool may since have been deleted, become invalid or shrunk so that it no longer
// holds the address: the caller checks, and fails closed.
func (a *Allocator) PoolOf(addr netip.Addr) (pool string, held bool) {
	addr = addr.Unmap()
	if h := a.held[addr]; h != nil {
		return h.pool, true
	}
	name, _ := a.index.PoolOf(addr)
	return name, false
}
