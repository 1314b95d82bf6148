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
package ipam

import (
	"cmp"
	"errors"
	"fmt"
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
	// Selector is, for LocalTraffic, spec.selector in one canonical form (MetalLB's backend
	// key): Services with traffic policy Local join an address only with the same selector, as
	// only nodes running their pods announce it.
	Selector string
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

// Error is an allocation failure: a kind and a message that says why and what to do. Msg
// names every Service involved, for the operator's log; For is the text for the Service's
// owner, which names no Service of another namespace.
type Error struct {
	Kind   error
	Msg    string
	Holder string // the Service holding a contested address, if any

	format string
	args   []any // serviceKey and serviceKeys are rendered by For
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// For is the message as written on a Service in namespace (its Events and conditions): a
// Service of another namespace is not named, so a tenant learns no other tenant's Service
// names from a conflict.
func (e *Error) For(namespace string) string {
	if e.format == "" {
		return e.Msg
	}
	return e.render(func(key string) string { return NameFor(key, namespace) })
}

// unnamed is how a message written on a Service names a Service of another namespace.
const unnamed = "a Service in another namespace"

// NameFor is how a message written on a Service in namespace names the Service key: by its
// key in the same namespace, otherwise without its name.
func NameFor(key, namespace string) string {
	if ns, _, ok := strings.Cut(key, "/"); ok && ns == namespace {
		return key
	}
	return unnamed
}

// serviceKey and serviceKeys are Service keys in an Error's arguments.
type (
	serviceKey  string
	serviceKeys []string
)

func (e *Error) render(name func(string) string) string {
	args := make([]any, len(e.args))
	for i, a := range e.args {
		switch a := a.(type) {
		case serviceKey:
			args[i] = name(string(a))
		case serviceKeys:
			var names []string
			for _, k := range a {
				if n := name(k); !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
			args[i] = strings.Join(names, ", ")
		case *Error:
			if a.format != "" {
				args[i] = a.render(name)
			} else {
				args[i] = a.Msg
			}
		default:
			args[i] = a
		}
	}
	return fmt.Sprintf(e.format, args...)
}

// errorf returns an Error; a Service key among args is a serviceKey or serviceKeys, so that
// For can leave out those of other namespaces.
func errorf(kind error, format string, args ...any) *Error {
	e := &Error{Kind: kind, format: format, args: args}
	e.Msg = e.render(func(key string) string { return key })
	return e
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
	ip       netip.Addr
	pool     string // the pool the address was given from, or restored with
	key      string // sharing key; "" is not shareable
	local    bool
	selector string            // of its Local Services
	users    map[string][]Port // Service key to its ports
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

// governing returns the pool whose rules govern a held address (Index.Governing), nil when no
// valid pool holds it.
func (a *Allocator) governing(h *holder) *pool {
	if name, ok := a.index.Governing(h.pool, h.ip); ok {
		return a.pools[name]
	}
	return nil
}

// orphaned reports whether no valid pool holds h: the pool it came from was deleted or shrank
// and no other holds it.
func (a *Allocator) orphaned(h *holder) bool {
	return h.pool != "" && a.governing(h) == nil
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
