package ipam

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// Assign gives a Service its addresses, or returns those it holds when they still fit its
// request. On failure the Service keeps what it held (returned beside the error).
func (a *Allocator) Assign(s Service) (Allocation, error) {
	fams, err := wantedFamilies(&s)
	var cur Allocation
	rec := a.services[s.Key]
	if rec != nil {
		cur = rec.alloc
	}
	if err != nil {
		return cloneAlloc(cur), err
	}
	// A Service that can no longer share its addresses (it changed its sharing key, ports or
	// traffic policy) is the one that moves; the others keep theirs.
	sharesOK := rec == nil || a.checkShares(&s, cur) == nil
	if rec != nil && sharesOK && a.fits(&s, cur, fams, true) {
		a.commit(&s, cur, cur)
		return cloneAlloc(cur), nil
	}
	if rec != nil && sharesOK && a.fits(&s, cur, fams, false) {
		// The request still holds but a preferred family is missing: top up in the same pool
		// if that works, and keep what is held whatever happens.
		if p := a.pools[cur.Pool]; p != nil && p.usable() && p.admits(&s) {
			if next, err := a.tryPool(&s, fams, p, cur); err == nil {
				a.commit(&s, cur, next)
				return cloneAlloc(next), nil
			}
		}
		a.commit(&s, cur, cur)
		return cloneAlloc(cur), nil
	}

	pools, err := a.candidates(&s, cur)
	if err != nil {
		return cloneAlloc(cur), err
	}
	var first error
	for _, p := range pools {
		next, err := a.tryPool(&s, fams, p, cur)
		if err == nil {
			a.commit(&s, cur, next)
			return cloneAlloc(next), nil
		}
		if first == nil {
			first = err
		}
	}
	return cloneAlloc(cur), first
}

// fits reports whether the held allocation still answers the Service's request. With
// strict, every wanted family must be held; without, a PreferDualStack Service may lack one.
func (a *Allocator) fits(s *Service, cur Allocation, fams []Family, strict bool) bool {
	if len(cur.IPs) == 0 {
		return false
	}
	if s.Pool != "" && cur.Pool != s.Pool {
		return false
	}
	if len(s.IPs) > 0 {
		if len(s.IPs) != len(cur.IPs) {
			return false
		}
		for _, ip := range s.IPs {
			if !slices.Contains(cur.IPs, ip) {
				return false
			}
		}
	}
	n := perFamily(s)
	held := 0
	for _, ip := range cur.IPs {
		f := FamilyOf(ip)
		if !slices.Contains(fams, f) || countFamily(cur.IPs, f) != n {
			return false
		}
	}
	for _, f := range fams {
		if countFamily(cur.IPs, f) > 0 {
			held++
		}
	}
	if held == len(fams) {
		return true
	}
	return !strict && s.Policy == PreferDualStack
}

// checkShares checks that a Service keeping its addresses is still compatible with the other
// Services sharing them.
func (a *Allocator) checkShares(s *Service, cur Allocation) error {
	for _, ip := range cur.IPs {
		h := a.held[ip]
		if h == nil || len(h.users) == 1 {
			continue
		}
		if err := compatible(h, s, true); err != nil {
			return err
		}
	}
	return nil
}

// compatible reports why s may not share h's address, or nil. joinRules adds the rules that
// hold only for a Service joining the address (not yet among its users): an address shared
// before a rule existed stays shared (an address never moves because metalvip changed).
func compatible(h *holder, s *Service, joinRules bool) error {
	others := make([]string, 0, len(h.users))
	for k := range h.users {
		if k != s.Key {
			others = append(others, k)
		}
	}
	if len(others) == 0 {
		return nil
	}
	slices.Sort(others)
	first := serviceKey(others[0])
	if h.key == "" || s.SharingKey != h.key {
		format := "address %s is held by %s, which does not share it under this Service's sharing key; choose another address or give both Services the same metalvip.io/sharing-key"
		if s.SharingKey == "" {
			format = "address %s is held by %s; choose another address, or give both Services the same metalvip.io/sharing-key if they should share it"
		}
		e := errorf(ErrInUse, format, h.ip, first)
		e.Holder = others[0]
		return e
	}
	if h.local != s.LocalTraffic {
		e := errorf(ErrSharing, "address %s is shared by %s with externalTrafficPolicy %s; Services sharing an address must have the same externalTrafficPolicy", h.ip, first, etp(h.local))
		e.Holder = others[0]
		return e
	}
	if joinRules && s.LocalTraffic && !hasUser(h, s.Key) && h.selector != s.Selector {
		e := errorf(ErrSharing, "address %s is shared by %s, whose pods are selected by %q; Services with externalTrafficPolicy Local share an address only when they select the same pods (only nodes running them announce it)", h.ip, first, h.selector)
		e.Holder = others[0]
		return e
	}
	for _, o := range others {
		for _, p := range h.users[o] {
			if slices.Contains(s.Ports, p) {
				e := errorf(ErrSharing, "port %s on address %s is already used by %s, which shares it; use another port or another sharing key", p, h.ip, serviceKey(o))
				e.Holder = o
				return e
			}
		}
	}
	return nil
}

func etp(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

// candidates returns the pools a Service may get addresses from, in order of preference.
func (a *Allocator) candidates(s *Service, cur Allocation) ([]*pool, error) {
	if s.Pool != "" {
		p, ok := a.pools[s.Pool]
		if !ok {
			return nil, errorf(ErrNoPool, "IP pool %q named by the Service (metalvip.io/pool, or MetalLB's address-pool) does not exist; create it or name another pool", s.Pool)
		}
		if !p.usable() {
			return nil, errorf(ErrPoolUnusable, "IP pool %q overlaps the older pool %q and is not used until the overlap is removed", p.Name, p.shadowedBy)
		}
		if !p.admits(s) {
			return nil, errorf(ErrNotAdmitted, "IP pool %q does not admit this Service (see its spec.serviceAllocation)", p.Name)
		}
		return []*pool{p}, nil
	}
	if len(s.IPs) > 0 {
		var p *pool
		for _, ip := range s.IPs {
			q := a.poolOf(ip)
			if q == nil {
				return nil, errorf(ErrNoPool, "requested address %s is not in any IP pool; request an address from a pool, or add it to one", ip)
			}
			if p != nil && q != p {
				return nil, errorf(ErrRequest, "requested addresses are in two pools, %q and %q; a Service takes all its addresses from one pool", p.Name, q.Name)
			}
			p = q
		}
		if !p.admits(s) {
			return nil, errorf(ErrNotAdmitted, "requested address %s is in IP pool %q, which does not admit this Service (see its spec.serviceAllocation)", s.IPs[0], p.Name)
		}
		return []*pool{p}, nil
	}
	var out []*pool
	for _, p := range a.pools {
		if p.usable() && p.AutoAssign && p.admits(s) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(x, y *pool) int {
		switch {
		case x.Priority != nil && y.Priority == nil:
			return -1
		case x.Priority == nil && y.Priority != nil:
			return 1
		case x.Priority != nil && *x.Priority != *y.Priority:
			return cmp.Compare(*x.Priority, *y.Priority)
		}
		return strings.Compare(x.Name, y.Name)
	})
	if c := a.pools[cur.Pool]; c != nil && c.usable() && c.admits(s) {
		out = slices.DeleteFunc(out, func(p *pool) bool { return p == c })
		out = append([]*pool{c}, out...)
	}
	if len(out) == 0 {
		return nil, errorf(ErrNoPool, "no IP pool with autoAssign admits this Service; create one, widen a pool's serviceAllocation, or name a pool with metalvip.io/pool")
	}
	return out, nil
}

// tryPool works out the Service's addresses in p without changing anything.
func (a *Allocator) tryPool(s *Service, fams []Family, p *pool, cur Allocation) (Allocation, error) {
	next := Allocation{Pool: p.Name}
	var skipped error
	for _, f := range fams {
		var got []netip.Addr
		var err error
		for range perFamily(s) {
			var ip netip.Addr
			if ip, err = a.pick(s, f, p, cur, got); err != nil {
				break
			}
			got = append(got, ip)
		}
		if err != nil {
			if s.Policy == PreferDualStack && len(s.IPs) == 0 && len(fams) > 1 {
				skipped = err
				continue
			}
			return Allocation{}, err
		}
		slices.SortFunc(got, netip.Addr.Compare)
		next.IPs = append(next.IPs, got...)
	}
	if len(next.IPs) == 0 {
		return Allocation{}, skipped
	}
	return next, nil
}

// pick chooses an address of family f in p for the Service, other than those it got already
// in this allocation (got).
func (a *Allocator) pick(s *Service, f Family, p *pool, cur Allocation, got []netip.Addr) (netip.Addr, error) {
	want := requested(s, f)
	if c := ofFamily(cur.IPs, f, got...); c.IsValid() && cur.Pool == p.Name && (!want.IsValid() || want == c) {
		if h := a.held[c]; h == nil || compatible(h, s, true) == nil {
			return c, nil
		}
	}
	if want.IsValid() {
		if !p.contains(want) {
			return netip.Addr{}, errorf(ErrRequest, "requested address %s is not in IP pool %q", want, p.Name)
		}
		if h := a.held[want]; h != nil {
			if _, mine := h.users[s.Key]; mine && len(h.users) == 1 {
				return want, nil
			}
			if err := compatible(h, s, true); err != nil {
				return netip.Addr{}, err
			}
			return want, nil
		}
		if fs := p.free[f]; fs == nil || !fs.has(want) {
			return netip.Addr{}, errorf(ErrRequest, "requested address %s is skipped by IP pool %q (avoidBuggyIPs: addresses ending in .0 or .255)", want, p.Name)
		}
		return want, nil
	}
	if s.SharingKey != "" {
		var best *holder
		for ip, h := range a.byKey[s.SharingKey] {
			if FamilyOf(ip) != f || !p.contains(ip) || (p.AvoidBuggyIPs && buggy(ip)) || compatible(h, s, true) != nil {
				continue
			}
			if best == nil || ip.Less(best.ip) {
				best = h
			}
		}
		if best != nil {
			return best.ip, nil
		}
	}
	if !p.hasFamily(f) {
		return netip.Addr{}, errorf(ErrExhausted, "IP pool %q has no %s addresses; the Service's ipFamilies need one", p.Name, f)
	}
	if fs := p.free[f]; fs != nil {
		if a, ok := fs.lowestNotIn(got); ok {
			return a, nil
		}
	}
	if n := perFamily(s); n > 1 {
		return netip.Addr{}, errorf(ErrExhausted, "IP pool %q has fewer than %d free %s addresses; the Service stays pending until enough are freed or the pool grows", p.Name, n, f)
	}
	return netip.Addr{}, errorf(ErrExhausted, "IP pool %q has no free %s address; the Service stays pending until one is freed or the pool grows", p.Name, f)
}

// commit moves the Service from cur to next.
func (a *Allocator) commit(s *Service, cur, next Allocation) {
	var lingering []netip.Addr
	if rec := a.services[s.Key]; rec != nil {
		lingering = rec.lingering
	}
	for _, ip := range cur.IPs {
		if !slices.Contains(next.IPs, ip) && !slices.Contains(lingering, ip) {
			lingering = append(lingering, ip)
		}
	}
	var keep []netip.Addr
	for _, ip := range lingering {
		switch {
		case slices.Contains(next.IPs, ip):
			// Taken back: held again below.
		case slices.Contains(s.Published, ip):
			keep = append(keep, ip)
		default:
			a.drop(s.Key, ip)
		}
	}
	for _, ip := range next.IPs {
		a.hold(s, ip, next.Pool)
	}
	a.services[s.Key] = &record{alloc: cloneAlloc(next), lingering: keep}
}
