package announcer

import (
	"net/netip"

	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// addrPools owns which pool's rules announce each planned address. It resolves an address's
// pool from the allocator's record, never from anything a tenant writes on the Service;
// remembers the pool each address was planned with; and tells which addresses a change of
// the pools plans again. Only the loop calls it.
type addrPools struct {
	records Records // nil: the pool whose ranges hold the address
	planned map[netip.Addr]*pools.Pool
}

func newAddrPools(records Records) addrPools {
	return addrPools{records: records, planned: map[netip.Addr]*pools.Pool{}}
}

// resolve returns the pool whose rules announce an address now: for an address a Service
// holds, the pool the allocator records it was given from while that pool still holds it,
// else the valid pool holding it (pools.Set.Governing); for another (an externalIP) the pool
// whose ranges hold it. nil fails closed: the address is announced from no node.
func (x *addrPools) resolve(set *pools.Set, ip netip.Addr) *pools.Pool {
	if x.records != nil {
		if name, held := x.records.PoolOf(ip); held {
			return set.Governing(name, ip)
		}
	}
	return set.PoolOf(ip)
}

// of returns the pool an address was planned with (nil: none, or not planned).
func (x *addrPools) of(ip netip.Addr) *pools.Pool { return x.planned[ip] }

// plan records the pool an address is planned with; nil forgets the address.
func (x *addrPools) plan(ip netip.Addr, p *pools.Pool) {
	if p == nil {
		delete(x.planned, ip)
		return
	}
	x.planned[ip] = p
}

// replan returns which of the shown addresses a change of the pools (set, now; changed:
// the names of the pools that changed) plans again: those whose pool is another now, and
// those whose pool's spec changed.
func (x *addrPools) replan(set *pools.Set, shown map[netip.Addr][]string, changed map[string]bool) []netip.Addr {
	var out []netip.Addr
	for ip := range shown {
		p := x.resolve(set, ip)
		if p != x.planned[ip] || p != nil && changed[p.Name] {
			out = append(out, ip)
		}
	}
	return out
}
