package ipam

import (
	"net/netip"
	"slices"
)

// Withdraw gives up everything a Service holds, as when it stops being a LoadBalancer or is
// being deleted. Addresses its status still shows (published) stay held until Published or
// Release says they are gone from it.
func (a *Allocator) Withdraw(key string, published []netip.Addr) {
	rec := a.services[key]
	if rec == nil {
		return
	}
	a.commit(&Service{Key: key, Published: published}, rec.alloc, Allocation{})
	if rec := a.services[key]; len(rec.lingering) == 0 {
		delete(a.services, key)
	}
}

// Known reports whether the allocator holds anything for a Service, lingering addresses
// included.
func (a *Allocator) Known(key string) bool {
	_, ok := a.services[key]
	return ok
}

// Published tells the allocator which addresses a Service's status shows now; addresses it
// gave up and no longer shows are freed.
func (a *Allocator) Published(key string, ips []netip.Addr) {
	rec := a.services[key]
	if rec == nil || len(rec.lingering) == 0 {
		return
	}
	var keep []netip.Addr
	for _, ip := range rec.lingering {
		if slices.Contains(ips, ip) {
			keep = append(keep, ip)
		} else {
			a.drop(key, ip)
		}
	}
	rec.lingering = keep
	if len(keep) == 0 && len(rec.alloc.IPs) == 0 {
		delete(a.services, key)
	}
}

// Lingering returns the addresses a Service gave up that its status still shows.
func (a *Allocator) Lingering(key string) []netip.Addr {
	if rec := a.services[key]; rec != nil {
		return slices.Clone(rec.lingering)
	}
	return nil
}

// hold makes s a holder of ip.
func (a *Allocator) hold(s *Service, ip netip.Addr, poolName string) {
	h := a.held[ip]
	if h == nil {
		q := a.poolOf(ip)
		if q != nil {
			q.free[FamilyOf(ip)].take(ip)
		}
		h = &holder{ip: ip, pool: poolName, users: map[string][]Port{}}
		a.held[ip] = h
		a.count(ip, q, 1)
		if q == nil || q.Name != poolName {
			a.trackOrphan(h)
		}
	}
	if len(h.users) == 0 || (len(h.users) == 1 && hasUser(h, s.Key)) {
		// The only holder decides how the address may be shared.
		if h.key != s.SharingKey {
			a.unindexKey(h)
			h.key = s.SharingKey
		}
		h.local, h.selector = s.LocalTraffic, s.Selector
	}
	h.users[s.Key] = slices.Clone(s.Ports)
	if h.key != "" {
		m := a.byKey[h.key]
		if m == nil {
			m = map[netip.Addr]*holder{}
			a.byKey[h.key] = m
		}
		m[ip] = h
	}
}

func hasUser(h *holder, key string) bool {
	_, ok := h.users[key]
	return ok
}

func (a *Allocator) unindexKey(h *holder) {
	if h.key == "" {
		return
	}
	if m := a.byKey[h.key]; m != nil {
		delete(m, h.ip)
		if len(m) == 0 {
			delete(a.byKey, h.key)
		}
	}
}

// drop removes key from ip's holders, freeing ip when none is left.
func (a *Allocator) drop(key string, ip netip.Addr) {
	h := a.held[ip]
	if h == nil {
		return
	}
	delete(h.users, key)
	if len(h.users) > 0 {
		return
	}
	a.unindexKey(h)
	a.untrackOrphan(h)
	delete(a.held, ip)
	p := a.poolOf(ip)
	a.count(ip, p, -1)
	if p != nil {
		p.free[FamilyOf(ip)].add(Range{ip, ip}) // nothing when ip is a skipped .0 or .255
	}
}

// Release frees everything a Service holds.
func (a *Allocator) Release(key string) {
	rec, ok := a.services[key]
	if !ok {
		return
	}
	for _, ip := range rec.alloc.IPs {
		a.drop(key, ip)
	}
	for _, ip := range rec.lingering {
		a.drop(key, ip)
	}
	delete(a.services, key)
}
