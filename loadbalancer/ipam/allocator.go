// Package ipam decides which addresses Services of type LoadBalancer get from the IP pools.
//
// It is pure: values in, values out, no clients, no clocks, no goroutines, and not safe for
// concurrent use (the caller serialises calls). The Services themselves are the source of
// truth: a caller rebuilds an Allocator after a restart by Restoring every Service's recorded
// addresses before it Assigns anything, so a restart never moves or duplicates an address.
//
// Rules:
//   - A Service keeps its addresses as long as its own request (pool annotation, requested
//     addresses, families, sharing) still holds: changes to pools never take an address away.
//   - Pool choice: the pool the Service names; else the pool holding the address it requests;
//     else every pool with autoAssign that admits it, lowest priority value first, pools
//     without a priority last, ties by name. The lowest free address is given.
//   - Of two overlapping pools, the older (lower Order) is used and the younger is not, until
//     the overlap is removed.
//   - Services with the same sharing key share an address when their ports do not collide
//     and their externalTrafficPolicy is the same.
//
// Cost, whatever the size of a pool (0.0.0.0/0 and ::/0 included, avoidBuggyIPs or not):
// finding, taking and giving back an address is O(log n) in the number of free intervals of
// the pool (at most one more than its allocated addresses); a pool's status figures cost
// O(1) and its orphans O(k log k) for k orphans; a pool change (SetPools) costs
// O((r + h) log(r + h)) for r ranges and h held addresses. No cost grows with the number of
// addresses a range spans: .0 and .255 are skipped by arithmetic, never by splitting ranges.
//
// The package must not touch the Kubernetes API or any clock: the caller converts objects
// to Pool and Service values and serialises calls.
package ipam

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Pool is an IP pool as the allocator sees it.
type Pool struct {
	Name          string
	Ranges        []Range
	AutoAssign    bool
	AvoidBuggyIPs bool
	// Priority orders pools for Services that name none; nil sorts after every value.
	Priority *int32
	// Namespaces, NamespaceSelector and ServiceSelector limit the Services served; empty or
	// nil limits nothing.
	Namespaces        []string
	NamespaceSelector labels.Selector
	ServiceSelector   labels.Selector
	// Order is the pool's age rank (creation time): of two overlapping pools the lower Order
	// is used.
	Order int64
}

// FamilyPolicy is a Service's spec.ipFamilyPolicy.
type FamilyPolicy uint8

// The policies.
const (
	SingleStack FamilyPolicy = iota
	PreferDualStack
	RequireDualStack
)

// Port is one port of a Service, for the sharing rules.
type Port struct {
	Protocol string
	Port     int32
}

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Service is what the allocator needs of a Service.
type Service struct {
	Key             string // namespace/name
	Namespace       string
	Labels          map[string]string
	NamespaceLabels map[string]string
	Families        []Family // spec.ipFamilies; empty means IPv4
	Policy          FamilyPolicy
	Pool            string       // requested pool (metalvip.io/pool)
	IPs             []netip.Addr // requested addresses (metalvip.io/ips or spec.loadBalancerIP)
	SharingKey      string
	// Count is how many addresses of each family the Service gets (metalvip.io/vip-count);
	// 0 means 1. More than one cannot be combined with requested addresses or a sharing key.
	Count        int
	Ports        []Port
	LocalTraffic bool // externalTrafficPolicy: Local
	// Published are the addresses in the Service's status now. An address the Service gives
	// up stays held until its status no longer shows it (see Published), so that it is
	// never handed to another Service while clients may still be sent to it.
	Published []netip.Addr
}

// Allocation is what a Service holds.
type Allocation struct {
	Pool string
	IPs  []netip.Addr // in the order of the Service's families; Count of each, ascending
}

// Error kinds, checked with errors.Is.
var (
	ErrNoPool       = errors.New("no pool")
	ErrPoolUnusable = errors.New("pool unusable")
	ErrNotAdmitted  = errors.New("not admitted")
	ErrExhausted    = errors.New("pool exhausted")
	ErrInUse        = errors.New("address in use")
	ErrSharing      = errors.New("sharing conflict")
	ErrRequest      = errors.New("invalid request")
	ErrConflict     = errors.New("conflicting records")
)

// Error is an allocation failure: a kind and a message for the Service's owner that says why
// and what to do.
type Error struct {
	Kind   error
	Msg    string
	Holder string // the Service holding a contested address, if any
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

type pool struct {
	Pool                         // Ranges merged and sorted
	free     map[Family]*freeSet // nil for a pool that is not used
	capacity map[Family]*big.Int
	// allocated counts the held addresses in the pool's ranges that it could give (not .0 or
	// .255 with avoidBuggyIPs), whoever gave them.
	allocated  map[Family]int64
	shadowedBy string   // an older pool this one overlaps: this one is not used
	overlaps   []string // every pool this one overlaps, sorted (shared with the Index)
}

func (p *pool) usable() bool { return p.shadowedBy == "" }

// contains reports whether one of the pool's ranges holds a: O(log r).
func (p *pool) contains(a netip.Addr) bool {
	i, found := slices.BinarySearchFunc(p.Ranges, a, func(r Range, t netip.Addr) int {
		if c := cmp.Compare(r.BitLen(), t.BitLen()); c != 0 {
			return c
		}
		return r.First.Compare(t)
	})
	if !found {
		i--
	}
	return i >= 0 && p.Ranges[i].Contains(a)
}

// counts reports whether a held a counts as allocated in p.
func (p *pool) counts(a netip.Addr) bool {
	return p.contains(a) && !(p.AvoidBuggyIPs && buggy(a))
}

func (p *pool) hasFamily(f Family) bool {
	for _, r := range p.Ranges {
		if r.Family() == f {
			return true
		}
	}
	return false
}

func (p *pool) admits(s *Service) bool {
	if len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, s.Namespace) {
		return false
	}
	if p.NamespaceSelector != nil && !p.NamespaceSelector.Matches(labels.Set(s.NamespaceLabels)) {
		return false
	}
	if p.ServiceSelector != nil && !p.ServiceSelector.Matches(labels.Set(s.Labels)) {
		return false
	}
	return true
}

type holder struct {
	ip    netip.Addr
	pool  string // the pool the address was given from, or restored with
	key   string // sharing key; "" is not shareable
	local bool
	users map[string][]Port // Service key to its ports
}

type record struct {
	alloc Allocation
	// lingering are addresses the Service gave up that its status still shows.
	lingering []netip.Addr
}

// Allocator holds every pool and every address held by a Service.
type Allocator struct {
	pools    map[string]*pool
	index    *Index
	byIndex  []*pool // the pools in the index's order
	shadowed []*pool // the pools not used because they overlap an older one
	held     map[netip.Addr]*holder
	services map[string]*record
	byKey    map[string]map[netip.Addr]*holder
	// orphans are, per pool name, the held addresses given from (or restored with) a pool
	// that no longer exists or no longer holds them.
	orphans map[string]map[netip.Addr]*holder
}

// New returns an empty allocator.
func New() *Allocator {
	return &Allocator{
		pools:    map[string]*pool{},
		index:    NewIndex(nil),
		held:     map[netip.Addr]*holder{},
		services: map[string]*record{},
		byKey:    map[string]map[netip.Addr]*holder{},
		orphans:  map[string]map[netip.Addr]*holder{},
	}
}

// Index returns the pool index of the last SetPools: which pool holds an address, which
// pools overlap. It is immutable and stays valid after later calls.
func (a *Allocator) Index() *Index { return a.index }

// Get returns a Service's allocation.
func (a *Allocator) Get(key string) (Allocation, bool) {
	r, ok := a.services[key]
	if !ok || len(r.alloc.IPs) == 0 {
		return Allocation{}, false
	}
	return cloneAlloc(r.alloc), true
}

// Holders returns the keys of the Services holding addr, sorted.
func (a *Allocator) Holders(addr netip.Addr) []string {
	h, ok := a.held[addr]
	if !ok {
		return nil
	}
	return sortedUsers(h)
}

// Len is the number of Services holding addresses.
func (a *Allocator) Len() int {
	n := 0
	for _, r := range a.services {
		if len(r.alloc.IPs) > 0 {
			n++
		}
	}
	return n
}

func cloneAlloc(al Allocation) Allocation {
	return Allocation{Pool: al.Pool, IPs: slices.Clone(al.IPs)}
}

func sortedUsers(h *holder) []string {
	out := make([]string, 0, len(h.users))
	for k := range h.users {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// poolOf returns the usable pool whose ranges hold addr.
func (a *Allocator) poolOf(addr netip.Addr) *pool {
	if i := a.index.lookup(addr); i >= 0 {
		return a.byIndex[i]
	}
	return nil
}

// count adds delta to the allocated figure of every pool that counts ip: the usable pool
// holding it (usable, nil when none) and any shadowed pool whose ranges hold it (shadowed
// pools are few, and none in a cluster without overlap).
func (a *Allocator) count(ip netip.Addr, usable *pool, delta int64) {
	if usable != nil && !(usable.AvoidBuggyIPs && buggy(ip)) {
		usable.allocated[FamilyOf(ip)] += delta
	}
	for _, p := range a.shadowed {
		if p.counts(ip) {
			p.allocated[FamilyOf(ip)] += delta
		}
	}
}

// orphaned reports whether h is held outside the pool it came from.
func (a *Allocator) orphaned(h *holder) bool {
	if h.pool == "" {
		return false
	}
	if p := a.poolOf(h.ip); p != nil && p.Name == h.pool {
		return false // the common case, without a second lookup
	}
	p, ok := a.pools[h.pool]
	return !ok || !p.contains(h.ip)
}

func (a *Allocator) trackOrphan(h *holder) {
	if !a.orphaned(h) {
		return
	}
	m := a.orphans[h.pool]
	if m == nil {
		m = map[netip.Addr]*holder{}
		a.orphans[h.pool] = m
	}
	m[h.ip] = h
}

func (a *Allocator) untrackOrphan(h *holder) {
	if m := a.orphans[h.pool]; m != nil {
		delete(m, h.ip)
		if len(m) == 0 {
			delete(a.orphans, h.pool)
		}
	}
}

// BitLen is 32 or 128.
func (r Range) BitLen() int { return r.First.BitLen() }

// wantedFamilies returns the families the Service should get an address of, in order.
func wantedFamilies(s *Service) ([]Family, error) {
	fams := s.Families
	if len(fams) == 0 {
		fams = []Family{IPv4}
	}
	if s.Policy == SingleStack {
		fams = fams[:1]
	}
	if s.Count > 1 && len(s.IPs) > 0 {
		return nil, errorf(ErrRequest, "the Service asks for %d addresses per family and names its addresses; use one or the other", s.Count)
	}
	if s.Count > 1 && s.SharingKey != "" {
		return nil, errorf(ErrRequest, "the Service asks for %d addresses per family and a sharing key; Services with several addresses per family cannot share them", s.Count)
	}
	if len(s.IPs) == 0 {
		return fams, nil
	}
	var out []Family
	for _, ip := range s.IPs {
		f := FamilyOf(ip)
		if !slices.Contains(fams, f) {
			return nil, errorf(ErrRequest, "the Service requests the %s address %s but its ipFamilies allow only %s", f, ip, familyList(fams))
		}
		if slices.Contains(out, f) {
			return nil, errorf(ErrRequest, "the Service requests two %s addresses; request at most one address per family", f)
		}
		out = append(out, f)
	}
	if s.Policy == RequireDualStack && len(out) < 2 {
		return nil, errorf(ErrRequest, "ipFamilyPolicy RequireDualStack needs one requested address per family; %d given", len(out))
	}
	slices.SortStableFunc(out, func(x, y Family) int { return slices.Index(fams, x) - slices.Index(fams, y) })
	return out, nil
}

func familyList(fs []Family) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.String()
	}
	return strings.Join(parts, " and ")
}

func requested(s *Service, f Family) netip.Addr {
	for _, ip := range s.IPs {
		if FamilyOf(ip) == f {
			return ip
		}
	}
	return netip.Addr{}
}

// perFamily is how many addresses of each family s gets.
func perFamily(s *Service) int { return max(s.Count, 1) }

// ofFamily returns the first address of family f in ips that is not in skip.
func ofFamily(ips []netip.Addr, f Family, skip ...netip.Addr) netip.Addr {
	for _, ip := range ips {
		if FamilyOf(ip) == f && !slices.Contains(skip, ip) {
			return ip
		}
	}
	return netip.Addr{}
}

func countFamily(ips []netip.Addr, f Family) int {
	n := 0
	for _, ip := range ips {
		if FamilyOf(ip) == f {
			n++
		}
	}
	return n
}

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
		if err := compatible(h, s); err != nil {
			return err
		}
	}
	return nil
}

// compatible reports why s may not share h's address, or nil.
func compatible(h *holder, s *Service) error {
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
	if h.key == "" || s.SharingKey != h.key {
		e := errorf(ErrInUse, "address %s is held by %s, which does not share it under this Service's sharing key; choose another address or give both Services the same metalvip.io/sharing-key", h.ip, others[0])
		if s.SharingKey == "" {
			e.Msg = fmt.Sprintf("address %s is held by %s; choose another address, or give both Services the same metalvip.io/sharing-key if they should share it", h.ip, others[0])
		}
		e.Holder = others[0]
		return e
	}
	if h.local != s.LocalTraffic {
		e := errorf(ErrSharing, "address %s is shared by %s with externalTrafficPolicy %s; Services sharing an address must have the same externalTrafficPolicy", h.ip, others[0], etp(h.local))
		e.Holder = others[0]
		return e
	}
	for _, o := range others {
		for _, p := range h.users[o] {
			if slices.Contains(s.Ports, p) {
				e := errorf(ErrSharing, "port %s on address %s is already used by %s, which shares it; use another port or another sharing key", p, h.ip, o)
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
		if h := a.held[c]; h == nil || compatible(h, s) == nil {
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
			if err := compatible(h, s); err != nil {
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
			if FamilyOf(ip) != f || !p.contains(ip) || (p.AvoidBuggyIPs && buggy(ip)) || compatible(h, s) != nil {
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
		h.local = s.LocalTraffic
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

// Restore records what a Service holds according to its status, before anything is
// assigned. It refuses an address another Service holds and may not share with it (the
// caller restores Services oldest first, so the older keeps the address).
func (a *Allocator) Restore(s Service, al Allocation) error {
	for _, ip := range al.IPs {
		if h := a.held[ip]; h != nil {
			if err := compatible(h, &s); err != nil {
				return &Error{Kind: ErrConflict, Msg: fmt.Sprintf("address %s in this Service's status is also held by %s: %v", ip, strings.Join(sortedUsers(h), ", "), err), Holder: sortedUsers(h)[0]}
			}
		}
	}
	if al.Pool == "" && len(al.IPs) > 0 {
		if p := a.poolOf(al.IPs[0]); p != nil {
			al.Pool = p.Name
		}
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

// SetPools replaces the set of pools. Held addresses are never taken away, also when their
// pool shrank or went: the report lists them.
func (a *Allocator) SetPools(in []Pool) Report {
	a.index = NewIndex(in)
	a.pools = make(map[string]*pool, len(a.index.pools))
	a.byIndex = make([]*pool, len(a.index.pools))
	a.shadowed = nil
	byName := make(map[string]Pool, len(in))
	for _, p := range in {
		if q, dup := byName[p.Name]; !dup || p.Order < q.Order {
			byName[p.Name] = p
		}
	}
	for i, ip := range a.index.pools {
		p := &pool{Pool: byName[ip.name], shadowedBy: ip.shadowedBy, overlaps: ip.overlaps}
		p.Ranges = ip.ranges
		a.pools[p.Name], a.byIndex[i] = p, p
		if !p.usable() {
			a.shadowed = append(a.shadowed, p)
		}
	}

	// Free sets and figures: each pool's ranges minus the held addresses (and the avoided
	// ones), walking the held addresses in order beside the ranges.
	heldSorted := make([]netip.Addr, 0, len(a.held))
	for ip := range a.held {
		heldSorted = append(heldSorted, ip)
	}
	slices.SortFunc(heldSorted, netip.Addr.Compare)
	for _, p := range a.byIndex {
		p.capacity = map[Family]*big.Int{IPv4: new(big.Int), IPv6: new(big.Int)}
		p.allocated = map[Family]int64{IPv4: 0, IPv6: 0}
		if p.usable() {
			p.free = map[Family]*freeSet{IPv4: newFreeSet(p.AvoidBuggyIPs), IPv6: newFreeSet(false)}
		}
		for _, r := range p.Ranges {
			f := r.Family()
			p.capacity[f].Add(p.capacity[f], usableSize(r, p.AvoidBuggyIPs))
			var fs *freeSet
			if p.usable() {
				fs = p.free[f]
			}
			p.allocated[f] += fillFree(fs, r, heldSorted, p.AvoidBuggyIPs)
		}
	}
	a.orphans = map[string]map[netip.Addr]*holder{}
	for _, h := range a.held {
		if h.pool == "" {
			if p := a.poolOf(h.ip); p != nil {
				h.pool = p.Name
			}
		}
		a.trackOrphan(h)
	}
	return a.report()
}

// usableSize is the number of addresses of r that may be given out.
func usableSize(r Range, avoidBuggy bool) *big.Int {
	n := r.Size()
	if avoidBuggy && r.Family() == IPv4 {
		n.Sub(n, big.NewInt(int64(countBuggy(r))))
	}
	return n
}

func countBuggy(r Range) int {
	f, l := u32(r.First), u32(r.Last)
	// Addresses x in [f, l] with x%256 == 0, then with x%256 == 255.
	zeros := l/256 - f/256
	if f%256 == 0 {
		zeros++
	}
	ones := (l+1)/256 - f/256
	return int(zeros + ones)
}

func u32(a netip.Addr) uint64 {
	b := a.As4()
	return uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
}

// fillFree adds r minus the held addresses to fs (when fs is not nil; fs skips the avoided
// ones itself) and returns how many held addresses of r count as allocated. It costs
// O(k log n) for the k held addresses in r.
func fillFree(fs *freeSet, r Range, held []netip.Addr, avoidBuggy bool) int64 {
	i, _ := slices.BinarySearchFunc(held, r.First, netip.Addr.Compare)
	var allocated int64
	start := r.First
	emit := func(end netip.Addr) {
		if fs != nil {
			fs.add(Range{start, end})
		}
	}
	for ; i < len(held) && r.Contains(held[i]); i++ {
		if !(avoidBuggy && buggy(held[i])) {
			allocated++
		}
		if held[i] != start {
			emit(held[i].Prev())
		}
		start = held[i].Next()
		if !start.IsValid() || held[i] == r.Last {
			return allocated // the last address of r is held: nothing after it
		}
	}
	emit(r.Last)
	return allocated
}

func mergeRanges(rs []Range) []Range {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(x, y Range) int {
		if c := cmp.Compare(x.BitLen(), y.BitLen()); c != 0 {
			return c
		}
		return x.First.Compare(y.First)
	})
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if last.BitLen() == r.BitLen() && (last.Overlaps(r) || last.Last.Next() == r.First) {
				if r.Last.Compare(last.Last) > 0 {
					last.Last = r.Last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	return merged
}

// Report describes the pools after SetPools.
type Report struct {
	// Orphans are addresses held by Services that are no longer in the pool they came from.
	Orphans []Orphan
}

// Orphan is a held address outside the pool it was given from.
type Orphan struct {
	IP          netip.Addr
	Pool        string
	PoolDeleted bool
	Services    []string
}

func (a *Allocator) report() Report {
	var r Report
	for name, m := range a.orphans {
		_, exists := a.pools[name]
		for _, h := range m {
			r.Orphans = append(r.Orphans, Orphan{IP: h.ip, Pool: name, PoolDeleted: !exists, Services: sortedUsers(h)})
		}
	}
	slices.SortFunc(r.Orphans, func(x, y Orphan) int { return x.IP.Compare(y.IP) })
	return r
}

// Orphans returns the addresses held outside the pool they came from.
func (a *Allocator) Orphans() []Orphan { return a.report().Orphans }

// Stats is what a pool's status reports.
type Stats struct {
	Allocated map[Family]int64
	Available map[Family]int64 // saturated at math.MaxInt64
	Usable    bool
	// ShadowedBy names the older pool this one overlaps (then it is not used); Overlaps
	// names every pool it overlaps.
	ShadowedBy string
	Overlaps   []string
	// Orphans are addresses given from this pool, still held, no longer in its ranges.
	Orphans []Orphan
}

// PoolStats computes a pool's figures; it costs O(1), plus O(k log k) for k orphans.
func (a *Allocator) PoolStats(name string) (Stats, bool) {
	p, ok := a.pools[name]
	if !ok {
		return Stats{}, false
	}
	st := Stats{
		Allocated:  map[Family]int64{IPv4: p.allocated[IPv4], IPv6: p.allocated[IPv6]},
		Available:  map[Family]int64{},
		Usable:     p.usable(),
		ShadowedBy: p.shadowedBy,
		Overlaps:   slices.Clone(p.overlaps),
	}
	for ip, h := range a.orphans[name] {
		st.Orphans = append(st.Orphans, Orphan{IP: ip, Pool: name, Services: sortedUsers(h)})
	}
	slices.SortFunc(st.Orphans, func(x, y Orphan) int { return x.IP.Compare(y.IP) })
	for _, f := range []Family{IPv4, IPv6} {
		free := new(big.Int).Sub(p.capacity[f], big.NewInt(st.Allocated[f]))
		if free.Sign() < 0 {
			free.SetInt64(0)
		}
		if free.IsInt64() {
			st.Available[f] = free.Int64()
		} else {
			st.Available[f] = math.MaxInt64
		}
	}
	return st, true
}
