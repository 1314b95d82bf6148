package ipam

import (
	"cmp"
	"net/netip"
	"slices"
)

// Restore records what a Service holds according to its status, before anything is
// assigned; the pool al names is a claim, checked against the pools (restoredPool). It refuses an address another Service holds and may not share with it (the
// caller restores Services oldest first, so the older keeps the address).
func (a *Allocator) Restore(s Service, al Allocation) error {
	for _, ip := range al.IPs {
		if h := a.held[ip]; h != nil {
			// Not as a joiner: an address shared before the selector rule stays shared.
			if err := compatible(h, &s, false); err != nil {
				e := errorf(ErrConflict, "address %s in this Service's status is also held by %s: %v", ip, serviceKeys(sortedUsers(h)), err)
				e.Holder = sortedUsers(h)[0]
				return e
			}
		}
	}
	if len(al.IPs) > 0 {
		al.Pool = a.restoredPool(al.Pool, al.IPs[0])
	}
	cur := Allocation{}
	if rec := a.services[s.Key]; rec != nil {
		cur = rec.alloc
	}
	a.commit(&s, cur, al)
	return nil
}

// Record is a Service and the allocation its status shows.
type Record struct {
	Service    Service
	Allocation Allocation
	// Moving says the Service was given other addresses than its status shows (its
	// allocation annotation differs): the controller stopped before the status was written.
	Moving bool
}

// Rebuild restores records after a restart: first those whose addresses still answer their
// Service's current request and were not moving, then the others; within each, Services with a
// sharing key before those without (two statuses showing one address are evidence of agreed
// sharing, and a Service without a key that shows a shared address is the one that changed),
// then in the order given (the caller gives oldest first). It returns why each record it could
// not restore was refused; those Services get new addresses when next assigned.
func (a *Allocator) Rebuild(recs []Record) map[string]error {
	rank := func(r Record) int {
		n := 0
		if r.Moving || !a.Fits(r.Service, r.Allocation) {
			n += 2
		}
		if r.Service.SharingKey == "" {
			n++
		}
		return n
	}
	ordered := slices.Clone(recs)
	slices.SortStableFunc(ordered, func(x, y Record) int { return cmp.Compare(rank(x), rank(y)) })
	errs := map[string]error{}
	for _, r := range ordered {
		if len(r.Allocation.IPs) == 0 {
			continue
		}
		if err := a.Restore(r.Service, r.Allocation); err != nil {
			errs[r.Service.Key] = err
		}
	}
	return errs
}

// Fits reports whether an allocation answers a Service's request (pool, requested addresses,
// families), so that assigning the Service would keep it.
func (a *Allocator) Fits(s Service, al Allocation) bool {
	fams, err := wantedFamilies(&s)
	return err == nil && a.fits(&s, al, fams, false)
}

// restoredPool decides the pool an address a Service's status shows was given from, after a
// restart. The Service's own record of it (recorded, an annotation anyone who may edit the
// Service can write) is a claim: believed when the named pool's ranges hold the address (of
// overlapping pools, the one it was given from) and when no valid pool of that name exists
// (deleted or invalid: the Service keeps the pool it asked for, as before the restart); a name
// of a valid pool that does not hold the address is ignored: the usable pool holding it, else
// the oldest shadowed one. Which pool's rules announce the address is not this record but
// governing, from the pools' ranges: a name of a pool that is gone governs nothing, so a
// tenant can neither pick another pool's rules nor make its address an orphan.
func (a *Allocator) restoredPool(recorded string, addr netip.Addr) string {
	if _, exists := a.pools[recorded]; !exists && recorded != "" {
		return recorded
	}
	if name, ok := a.index.Governing(recorded, addr); ok {
		return name
	}
	return recorded
}
